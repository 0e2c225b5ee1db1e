#!/usr/bin/env bash
# Builds the libraries the programs link statically from Debian trixie's source packages, each
# into a private prefix (scripts/setup.sh puts them under /opt/neffcache), as root. Nothing of
# the system's copies is replaced, and nothing from trixie is installed: only its sources are
# fetched (a deb-src line), which apt checks against trixie's signed index, and dpkg-source
# applies Debian's patches.
#   private_libs.sh libfuse PREFIX    libfuse 3.17: FUSE passthrough needs 3.16, bookworm has 3.14,
#                                     and trixie's binary packages need trixie's glibc; with its
#                                     passthrough_hp example, statically linked, in PREFIX/bin
#                                     (bench/run.sh: the limit of a FUSE open)
#   private_libs.sh curl PREFIX       libcurl, HTTP and HTTPS over the system's OpenSSL 3 only:
#                                     Debian's libcurl binds its symbols at a version node
#                                     (CURL_OPENSSL_4) that Fedora-family libcurl lacks, and its
#                                     libcurl.a needs a dozen libraries that have no .a
#   private_libs.sh tinyxml2 PREFIX   tinyxml2: its soname differs between the targets, and
#                                     Debian ships no libtinyxml2.a
#   private_libs.sh --whole PREFIX    exits 0 when PREFIX is whole, as this script makes it now
# Each library is static and position-independent, with its headers and its pkg-config or
# CMake files. docs/INSTALL.md says why each one is built here. What this script made holds the
# marker .neffcache-private, written last: CMake takes a prefix that has it, and setup.sh asks
# --whole, which also wants what this version of the script adds (the copyright file, libfuse's
# example).
set -euo pipefail
format=2  # what the marker says: one more whenever a prefix holds more
what=${1:-} dest=${2:-}
if [ "$what" = --whole ]; then
  [ "$(cat "$dest/.neffcache-private" 2>/dev/null)" = "$format" ]
  exit
fi
case "$what" in libfuse | curl | tinyxml2) ;; *) what="" ;; esac
if [ -z "$what" ] || [ -z "$dest" ]; then
  echo "usage: $0 libfuse|curl|tinyxml2 PREFIX | --whole PREFIX" >&2
  exit 2
fi
dest=$(realpath -m "$dest")

# Source packages only (deb-src): nothing from trixie can be installed through it. With its
# updates and security suites: the programs carry libcurl and tinyxml2, so their fixes matter.
src=/etc/apt/sources.list.d/trixie-src.sources
if ! grep -qs '^Suites: trixie-security' "$src"; then
  cat >"$src" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie trixie-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://security.debian.org/debian-security
