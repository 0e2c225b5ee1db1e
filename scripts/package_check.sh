#!/usr/bin/env bash
# Builds the packages (cmake/packaging.cmake: a .deb, an .rpm and a tarball from one build) and
# checks them where it can:
# - the .deb: its name, Depends (only names that hold on Debian 12 and 13 and Ubuntu 22.04 and
#   24.04), contents and conffiles; then, in fresh Debian 12 (bookworm) and 13 (trixie) roots made
#   by debootstrap from Debian's archive, `apt-get install ./neffcache_*.deb` as an operator would,
#   every program's --version, a smoke test (a folder mounted with the stand-in compiler: one
#   compile, one hit, `neffcache stats`), units neither enabled nor started, and a purge that
#   leaves a cache in place;
# - the programs, by tests/packaging/check_elf.py (what they need loads on every target);
# - the .rpm's metadata (Amazon Linux 2023): Requires, files, its config file;
# - the tarball: the .deb's files, and its programs run in the Debian 13 root;
# - that scripts/setup.sh's packages resolve in the Debian 13 root (building from source there).
# Ubuntu's and Amazon's archives are not reachable from here: docs/INSTALL.md says what was run
# and what was only checked for each target.
#   bash scripts/package_check.sh [WORKDIR]     (as root, with Debian's archive reachable)
# Not part of the test command: each fresh root takes a minute or two to make.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/var/tmp/neffcache-package-check}
fail() { echo "package check: FAILED: $*" >&2; exit 1; }
say() { echo "package check: $*"; }
[ "$(id -u)" -eq 0 ] || fail "run as root (debootstrap, chroot, mount)"
bash scripts/setup.sh
for tool in debootstrap rpm; do
  command -v "$tool" >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$tool" >/dev/null
