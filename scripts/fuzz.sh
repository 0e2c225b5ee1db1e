#!/usr/bin/env bash
# bash scripts/fuzz.sh [--build-only | --no-build] [SECONDS]
#
# Builds the libFuzzer targets with clang and runs each for about SECONDS (default 30) of CPU
# from its seeds and from every input found before: all at once, for SECONDS x targets / cores
# of wall time, so that no core idles while the last one runs alone. A crash, a
# leak or a violated property fails the run; the input is kept in build-fuzz/found/TARGET/
# (copy it to fuzz/found/TARGET/ so that the test suite replays it from then on).
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
run=1
case "${1:-}" in
  --build-only) run=0; shift ;;
  --no-build) build=0; shift ;;
esac
seconds=${1:-30}
jobs=$(nproc)
targets=(hlo neuron_cc_flags compile_flags_json compiler_template s3_answer)

if [ "$build" -eq 1 ]; then
  source scripts/build_env.sh
  cmake -S . -B build-fuzz "${cmake_tools[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DNEFFCACHE_FUZZ=ON -DNEFFCACHE_BUILD_TESTS=OFF -DNEFFCACHE_BUILD_BENCH=OFF >/dev/null
  cmake --build build-fuzz -j"$jobs" --target fuzz
fi
[ "$run" -eq 1 ] || exit 0

# fuzz_one TARGET: runs one target for $wall seconds; its log is build-fuzz/fuzz-TARGET.log.
fuzz_one() {
  local target=$1
  local seeds=fuzz/seeds/$target
  [ "$target" = hlo ] && seeds=tests/corpus
  local work=build-fuzz/corpus/$target  # what the fuzzer learns; kept between runs
  local found=build-fuzz/found/$target
  mkdir -p "$work" "$found"
  local dirs=("$work" "$seeds")
  [ -d "fuzz/found/$target" ] && dirs+=("fuzz/found/$target")
  # Inputs up to 64 KiB: the large corpus graphs are still read, cut to that size.
  if ! "build-fuzz/fuzz/fuzz_$target" -max_total_time="$wall" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$found/" -print_final_stats=1 "${dirs[@]}" >"build-fuzz/fuzz-$target.log" 2>&1; then
    tail -n 40 "build-fuzz/fuzz-$target.log" >&2
    echo "fuzz: $target failed; the input is in $found/" >&2
    return 1
  fi
  echo "$target: $(grep -E '^stat::number_of_executed_units|^Done' "build-fuzz/fuzz-$target.log" | tr '\n' ' ')"
}
export -f fuzz_one
wall=$(((seconds * ${#targets[@]} + jobs - 1) / jobs))
export wall

echo "== fuzz ${targets[*]}, all at once for $wall s (about $seconds s of CPU each on $jobs cores)"
# xargs stops at the first target that fails (exit 255) and exits non-zero.
printf '%s\n' "${targets[@]}" | xargs -P "${#targets[@]}" -I{} bash -c 'fuzz_one {} || exit 255'
