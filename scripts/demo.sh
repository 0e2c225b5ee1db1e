#!/usr/bin/env bash
# Installs what is missing, builds, and shows neffcache at work: keys of real XLA graphs,
# then a cache mounted over a local folder: neuron-client-sim, a stand-in for torch-xla,
# extracts graphs as a neuron_parallel_compile trial run does, then trains as 4 ranks
# (eager compiles, compile on open, dedup, time waited, statistics).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target neffcache neffcachefs fake-neuronx-cc neuron-client-sim >/dev/null
tool=build/tools/neffcache
version=2.21.0  # no Neuron SDK here, so the compiler version is given, not detected
# The stand-in compiler reports it too: only a compiler of that version compiles the entries
# of neuronxcc-$version.
export NEFFCACHE_FAKE_VERSION=$version
tmp=$(mktemp -d)
cleanup() {
  fusermount3 -u -z "$tmp/mnt" 2>/dev/null || true
  [ -n "${daemon:-}" ] && wait "$daemon" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== Cache entries of 25 real XLA graphs, flags --target=trn1, compiler $version"
for f in tests/corpus/*.pb; do
  printf '  %-42s %s\n' "$(basename "$f")" "$("$tool" key "$f" --compiler-version "$version" --flag=--target=trn1)"
done

echo
echo "== One JAX model serialized by JAX 0.4 and by JAX 0.8"
echo "   Raw files: every id, name and source position differs. After canonicalization:"
a=tests/corpus/rocm_forward_3d_conv_15.hlo_proto.pb
b=tests/corpus/rocm08_forward_3d_conv_15.hlo_proto.pb
"$tool" key "$a" --compiler-version "$version" --explain "$tmp/a.txt" >/dev/null
"$tool" key "$b" --compiler-version "$version" --explain "$tmp/b.txt" >/dev/null
echo "   $(wc -l <"$tmp/a.txt") canonical lines each; the lines that still differ:"
diff "$tmp/a.txt" "$tmp/b.txt" | grep '^[<>]' | cut -c1-150 | sed 's/^/   /' || true
echo "   (a changed backend_config and a fingerprint attribute: real differences, so the keys differ)"

echo
echo "== What the largest graph is made of"
"$tool" hlo-stats tests/corpus/spu_jax_cnn.hlo.pb | head -16 | sed 's/^/  /'

echo
echo "== Flags hashes, as the Neuron cache computes them"
printf '  %-52s %s\n' "[] (JSON form)" "$("$tool" flags-hash)"
printf '  %-52s %s\n' "\"\" (legacy form)" "$("$tool" flags-hash --legacy)"
printf '  %-52s %s\n' '["--target=trn1"]' "$("$tool" flags-hash -- --target=trn1)"
printf '  %-52s %s\n' '["--target=trn1"] plus cache-wrapper options' \
  "$("$tool" flags-hash -- --target=trn1 --cache_dir=/tmp/x --retry_failed_compilation)"
printf '  %-52s %s\n' "--model-type=transformer (legacy form)" "$("$tool" flags-hash --legacy -- --model-type=transformer)"

echo
echo "== A cache mounted with neffcachefs (compiler: fake-neuronx-cc, a stand-in; 2 compiles at once)"
mkdir -p "$tmp/backing" "$tmp/mnt" "$tmp/work"
fake="$(pwd)/build/tools/fake-neuronx-cc"
compiler="$fake compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags} --verbose=35"
# 0.5 ms per instruction (the largest graph: 3.3 s); neuronx-cc takes minutes to an hour.
export NEFFCACHE_FAKE_RATE=2000
TMPDIR="$tmp/work" NEFFCACHE_FAKE_LOG="$tmp/compiles.log" \
  build/fuse/neffcachefs --foreground -j 2 --compiler "$compiler" \
  "$tmp/backing" "$tmp/mnt" 2>"$tmp/daemon.log" &
daemon=$!
for _ in $(seq 100); do mountpoint -q "$tmp/mnt" && break; sleep 0.05; done

# neuron-client-sim stands in for torch-xla: it writes graphs into the cache and loads
# their NEFFs as libneuronxla does (see docs/DIALECTS.md).
sim() { NEURON_COMPILE_CACHE_URL="$tmp/mnt" NEURON_CC_FLAGS="-O1" NEFFCACHE_FAKE_LOG="$tmp/client-compiles.log" \
  build/tools/neuron-client-sim --compiler "$compiler" "$@"; }
graphs=(spu_jax_cnn.hlo.pb spu_credit_fraud_metrics_train.hlo.pb rocm_normal_9.hlo_proto.pb
        rocm08_std_23.hlo_proto.pb rocm_forward_3d_conv_15.hlo_proto.pb gopjrt_tuple.hlo.pb)
paths=("${graphs[@]/#/tests/corpus/}")

echo "-- A trial run (NEURON_EXTRACT_GRAPHS_ONLY=1) writes ${#graphs[@]} graphs, 0.1 s apart."
echo "   Each HLO written through the mount starts its compile at once (eager):"
NEURON_EXTRACT_GRAPHS_ONLY=1 sim --extract-interval 0.1 "${paths[@]}" 2>"$tmp/extract.log" | sed 's/^/   /'
sed -n 1p "$tmp/extract.log" | sed "s|$tmp/mnt|MOUNT|" | cut -c1-150 | sed 's/^/   /'
counter() { grep -o "\"$1\": [0-9]*" "$tmp/mnt/.neffcache/stats.json" | awk '{print $2}'; }
echo "   when the trial run ends: $(counter succeeded) compiles finished, $(counter running) running, $(counter queued) queued"
echo "   an entry being compiled already lists its NEFF: $(ls "$(dirname "$(grep -o '(/[^)]*)' "$tmp/extract.log" | head -1 | tr -d '()')")" | tr '\n' ' ')"

echo
echo "-- Training at once, 4 ranks: each opens every NEFF. To the client every open is a hit;"
echo "   an open of a NEFF still compiling returns when its compile ends."
start=$(date +%s.%N)
for rank in 1 2 3 4; do sim --steps 3 "${paths[@]}" >"$tmp/rank$rank.out" 2>"$tmp/rank$rank.log" & done
wait $(jobs -p | grep -v "^$daemon\$")
end=$(date +%s.%N)
for rank in 1 2 3 4; do echo "   rank $rank: $(cat "$tmp/rank$rank.out")"; done
echo "   wall time of the training start: $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }') s"
echo "   compiles by the daemon: $(wc -l <"$tmp/compiles.log") for ${#graphs[@]} graphs and 4 ranks;" \
     "by the clients: $(cat "$tmp/client-compiles.log" 2>/dev/null | wc -l)"
echo "   time the ranks waited on the cache in all: $(grep -ho '[0-9.]* s waiting' "$tmp"/rank*.out | awk '{ s += $1 } END { printf "%.2f", s }') s"

echo
echo "-- A second training run: every graph is a hit."
sim "${paths[@]}" 2>/dev/null | sed 's/^/   /'

echo
echo "-- vLLM Neuron (the LNL cache: one folder per key) on the same mount, 3 ranks starting cold."
echo "   The rank that takes a key's lock compiles it inside the entry, the others wait for its marker;"
echo "   the daemon stays out of a rank's way:"
mkdir -p "$tmp/vllm/neuron"
ln -s "$tmp/mnt" "$tmp/vllm/neuron/compile_cache"
before=$(wc -l <"$tmp/compiles.log")
lnl_paths=(tests/corpus/spu_tf_jit_comp.hlo.pb tests/corpus/rocm08_normal_9.hlo_proto.pb)
lnl_ranks=()
for rank in 1 2 3; do
  VLLM_CACHE_ROOT="$tmp/vllm" NEFFCACHE_FAKE_LOG="$tmp/compiles.log" \
    build/tools/neuron-client-sim --dialect lnl --compiler "$compiler" "${lnl_paths[@]}" >"$tmp/lnl$rank.out" 2>/dev/null &
  lnl_ranks+=($!)
done
wait "${lnl_ranks[@]}"
sed 's/^/   /' "$tmp/lnl1.out"
echo "   compiles for ${#lnl_paths[@]} graphs and 3 ranks: $(( $(wc -l <"$tmp/compiles.log") - before ))"
key=$(find "$tmp/backing" -maxdepth 1 -regextype egrep -regex '.*/[0-9a-f]{32}' -printf '%f\n' | head -1)
echo "   one key's folder: $(ls -A "$tmp/mnt/$key" | tr '\n' ' ')"
echo "   its marker: $(tr '\n' ' ' <"$tmp/mnt/$key/.compilation_complete")"

echo
echo "-- What the cache holds (neffcache stats on the mount)"
"$tool" stats --cache "$tmp/mnt" | sed 's/^/   /'
echo
echo "== The daemon's counters (cat MOUNTPOINT/.neffcache/stats.json)"
sed 's/^/  /' "$tmp/mnt/.neffcache/stats.json" | head -30
