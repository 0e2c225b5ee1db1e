#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: once in a normal build and
# once under AddressSanitizer + UndefinedBehaviorSanitizer. Exit status: 0 only if all pass.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/setup.sh

echo "== build (RelWithDebInfo) and test"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== build with ASan + UBSan and test"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DNEFFCACHE_SANITIZE=ON -DNEFFCACHE_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs"
# install_consumer builds a plain (uninstrumented) program from the installed package:
# it tests packaging, which the first run already covered.
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" -E '^install_consumer$')
