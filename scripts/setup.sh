#!/usr/bin/env bash
# Installs what neffcache needs to build and test on Debian 12 (bookworm) or 13 (trixie), as root.
# Idempotent: does nothing (and touches no network) when everything is already there.
#   bash scripts/setup.sh [--simulate]
# --simulate only asks apt whether the packages of this release resolve (apt-get install
# --simulate), installing nothing: scripts/package_check.sh runs it in a fresh Debian 13 root.
set -euo pipefail
simulate=0
case "${1:-}" in
  "") ;;
  --simulate) simulate=1 ;;
  *) echo "usage: bash scripts/setup.sh [--simulate]" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake pkg-config git ninja-build
  libfuse3-dev fuse3                # the daemon
  libfmt-dev libcli11-dev           # formatting, command lines
  libprotobuf-dev protobuf-compiler # HLO wire decoder; test-only generated classes
  libssl-dev                        # MD5 / SHA-256 (libcrypto)
  libxxhash-dev nlohmann-json3-dev
  libcurl4-openssl-dev libtinyxml2-dev # S3: HTTP, and its XML answers
  ceph-mon ceph-osd radosgw uuid-runtime curl # a real S3 server (radosgw) the tests start on 127.0.0.1
  clang                             # libFuzzer and the sanitizer runtimes for fuzz targets (below)
  python3                           # generates the committed json.dumps vectors; tests compare against them
  ccache mold                       # the test command's compiler cache and linker (scripts/build_env.sh)
  meson dpkg-dev                    # build libfuse 3.17 from Debian's trixie source package (below)
  python3-filelock python3-psutil   # the libraries LNL itself uses: the independent LNL client of the tests
  rsync                             # one of the walkers the conformance suite runs on a folder and the mount
  libarchive-dev                    # neffcache bundle: tar + zstd (libarchive links libzstd)
  libsystemd-dev                    # sd_notify's header: neffcachefs tells systemd when it is mounted (Type=notify)
  help2man man-db bsdextrautils     # the man pages, made from each program's --help; the test renders them (man, col)
)
# What differs between the releases: clang's runtimes are versioned (14 in bookworm, 19 in
# trixie), and Catch2 v3 is in trixie itself but only in bookworm-backports.
source /etc/os-release
backports=()
case "${VERSION_CODENAME:-}" in
  bookworm) packages+=(libclang-rt-14-dev); backports=(libcatch2-dev) ;;
  trixie) packages+=(libclang-rt-19-dev libcatch2-dev) ;;
  *) # (Another system: bookworm's names, which it may or may not have.)
    echo "setup: warning: made for Debian 12 (bookworm) and 13 (trixie); this is ${PRETTY_NAME:-unknown}" >&2
    packages+=(libclang-rt-14-dev); backports=(libcatch2-dev) ;;
esac

if [ $simulate -eq 1 ]; then
  apt-get install --simulate -qq --no-install-recommends "${packages[@]}" "${backports[@]}" >/dev/null
  echo "setup: the ${#packages[@]} packages of ${VERSION_CODENAME} resolve (apt-get install --simulate)"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
catch2_ok=1
if [ ${#backports[@]} -gt 0 ] && ! dpkg-query -W -f='${Version}' libcatch2-dev 2>/dev/null | grep -q '^3\.'; then catch2_ok=0; fi

# Built from Debian trixie's source packages by scripts/private_libs.sh, each a static library
# in a private prefix: nothing of the system's copies is replaced.
# - libfuse 3.17: 3.16 or newer has FUSE passthrough (the kernel reads a done NEFF without the
#   daemon). Bookworm has 3.14, and trixie's binary packages need trixie's glibc. Only the daemon
#   links it, and it carries no loader path to it.
# - libcurl (HTTP and HTTPS over OpenSSL only) and tinyxml2: the programs link them in, so that
#   one build runs on every target of the packages (cmake/dependencies.cmake).
# (private_libs.sh says which prefixes are whole; CMake takes any that holds its marker.)
private_missing=()
for name in libfuse curl tinyxml2; do
  bash "$(dirname "$0")/private_libs.sh" --whole "/opt/neffcache/$name" || private_missing+=("$name")
done

# promtool checks the metrics' text in the tests. It comes from Debian's prometheus package,
# unpacked into a private prefix rather than installed: installing it would start a Prometheus
# server (and a node exporter) on a host that runs systemd.
promtool_prefix=/opt/neffcache/prometheus
promtool_ok=0
[ -x "$promtool_prefix/usr/bin/promtool" ] && promtool_ok=1

if [ ${#missing[@]} -eq 0 ] && [ $catch2_ok -eq 1 ] && [ ${#private_missing[@]} -eq 0 ] && [ $promtool_ok -eq 1 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages (${missing[*]} ${backports[*]}), private libraries (${private_missing[*]}) or $promtool_prefix; run as root to install them" >&2
  exit 1
fi

src=/etc/apt/sources.list.d/bookworm-backports.sources
if [ ${#backports[@]} -gt 0 ] && ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  cat >"$src" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [ $catch2_ok -eq 0 ]; then
  apt-get install -y -qq --no-install-recommends -t bookworm-backports "${backports[@]}" >/dev/null
fi
if [ ${#missing[@]} -gt 0 ] || [ $catch2_ok -eq 0 ]; then
  echo "setup: installed ${missing[*]} ${backports[*]}"
fi
for name in "${private_missing[@]}"; do
  echo "setup: $(bash "$(dirname "$0")/private_libs.sh" "$name" "/opt/neffcache/$name")"
done
if [ $promtool_ok -eq 0 ]; then
  download=$(mktemp -d)
  (cd "$download" && apt-get download -qq prometheus >/dev/null)
  rm -rf "$promtool_prefix" && mkdir -p "$promtool_prefix"
  dpkg-deb -x "$download"/prometheus_*.deb "$promtool_prefix"
  rm -rf "$download"
  echo "setup: unpacked promtool ($("$promtool_prefix/usr/bin/promtool" --version 2>&1 | head -1)) into $promtool_prefix"
fi
