#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: in a normal build, under
# AddressSanitizer + UndefinedBehaviorSanitizer, and the concurrency tests under
# ThreadSanitizer; then each fuzz target for a bounded time. Exit status: 0 only if all
# pass.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/setup.sh

# Release is what packagers and most users build, and -O3 inlines deepest, where GCC's
# warnings (-Werror) find the most; the sanitizer stages below build Debug.
echo "== build (Release) and test"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== build with TSan and run the concurrency tests (locks, compile jobs, scheduler, the daemon, S3)"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DNEFFCACHE_TSAN=ON -DNEFFCACHE_BUILD_BENCH=OFF >/dev/null
cmake --build build-tsan -j"$jobs" --target neffcache_tests neffcache_s3_tests lock_helper fake-neuronx-cc neffcache \
  neuron_parallel_compile neuron-client-sim neffcachefs fuse_reader neffcache-cc
# Catch2's tag filter selects them (the Catch2 in bookworm-backports cannot turn tags into ctest labels).
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions="$PWD/../tests/support/tsan.supp" \
   ./tests/neffcache_tests '[lock],[compile],[scheduler],[index],[fuse]~[load]')
# The S3 tests (leases raced by threads, compiles by processes) need ctest's radosgw fixture.
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions="$PWD/../tests/support/tsan.supp" \
   ctest --output-on-failure -L s3)

echo "== build with ASan + UBSan and test"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DNEFFCACHE_SANITIZE=ON -DNEFFCACHE_BUILD_BENCH=OFF >/dev/null
# Everything that runs; not the headers compiled one by one (header_self_contained), which
# is a compile check the Release stage made already and has nothing to run.
cmake --build build-asan -j"$jobs" --target neffcache_tests neffcache_s3_tests lock_helper fuse_reader fake-neuronx-cc \
  neffcache neuron_parallel_compile neuron-client-sim neffcachefs neffcache-cc
# install_consumer builds a plain (uninstrumented) program from the installed package:
# it tests packaging, which the first run already covered. The two largest load tests (1,000
# instrumented reader processes; 10,000 entries, 90 s instrumented) run in the first stage
# only; so they do under TSan.
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" -E '^install_consumer$|^1000 readers|^a burst of 10000')

echo "== fuzz each parser of untrusted input for ${NEFFCACHE_FUZZ_SECONDS:-30} s"
bash scripts/fuzz.sh "${NEFFCACHE_FUZZ_SECONDS:-30}"