Suites: trixie-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
staged=$work/stage$dest  # (what `DESTDIR=$work/stage ninja install` writes)
# fetch_source PACKAGE: the patched sources of PACKAGE in $work/src, of the newest version that
# trixie's suites list (not another release's deb-src lines) and the mirror has: a mirror can list
# a version in its index before its files arrive.
fetch_source() {
  local version
  for version in $(apt-cache madison "$1" | awk -F'|' '$3 ~ / trixie(-updates|-security)?\/main Sources/ {gsub(/ /, "", $2); print $2}' |
                   sort -rV | uniq); do
    if (cd "$work" && apt-get source -qq --download-only -o APT::Sandbox::User=root "$1=$version" >/dev/null 2>&1); then
      (cd "$work" && dpkg-source -x "$1"_*.dsc src >/dev/null 2>&1)
      source_version=$version
      return
    fi
    rm -f "$work/$1"_*
  done
  echo "private_libs.sh: no version of trixie's source package $1 could be fetched" >&2
  exit 1
}
# replace_dest FILE: puts what was staged in place of PREFIX, the marker last. PREFIX is replaced
# only when it is empty or was made here (the marker, or FILE, the library of an earlier build,
# is in it): a PREFIX given by mistake is never wiped.
replace_dest() {
  if [ -n "$(ls -A "$dest" 2>/dev/null)" ] && [ ! -e "$dest/.neffcache-private" ] && [ ! -e "$dest/$1" ]; then
    echo "private_libs.sh: $dest holds files this script did not make: not replacing it" >&2
    exit 1
  fi
  rm -rf "$dest"
  mkdir -p "$(dirname "$dest")"
  mv "$staged" "$dest"
  echo "$format" >"$dest/.neffcache-private"
}
# built NAME PC: says that NAME was built, with the version of its pkg-config file PC.pc.
built() {
  echo "$1 $(sed -n 's/^Version: //p' "$dest/lib/pkgconfig/$2.pc") (Debian's $source_version) built into $dest"
}
# licence PACKAGE: the source package's copyright file (Debian's machine-readable one: holders and
# licence texts) into PREFIX/share/doc/PACKAGE, for the copyright files of our packages.
licence() {
  mkdir -p "$staged/share/doc/$1"
  cp "$work/src/debian/copyright" "$staged/share/doc/$1/copyright"
}
# cmake_install SOURCE_DIR OPTIONS...: a Release build of a CMake project for PREFIX, staged.
cmake_install() {
  local dir=$1
  shift
  cmake -S "$dir" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$dest" \
    -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON "$@" >/dev/null
  ninja -C "$work/build" >/dev/null
  DESTDIR=$work/stage ninja -C "$work/build" install >/dev/null
}

case "$what" in
libfuse)
  fetch_source fuse3
  # (The examples are built, not installed.)
  meson setup "$work/build" "$work/src" --prefix="$dest" --libdir=lib -Ddefault_library=static -Dutils=false \
    -Dtests=false -Dexamples=true -Dbuildtype=release -Db_pie=true >/dev/null
  ninja -C "$work/build" >/dev/null
  DESTDIR=$work/stage ninja -C "$work/build" install >/dev/null
  install -D -m 755 "$work/build/example/passthrough_hp" "$staged/bin/passthrough_hp"
  licence fuse3
  replace_dest lib/libfuse3.a
  built libfuse fuse3
  ;;
curl)
  fetch_source curl
  # HTTP only (S3), TLS by the system's OpenSSL, and no other library: no compression (S3's
  # objects are NEFFs as they are), HTTP/1.1, no IDN or public-suffix list. No CA bundle path of
  # its own: with none, libcurl asks OpenSSL for its default paths, which the target's own
  # libcrypto knows (/etc/ssl/certs on Debian and Ubuntu, /etc/pki/tls on Amazon Linux).
  cmake_install "$work/src" -DHTTP_ONLY=ON -DCURL_USE_OPENSSL=ON -DCURL_ZLIB=OFF -DCURL_BROTLI=OFF \
    -DCURL_ZSTD=OFF -DUSE_NGHTTP2=OFF -DUSE_LIBIDN2=OFF -DCURL_USE_LIBPSL=OFF -DCURL_USE_LIBSSH2=OFF \
    -DCURL_USE_GSSAPI=OFF -DCURL_DISABLE_LDAP=ON -DCURL_CA_BUNDLE=none -DCURL_CA_PATH=none \
    -DCURL_CA_FALLBACK=ON -DBUILD_CURL_EXE=OFF -DBUILD_TESTING=OFF -DBUILD_LIBCURL_DOCS=OFF \
    -DBUILD_MISC_DOCS=OFF -DENABLE_CURL_MANUAL=OFF -DBUILD_EXAMPLES=OFF -DCURL_DISABLE_INSTALL=OFF
  licence curl
  replace_dest lib/libcurl.a
  built libcurl libcurl
  ;;
tinyxml2)
  fetch_source tinyxml2
  cmake_install "$work/src" -Dtinyxml2_BUILD_TESTING=OFF -DBUILD_TESTING=OFF
  licence tinyxml2
  replace_dest lib/libtinyxml2.a
  built tinyxml2 tinyxml2
  ;;
esac
