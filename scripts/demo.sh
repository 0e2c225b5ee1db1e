#!/usr/bin/env bash
# Installs what is missing, builds, and shows neffcache at work: keys of real XLA graphs,
# then a cache mounted over a local folder where a simulated training job writes graphs
# and opens their NEFFs (compile on open, eager compiles, dedup, statistics).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target neffcache neffcachefs fake-neuronx-cc >/dev/null
tool=build/tools/neffcache
version=2.21.0  # no Neuron SDK here, so the compiler version is given, not detected
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
TMPDIR="$tmp/work" NEFFCACHE_FAKE_RATE=4000 NEFFCACHE_FAKE_LOG="$tmp/compiles.log" \
  build/fuse/neffcachefs --foreground -j 2 \
  --compiler "$fake compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags} --verbose=35" \
  "$tmp/backing" "$tmp/mnt" 2>"$tmp/daemon.log" &
daemon=$!
for _ in $(seq 100); do mountpoint -q "$tmp/mnt" && break; sleep 0.05; done
fake_version=$("$fake" --version | head -1 | awk '{print $NF}')

# A training job's first step: it writes each graph and its flags into the cache, as
# torch-xla does, and then opens the NEFF. Writing through the mount starts the compile
# at once (eager), so compiles overlap with the rest of the "trial run".
graphs=(spu_jax_cnn.hlo.pb rocm_normal_9.hlo_proto.pb spu_credit_fraud_metrics_train.hlo.pb rocm08_std_23.hlo_proto.pb)
for g in "${graphs[@]}"; do
  rel=$("$tool" key "tests/corpus/$g" --compiler-version "$fake_version" --flag=-O1)
  mkdir -p "$tmp/mnt/$rel"
  printf '["-O1"]' >"$tmp/mnt/$rel/compile_flags.json"
  cp "tests/corpus/$g" "$tmp/mnt/$rel/model.hlo_module.pb"
  printf '  wrote  %-40s -> %s\n' "$g" "$rel"
done
echo "  (the listing of a pending entry already shows model.neff: $(ls "$tmp/mnt/$rel" | tr '\n' ' '))"

# The same graph under a second name, as a second process with other ids and names
# writes it: one compile serves both.
twin="neuronxcc-$fake_version/MODULE_twin-of-rocm-normal-9+0"
mkdir -p "$tmp/mnt/$twin"
printf '["-O1"]' >"$tmp/mnt/$twin/compile_flags.json"
cp tests/corpus/rocm_normal_9.hlo_proto.pb "$tmp/mnt/$twin/model.hlo_module.pb"

# Now the job needs its NEFFs: four readers per graph, all at once.
start=$(date +%s.%N)
readers=()
for g in "${graphs[@]}"; do
  rel=$("$tool" key "tests/corpus/$g" --compiler-version "$fake_version" --flag=-O1)
  for r in 1 2 3 4; do cat "$tmp/mnt/$rel/model.neff" >"$tmp/work/$g.$r" & readers+=($!); done
done
cat "$tmp/mnt/$twin/model.neff" >"$tmp/work/twin" & readers+=($!)
wait "${readers[@]}"
end=$(date +%s.%N)
printf '  17 readers of 5 entries answered in %s s; each reader got a whole NEFF: ' "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')"
ok=yes
for f in "$tmp"/work/*.hlo*.[1-4] "$tmp/work/twin"; do head -c 12 "$f" | grep -q 'FAKE-NEFF v1' || ok=no; done
echo "$ok"
echo "  compiles run: $(wc -l <"$tmp/compiles.log") (4 distinct graphs; the twin shared one)"
echo
echo "== The daemon's counters (cat MOUNTPOINT/.neffcache/stats.json)"
sed 's/^/  /' "$tmp/mnt/.neffcache/stats.json" | head -30
