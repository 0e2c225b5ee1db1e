#!/usr/bin/env bash
# Builds the Debian package (cmake/packaging.cmake) and installs it into a fresh Debian
# bookworm root made by debootstrap from Debian's archive, as an operator's apt-get would:
# every program answers --version there, the man pages and units are where systemd and man
# look, nothing is enabled or started, and a purge leaves a cache in place.
#   bash scripts/package_check.sh [WORKDIR]     (as root, with Debian's archive reachable)
# Not part of the test command: the fresh root alone takes minutes to make.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/var/tmp/neffcache-package-check}
root=$work/root
fail() { echo "package check: FAILED: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "run as root (debootstrap, chroot)"
bash scripts/setup.sh
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null

# The package, from a build of its own (prefix /usr, no tests).
source scripts/build_env.sh
cmake -S . -B build-package -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DNEFFCACHE_BUILD_TESTS=OFF >/dev/null
cmake --build build-package -j"$(nproc)" >/dev/null
rm -f build-package/neffcache_*.deb
(cd build-package && cpack -G DEB >/dev/null)
deb=$(ls build-package/neffcache_*_amd64.deb)
echo "package check: built $deb ($(du -h "$deb" | cut -f1))"

# The package itself: its name carries the build's version, its Depends come from what the
# binaries link, it has no maintainer scripts (nothing enabled, started or restarted), and its
# settings file is a conffile.
version=$(build-package/tools/neffcache --version | cut -d' ' -f2)
[ "$(basename "$deb")" = "neffcache_${version}_amd64.deb" ] || fail "$deb is not named for version $version"
control=$work/control
rm -rf "$control" && mkdir -p "$control" && dpkg-deb -e "$deb" "$control"
depends=$(sed -n 's/^Depends: //p' "$control/control")
echo "package check: Depends: $depends"
for lib in libc6 libstdc++6 libcurl4 libprotobuf32 libfmt9 fuse3; do
  grep -q "$lib" <<<"$depends" || fail "Depends lacks $lib"
done
grep -q "libfuse3" <<<"$depends" && fail "Depends names libfuse3, which neffcachefs links statically"
grep -q " ;" "$control/control" && fail "the control file has ' ;' (a CMake list joined where one string was meant)"
for script in preinst postinst prerm postrm; do [ ! -e "$control/$script" ] || fail "the package has a $script"; done
grep -qx /etc/default/neffcachefs "$control/conffiles" || fail "/etc/default/neffcachefs is not a conffile"
contents=$(dpkg-deb -c "$deb")
for path in ./usr/bin/neffcachefs ./usr/bin/neffcache ./usr/bin/neffcache-cc ./usr/bin/neuron_parallel_compile \
            ./usr/lib/neffcache/bin/neuronx-cc ./usr/libexec/neffcache/fake-neuronx-cc \
            ./usr/libexec/neffcache/neuron-client-sim ./usr/include/neffcache/neffcache.hpp \
            ./usr/share/man/man8/neffcachefs.8.gz ./usr/share/man/man1/neffcache.1.gz \
            ./usr/share/man/man1/neffcache-cc.1.gz ./usr/share/man/man1/neuron_parallel_compile.1.gz \
            ./usr/lib/systemd/system/neffcachefs.service ./usr/lib/systemd/system/neffcachefs-lnl@.service \
            ./etc/default/neffcachefs ./usr/share/doc/neffcache/copyright ./usr/share/doc/neffcache/README.md \
            ./usr/share/doc/neffcache/docs/INSTALL.md ./usr/share/neffcache/examples/lnl-vllm.conf; do
  grep -q " $path\( \|$\)" <<<"$contents" || fail "the package lacks $path"
done
grep -q "cmake/neffcache/neffcacheConfig.cmake" <<<"$contents" || fail "the package lacks the CMake package"

# A fresh bookworm root.
cleanup() { umount "$root/proc" 2>/dev/null || true; }
trap cleanup EXIT
rm -rf "$root"
echo "package check: debootstrap bookworm into $root"
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
  fail "debootstrap (see $work/debootstrap.log)"
mount -t proc proc "$root/proc"
cp "$deb" "$root/tmp/"
in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
in_root apt-get update -qq
in_root apt-get install -y -qq "/tmp/$(basename "$deb")" >"$work/install.log" 2>&1 || fail "apt-get install (see $work/install.log)"
echo "package check: installed with apt-get install ./$(basename "$deb")"
for program in neffcachefs neffcache neuron_parallel_compile /usr/libexec/neffcache/neuron-client-sim; do
  out=$(in_root "$program" --version) || fail "$program --version"
  echo "  $program --version: $(head -1 <<<"$out")"
  grep -qF "$version" <<<"$out" || fail "$program --version does not say $version"
done
in_root neffcachefs --version | grep -q '^libfuse 3\.17' || fail "neffcachefs --version does not name libfuse 3.17"
out=$(in_root /usr/libexec/neffcache/fake-neuronx-cc --version) || fail "fake-neuronx-cc --version"
echo "  fake-neuronx-cc --version: $(head -1 <<<"$out")"
out=$(in_root neffcache-cc --neffcache-version) || fail "neffcache-cc --neffcache-version"
echo "  neffcache-cc --neffcache-version: $(head -1 <<<"$out")"
grep -qF "$version" <<<"$out" || fail "neffcache-cc --neffcache-version does not say $version"
# The shim in front of the stand-in compiler, as a user's PATH would have it.
out=$(in_root env PATH=/usr/lib/neffcache/bin:/usr/bin:/bin NEFFCACHE_REAL_COMPILER=/usr/libexec/neffcache/fake-neuronx-cc neuronx-cc --version | head -1)
[ "$out" = "$(in_root /usr/libexec/neffcache/fake-neuronx-cc --version | head -1)" ] || fail "neuronx-cc through the shim says '$out'"
# Units: valid for systemd, not enabled.
for unit in neffcachefs.service neffcachefs-lnl@.service; do
  [ -e "$root/etc/systemd/system/multi-user.target.wants/${unit/@/@x}" ] && fail "$unit is enabled"
done
# (By this host's systemd: the minimal root has none. Its complaints that the units' programs
# and man page are not on this host are expected.)
if command -v systemd-analyze >/dev/null; then
  units=$work/units && rm -rf "$units" && mkdir -p "$units"
  cp "$root/usr/lib/systemd/system/neffcachefs.service" "$units/"
  cp "$root/usr/lib/systemd/system/neffcachefs-lnl@.service" "$units/neffcachefs-lnl@check.service"
  systemd-analyze verify "$units/neffcachefs.service" "$units/neffcachefs-lnl@check.service" >"$work/verify.log" 2>&1 || true
  grep -v -e "is not executable" -e "man neffcachefs" -e "^$" "$work/verify.log" | grep . &&
    fail "systemd-analyze verify (see $work/verify.log)"
  echo "package check: systemd-analyze verify accepts both units"
fi

# A purge takes the settings and never a cache.
mkdir -p "$root/var/cache/neffcache/neuronxcc-2.21.0/MODULE_1+0"
echo neff >"$root/var/cache/neffcache/neuronxcc-2.21.0/MODULE_1+0/model.neff"
in_root apt-get purge -y -qq neffcache >"$work/purge.log" 2>&1 || fail "apt-get purge (see $work/purge.log)"
[ -f "$root/var/cache/neffcache/neuronxcc-2.21.0/MODULE_1+0/model.neff" ] || fail "the purge removed a cache"
[ ! -e "$root/etc/default/neffcachefs" ] || fail "the purge left /etc/default/neffcachefs"
[ ! -e "$root/usr/bin/neffcachefs" ] || fail "the purge left /usr/bin/neffcachefs"
echo "package check: purged; the cache in /var/cache/neffcache is still there"
echo "package check: passed"
