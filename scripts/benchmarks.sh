#!/usr/bin/env bash
# The figures in the README, measured in one run on this machine: ckcheck bench on the
# transformer and convnet fixtures, the checkpoint machinery's own cost per call, and the
# comparison with torch.utils.checkpoint. Writes them to ./benchmarks/ (reports) and prints them.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CKCHECK_BUILD_DIR:-build}
out=benchmarks
mkdir -p "$out"
python=/usr/bin/python3
[[ -x $python ]] || python=python3

echo "== ckcheck bench, transformer (CPU)"
"$build/ckcheck" bench --model transformer --layers 4 --hidden 256 --heads 8 --seq 128 --batch 8 \
  --policies none,every:1,every:2,every:4,sites:*.attn,sites:*.ffn --steps 10 --warmup 2 \
  --report json="$out/transformer.json" --report html="$out/transformer.html" --report markdown="$out/transformer.md"
echo "== ckcheck bench, convnet (CPU)"
"$build/ckcheck" bench --model convnet --layers 4 --channels 32 --size 32 --batch 8 \
  --policies none,every:1,every:2,every:4,segments:sqrt --steps 10 --warmup 2 \
  --report json="$out/convnet.json" --report html="$out/convnet.html" --report markdown="$out/convnet.md"
echo "== the checkpoint machinery per call (Google Benchmark)"
"$build/bench/ckcheck_bench_checkpoint" --benchmark_min_time=0.5 | tee "$out/checkpoint_bench.txt"
echo "== against torch.utils.checkpoint"
if "$python" -c "import torch" 2>/dev/null; then
  "$python" bench/compare_pytorch.py --ckcheck "$build/ckcheck" --pymemory "$build/bench/libckcheck_pymemory.so" \
    --layers 4 --hidden 256 --heads 8 --seq 128 --batch 8 --vocab 64 --steps 10 --warmup 2 | tee "$out/compare_pytorch.md"
else
  echo "skipped: no Python with torch (install python3-torch)"
fi
