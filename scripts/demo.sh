#!/usr/bin/env bash
# Installs what is missing, builds the tools and shows the key derivation on the real
# HLO corpus. (The demo grows into a mounted cache once neffcachefs lands.)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target neffcache >/dev/null
tool=build/tools/neffcache
version=2.21.0  # no Neuron SDK here, so the compiler version is given, not detected
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

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
