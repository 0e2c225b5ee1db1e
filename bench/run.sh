#!/usr/bin/env bash
# Builds the benchmarks and runs the whole suite: key derivation (bench_keys), the batch
# makespan (bench_makespan), memory admission in a memory cgroup (bench_memory; root,
# else one row says it was skipped), just-in-time training start with and without the
# compiler shim (bench_jit), then the mount against direct reads of its backing
# directory, and over an S3 cache (bench_mount, with a radosgw started for it on
# 127.0.0.1 and stopped after). Prints the machine,
# the date and the markdown tables that docs/BENCHMARKS.md shows.
# About 20 minutes here, bench_memory about 10 of them (3 repetitions of 4 runs of 40
# compiles and 2 runs of 80 small ones). Arguments are passed to bench_mount (e.g. --reps 3, --only hit, --hit-mib 256).
set -euo pipefail
cd "$(dirname "$0")/.."
# A build folder of its own: scripts/test.sh builds build/ as Release, and switching one folder
# between the two would rebuild everything each time.
source scripts/build_env.sh
cmake -S . -B build-bench "${cmake_tools[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-bench -j"$(nproc)" --target bench_keys bench_makespan bench_memory bench_jit bench_mount >/dev/null
echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/ {print $2}') GiB, Linux $(uname -r), $(df -T /var/tmp | awk 'NR==2 {print $2}') under /var/tmp."
echo
build-bench/bench/bench_keys
echo
build-bench/bench/bench_makespan
echo
build-bench/bench/bench_memory
echo
build-bench/bench/bench_jit
echo
rgw=/var/tmp/neffcache-bench-rgw
bash tests/s3/radosgw.sh start "$rgw" >/dev/null
trap 'bash tests/s3/radosgw.sh stop "$rgw" >/dev/null' EXIT
# libfuse's passthrough_hp, the limit for a small hit through FUSE (once; about 10 s).
# (A private libfuse built before it was there is built again with it.)
hp=/opt/neffcache/libfuse/bin/passthrough_hp
[ -x "$hp" ] || bash scripts/private_libs.sh libfuse "$(dirname "$(dirname "$hp")")" >/dev/null
build-bench/bench/bench_mount --s3-env "$rgw/s3.env" --passthrough-hp "$hp" "$@"