done
mkdir -p "$work"
rm -f "$work"/*.log "$work"/*.json "$work"/*.txt "$work"/*.diff  # (an earlier run's)

# --- the packages, from a build of their own (prefix /usr, no tests) -----------------------
source scripts/build_env.sh
cmake -S . -B build-package -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DNEFFCACHE_BUILD_TESTS=OFF \
  -DNEFFCACHE_PORTABLE=ON >/dev/null
cmake --build build-package -j"$(nproc)" >/dev/null
rm -f build-package/neffcache[_-]*.{deb,rpm,tar.gz}
(cd build-package && cpack >"$work/cpack.log" 2>&1) || fail "cpack (see $work/cpack.log)"
version=$(build-package/tools/neffcache --version | cut -d' ' -f2)
deb=build-package/neffcache_${version}_amd64.deb
rpm=build-package/neffcache-${version}-1.x86_64.rpm
tarball=build-package/neffcache-${version}-Linux-x86_64.tar.gz
for package in "$deb" "$rpm" "$tarball"; do
  [ -f "$package" ] || fail "cpack made no $package: $(ls build-package | grep '^neffcache[_-]' | tr '\n' ' ')"
  say "built $package ($(du -h "$package" | cut -f1))"
done

# --- the .deb --------------------------------------------------------------------------------
# Its Depends come from what the binaries link: only names that every target has (on Debian 13
# and Ubuntu 24.04, libssl3t64 and libarchive13t64 provide the old names on amd64), no library
# the programs carry. It has no maintainer scripts (nothing enabled, started or restarted), and
# its settings file is a conffile.
control=$work/control
rm -rf "$control" && mkdir -p "$control" && dpkg-deb -e "$deb" "$control"
depends=$(sed -n 's/^Depends: //p' "$control/control")
say "Depends: $depends"
for name in $(tr ',|' '\n\n' <<<"$depends" | sed 's/(.*)//; s/ //g'); do
  case "$name" in libc6 | libgcc-s1 | libssl3 | libarchive13 | zlib1g | fuse3) ;; *) fail "Depends names $name" ;; esac
done
for name in libc6 libssl3 fuse3; do grep -qw "$name" <<<"$depends" || fail "Depends lacks $name"; done
grep -q " ;" "$control/control" && fail "the control file has ' ;' (a CMake list joined where one string was meant)"
for script in preinst postinst prerm postrm; do [ ! -e "$control/$script" ] || fail "the .deb has a $script"; done
grep -qx /etc/default/neffcachefs "$control/conffiles" || fail "/etc/default/neffcachefs is not a conffile"
files=(/usr/bin/neffcachefs /usr/bin/neffcache /usr/bin/neffcache-cc /usr/bin/neuron_parallel_compile
       /usr/lib/neffcache/bin/neuronx-cc /usr/libexec/neffcache/fake-neuronx-cc
       /usr/libexec/neffcache/neuron-client-sim /usr/include/neffcache/neffcache.hpp
       /usr/share/man/man8/neffcachefs.8.gz /usr/share/man/man1/neffcache.1.gz
       /usr/share/man/man1/neffcache-cc.1.gz /usr/share/man/man1/neuron_parallel_compile.1.gz
       /usr/lib/systemd/system/neffcachefs.service /usr/lib/systemd/system/neffcachefs-lnl@.service
       /etc/default/neffcachefs /usr/share/doc/neffcache/copyright /usr/share/doc/neffcache/README.md
       /usr/share/doc/neffcache/docs/INSTALL.md /usr/share/neffcache/examples/lnl-vllm.conf
       /usr/share/cmake/neffcache/neffcacheConfig.cmake /usr/share/doc/neffcache/licenses/libcurl
       /usr/share/doc/neffcache/licenses/libfuse /usr/share/doc/neffcache/licenses/libstdc++)
deb_files=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\.||; s|/$||' | sort)
for path in "${files[@]}"; do grep -qx "$path" <<<"$deb_files" || fail "the .deb lacks $path"; done
# The programs, as packaged (stripped), load on every target.
unpacked=$work/unpacked
rm -rf "$unpacked" && dpkg-deb -x "$deb" "$unpacked"
python3 tests/packaging/check_elf.py "$unpacked/usr/bin" "$unpacked/usr/libexec" >"$work/elf.log" ||
  { cat "$work/elf.log"; fail "check_elf.py"; }
say "check_elf.py: every program of the .deb loads on every target"

# --- the .rpm's metadata ----------------------------------------------------------------------
requires=$(rpm -qpR "$rpm" 2>/dev/null)
say "rpm -qpR:"
sed 's/^/    /' <<<"$requires"
grep -qx "fuse3" <<<"$requires" || fail "the rpm does not require fuse3"
grep -q "^libc.so.6(GLIBC_2.34)(64bit)$" <<<"$requires" || fail "the rpm's Requires were not computed from the binaries"
grep -E "libstdc|libcurl|libfmt|libprotobuf|libtinyxml|libsystemd|libfuse|CURL_|GLIBCXX|CXXABI" <<<"$requires" &&
  fail "the rpm requires a library the programs carry"
rpm_files=$(rpm -qpl "$rpm" 2>/dev/null | sort)
for path in "${files[@]}"; do grep -qx "$path" <<<"$rpm_files" || fail "the rpm lacks $path"; done
for owned in /etc /etc/default /usr /usr/bin /usr/lib /usr/lib/systemd /usr/libexec /usr/share/man /usr/share/man/man1 /usr/share/man/man8; do
  grep -qx "$owned" <<<"$rpm_files" && fail "the rpm owns $owned, which the system's packages own"
done
[ "$(rpm -qpc "$rpm" 2>/dev/null)" = /etc/default/neffcachefs ] || fail "rpm -qpc: $(rpm -qpc "$rpm" 2>&1)"
flags=$(rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' "$rpm" 2>/dev/null | sed -n 's| /etc/default/neffcachefs$||p')
[ "$flags" = cn ] || fail "/etc/default/neffcachefs is not %config(noreplace) in the rpm (flags '$flags')"
say "rpm -qpc: /etc/default/neffcachefs (config, noreplace); $(wc -l <<<"$rpm_files") paths, as the .deb's"

# --- the tarball: the same files as the .deb ---------------------------------------------------
tar_files=$(tar -tzf "$tarball" | sed 's|^[^/]*||; s|/$||' | grep . | sort)
diff <(grep -v -x -e /usr -e /etc <<<"$deb_files" | grep .) <(grep -v -x -e /usr -e /etc <<<"$tar_files") >"$work/tar.diff" ||
  fail "the tarball's files differ from the .deb's (see $work/tar.diff)"
say "the tarball holds the .deb's files"

# --- fresh roots ---------------------------------------------------------------------------
root="" daemon=""
# cleanup: stops a daemon left running and takes the root's mounts away (at the end of each root,
# and at exit, however the check ends).
cleanup() {
  if [ -n "$daemon" ]; then kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null; daemon=""; fi
  [ -n "$root" ] || return 0
  umount -l "$root/srv/mnt" 2>/dev/null || true
  for m in dev/fuse sys proc; do umount "$root/$m" 2>/dev/null || true; done
}
trap cleanup EXIT
in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

# smoke PREFIX: mounts a folder in the root with PREFIX's programs and the stand-in compiler; a
# client's trial run writes one graph through the mount, which compiles it, and its training run
# then loads the NEFF without compiling; `neffcache stats` reads the mount.
smoke() {
  local prefix=$1 compiler
  compiler="$prefix/libexec/neffcache/fake-neuronx-cc compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}"
  rm -rf "$root/srv/backing" "$root/srv/mnt" && mkdir -p "$root/srv/backing" "$root/srv/mnt"
  cp tests/corpus/gopjrt_x_squared.hlo.pb "$root/tmp/graph.hlo.pb"
  # (chroot and env exec the daemon: $! is its process.)
  chroot "$root" env PATH=/usr/bin:/bin "$prefix/bin/neffcachefs" --foreground --compiler "$compiler" /srv/backing /srv/mnt \
    2>"$work/daemon.log" &
  daemon=$!
  for _ in $(seq 100); do mountpoint -q "$root/srv/mnt" && break; sleep 0.1; done
  mountpoint -q "$root/srv/mnt" || fail "neffcachefs did not mount in the root (see $work/daemon.log)"
  local run
  for run in extract train; do
    in_root env NEURON_COMPILE_CACHE_URL=/srv/mnt $([ $run = extract ] && echo NEURON_EXTRACT_GRAPHS_ONLY=1) \
      "$prefix/libexec/neffcache/neuron-client-sim" --json --compiler "$compiler" /tmp/graph.hlo.pb \
      >"$work/client-$run.json" 2>"$work/client-$run.log" || fail "the client's $run run (see $work/client-$run.log)"
  done
  grep -q '"compiled": 0,' "$work/client-train.json" || fail "the client compiled the graph itself (see $work/client-train.json)"
  local stats
  stats=$(tee "$work/stats.json" <"$root/srv/mnt/.neffcache/stats.json")
  grep -qE '"succeeded": 1([^0-9]|$)' <<<"$stats" || fail "the mount compiled other than once (see $work/stats.json)"
  in_root "$prefix/bin/neffcache" stats --cache /srv/mnt >"$work/stats.txt" 2>&1 || fail "neffcache stats (see $work/stats.txt)"
  kill -TERM "$daemon" && wait "$daemon" || { daemon=""; fail "neffcachefs did not stop cleanly on SIGTERM (see $work/daemon.log)"; }
  daemon=""
  mountpoint -q "$root/srv/mnt" && fail "the mount is still there after neffcachefs stopped"
  say "  smoke test ($prefix): the mount compiled the graph once, the client loaded it; neffcache stats: $(grep '^entries' "$work/stats.txt" | tr -s ' ')"
}

for suite in bookworm trixie; do
  root=$work/$suite
  cleanup
  rm -rf --one-file-system "$root"
  say "debootstrap $suite into $root"
  debootstrap --variant=minbase "$suite" "$root" http://deb.debian.org/debian >"$work/debootstrap-$suite.log" 2>&1 ||
    fail "debootstrap $suite (see $work/debootstrap-$suite.log)"
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  touch "$root/dev/fuse" && mount --bind /dev/fuse "$root/dev/fuse"
  cp "$deb" "$root/tmp/"
  in_root apt-get update -qq
  in_root apt-get install -y -qq "/tmp/$(basename "$deb")" >"$work/install-$suite.log" 2>&1 ||
    fail "apt-get install ./$(basename "$deb") in $suite (see $work/install-$suite.log)"
  say "  installed with apt-get install ./$(basename "$deb")"
  for program in neffcachefs neffcache neuron_parallel_compile /usr/libexec/neffcache/neuron-client-sim; do
    out=$(in_root "$program" --version) || fail "$program --version"
    grep -qF "$version" <<<"$out" || fail "$program --version does not say $version"
  done
  in_root neffcachefs --version | grep -q '^libfuse 3\.17' || fail "neffcachefs --version does not name libfuse 3.17"
  in_root /usr/libexec/neffcache/fake-neuronx-cc --version >/dev/null || fail "fake-neuronx-cc --version"
  out=$(in_root neffcache-cc --neffcache-version) || fail "neffcache-cc --neffcache-version"
  grep -qF "$version" <<<"$out" || fail "neffcache-cc --neffcache-version does not say $version"
  # The shim in front of the stand-in compiler, as a user's PATH would have it.
  out=$(in_root env PATH=/usr/lib/neffcache/bin:/usr/bin:/bin NEFFCACHE_REAL_COMPILER=/usr/libexec/neffcache/fake-neuronx-cc neuronx-cc --version | head -1)
  [ "$out" = "$(in_root /usr/libexec/neffcache/fake-neuronx-cc --version | head -1)" ] || fail "neuronx-cc through the shim says '$out'"
  say "  every program answers --version with $version"
  for unit in neffcachefs.service neffcachefs-lnl@.service; do
    [ -e "$root/etc/systemd/system/multi-user.target.wants/${unit/@/@x}" ] && fail "$unit is enabled"
  done
  smoke /usr
  if [ "$suite" = trixie ]; then
    # The tarball's programs, unpacked elsewhere, where the .deb put their libraries' packages.
    rm -rf "$root/opt/neffcache" && mkdir -p "$root/opt/neffcache"
    tar -xzf "$tarball" -C "$root/opt/neffcache" --strip-components=1
    smoke /opt/neffcache/usr
    # Building from source: setup.sh's packages for trixie resolve.
    cp scripts/setup.sh "$root/tmp/setup.sh"
    in_root bash /tmp/setup.sh --simulate >"$work/setup-$suite.log" 2>&1 || fail "setup.sh --simulate in $suite (see $work/setup-$suite.log)"
    say "  $(tail -1 "$work/setup-$suite.log")"
  fi
  # A purge takes the settings and never a cache.
  mkdir -p "$root/var/cache/neffcache/neuronxcc-2.21.0/MODULE_1+0"
  echo neff >"$root/var/cache/neffcache/neuronxcc-2.21.0/MODULE_1+0/model.neff"
  in_root apt-get purge -y -qq neffcache >"$work/purge-$suite.log" 2>&1 || fail "apt-get purge (see $work/purge-$suite.log)"
  [ -f "$root/var/cache/neffcache/neuronxcc-2.21.0/MODULE_1+0/model.neff" ] || fail "the purge removed a cache"
  [ ! -e "$root/etc/default/neffcachefs" ] || fail "the purge left /etc/default/neffcachefs"
  [ ! -e "$root/usr/bin/neffcachefs" ] || fail "the purge left /usr/bin/neffcachefs"
  say "  purged; the cache in /var/cache/neffcache is still there"
  cleanup
done

# The units, by this host's systemd (the minimal roots have none; its complaints that the units'
# programs and man page are not on this host are expected).
if command -v systemd-analyze >/dev/null; then
  units=$work/units && rm -rf "$units" && mkdir -p "$units"
  cp "$unpacked/usr/lib/systemd/system/neffcachefs.service" "$units/"
  cp "$unpacked/usr/lib/systemd/system/neffcachefs-lnl@.service" "$units/neffcachefs-lnl@check.service"
  systemd-analyze verify "$units/neffcachefs.service" "$units/neffcachefs-lnl@check.service" >"$work/verify.log" 2>&1 || true
  grep -v -e "is not executable" -e "man neffcachefs" -e "^$" "$work/verify.log" | grep . &&
    fail "systemd-analyze verify (see $work/verify.log)"
  say "systemd-analyze verify accepts both units"
fi
say "passed"
