#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for SECONDS (default 30) from its
# seeds and from every input found before. A crash, a leak or a violated property fails
# the run; the input is kept in build-fuzz/found/TARGET/ (copy it to fuzz/found/TARGET/ so
# that the test suite replays it from then on).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
jobs=$(nproc)

cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEFFCACHE_FUZZ=ON \
  -DNEFFCACHE_BUILD_TESTS=OFF -DNEFFCACHE_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz

for target in hlo neuron_cc_flags compile_flags_json compiler_template s3_answer; do
  seeds=fuzz/seeds/$target
  [ "$target" = hlo ] && seeds=tests/corpus
  work=build-fuzz/corpus/$target  # what the fuzzer learns; kept between runs
  found=build-fuzz/found/$target
  mkdir -p "$work" "$found"
  dirs=("$work" "$seeds")
  [ -d "fuzz/found/$target" ] && dirs+=("fuzz/found/$target")
  echo "== fuzz $target for $seconds s"
  # Inputs up to 64 KiB: the large corpus graphs are still read, cut to that size.
  if ! "build-fuzz/fuzz/fuzz_$target" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$found/" -print_final_stats=1 "${dirs[@]}" >"build-fuzz/fuzz-$target.log" 2>&1; then
    tail -n 40 "build-fuzz/fuzz-$target.log" >&2
    echo "fuzz: $target failed; the input is in $found/" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units|^Done' "build-fuzz/fuzz-$target.log" | tr '\n' ' '
  echo
done
