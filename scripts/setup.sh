#!/usr/bin/env bash
# Installs what neffcache needs to build and test on Debian bookworm, as root.
# Idempotent: does nothing (and touches no network) when everything is already there.
set -euo pipefail

# Catch2 v3 exists only in bookworm-backports; everything else is in bookworm itself.
packages=(
  build-essential cmake pkg-config git
  libfuse3-dev fuse3                # the daemon
  libfmt-dev libcli11-dev           # formatting, command lines
  libprotobuf-dev protobuf-compiler # HLO wire decoder; test-only generated classes
  libssl-dev                        # MD5 / SHA-256 (libcrypto)
  libxxhash-dev nlohmann-json3-dev
  libcurl4-openssl-dev libtinyxml2-dev # S3: HTTP, and its XML answers
  ceph-mon ceph-osd radosgw uuid-runtime curl # a real S3 server (radosgw) the tests start on 127.0.0.1
  clang libclang-rt-14-dev          # libFuzzer and the sanitizer runtimes for fuzz targets
  python3                           # generates the committed json.dumps vectors; tests compare against them
  ccache mold                       # the test command's compiler cache and linker (scripts/build_env.sh)
  meson dpkg-dev                    # build libfuse 3.17 from Debian's trixie source package (below)
  python3-filelock python3-psutil   # the libraries LNL itself uses: the independent LNL client of the tests
  rsync                             # one of the walkers the conformance suite runs on a folder and the mount
  libarchive-dev                    # neffcache bundle: tar + zstd (libarchive links libzstd)
  libsystemd-dev                    # sd_notify: neffcachefs tells systemd when it is mounted (Type=notify)
  help2man man-db bsdextrautils     # the man pages, made from each program's --help; the test renders them (man, col)
)
backports=(libcatch2-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
catch2_ok=0
if dpkg-query -W -f='${Version}' libcatch2-dev 2>/dev/null | grep -q '^3\.'; then catch2_ok=1; fi

# libfuse 3.16 or newer has FUSE passthrough (the kernel reads a done NEFF without the daemon).
# Bookworm has 3.14, and trixie's binary packages need trixie's glibc, so trixie's source
# package is built (scripts/libfuse.sh) into a private prefix, as a static library only the
# daemon links: nothing of the system's libfuse is replaced, and the daemon carries no loader
# path to it.
libfuse_prefix=/opt/neffcache/libfuse
libfuse_ok=0
[ -f "$libfuse_prefix/lib/libfuse3.a" ] && [ -f "$libfuse_prefix/lib/pkgconfig/fuse3.pc" ] && libfuse_ok=1

# promtool checks the metrics' text in the tests. It comes from Debian's prometheus package,
# unpacked into a private prefix rather than installed: installing it would start a Prometheus
# server (and a node exporter) on a host that runs systemd.
promtool_prefix=/opt/neffcache/prometheus
promtool_ok=0
[ -x "$promtool_prefix/usr/bin/promtool" ] && promtool_ok=1

if [ ${#missing[@]} -eq 0 ] && [ $catch2_ok -eq 1 ] && [ $libfuse_ok -eq 1 ] && [ $promtool_ok -eq 1 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages (${missing[*]} ${backports[*]}), $libfuse_prefix or $promtool_prefix; run as root to install them" >&2
  exit 1
fi

src=/etc/apt/sources.list.d/bookworm-backports.sources
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
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
if [ $libfuse_ok -eq 0 ]; then
  echo "setup: $(bash "$(dirname "$0")/libfuse.sh" install "$libfuse_prefix")"
fi
if [ $promtool_ok -eq 0 ]; then
  download=$(mktemp -d)
  (cd "$download" && apt-get download -qq prometheus >/dev/null)
  rm -rf "$promtool_prefix" && mkdir -p "$promtool_prefix"
  dpkg-deb -x "$download"/prometheus_*.deb "$promtool_prefix"
  rm -rf "$download"
  echo "setup: unpacked promtool ($("$promtool_prefix/usr/bin/promtool" --version 2>&1 | head -1)) into $promtool_prefix"
fi
