#!/usr/bin/env bash
# The figures in docs/bench.md (and the README's summary), measured in one run on this machine: ckcheck bench on the
# transformer and convnet fixtures, the checkpoint machinery's own cost per call, the
# comparison with torch.utils.checkpoint, and what a check costs in plain steps. Writes them to ./benchmarks/ (reports) and prints them.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CKCHECK_BUILD_DIR:-build}
out=benchmarks
mkdir -p "$out"
python=${CKCHECK_VENV_PYTHON:-.venv/bin/python}

echo "== ckcheck bench, transformer (CPU)"
"$build/ckcheck" bench --model transformer --layers 4 --hidden 256 --heads 8 --seq 128 --batch 8 \
  --policies none,every:1,every:2,every:4,segments:sqrt,sites:*.attn,sites:*.ffn --steps 10 --warmup 2 \
  --report json="$out/transformer.json" --report html="$out/transformer.html" --report markdown="$out/transformer.md"
echo "== ckcheck bench, convnet (CPU)"
"$build/ckcheck" bench --model convnet --layers 4 --channels 32 --size 32 --batch 8 \
  --policies none,every:1,every:2,every:4,segments:sqrt --steps 10 --warmup 2 \
  --report json="$out/convnet.json" --report html="$out/convnet.html" --report markdown="$out/convnet.md"
echo "== the checkpoint machinery per call (Google Benchmark)"
"$build/bench/ckcheck_bench_checkpoint" --benchmark_min_time=0.5 | tee "$out/checkpoint_bench.txt"
if command -v valgrind > /dev/null; then
  echo "== the checkpoint machinery per call, in instructions (callgrind; scripts/machinery_instructions.py)"
  python3 scripts/machinery_instructions.py --bench "$build/bench/ckcheck_bench_checkpoint" | tee "$out/machinery_instructions.md"
else
  echo "== skipped: the machinery in instructions needs valgrind (Debian: apt-get install valgrind)"
fi
echo "== against torch.utils.checkpoint (reentrant, non-reentrant, SAC), interleaved, one process"
"$python" bench/compare_pytorch.py --pymemory "$build/bench/libckcheck_pymemory.so" \
  --layers 4 --hidden 256 --heads 8 --seq 128 --batch 8 --vocab 64 --rounds 10 --warmup 2 | tee "$out/compare_pytorch.md"
echo "== what a check costs, in plain training steps (scripts/cost_table.py)"
PYTHONPATH="$build/python" "$python" scripts/cost_table.py | tee "$out/cost_table.md"
echo "== where torch.utils.checkpoint and ckcheck::checkpoint differ (tests/python/test_torch_checkpoint_semantics.py)"
"$python" tests/python/test_torch_checkpoint_semantics.py | tee "$out/semantics.md"
echo "== stability of ckcheck bench: 5 runs quiet, 5 beside a CPU-bound process that starts and stops at random"
python3 scripts/bench_stability.py --ckcheck "$build/ckcheck" --runs "${CKCHECK_STABILITY_RUNS:-5}" --keep "$out/stability" -- \
  --model transformer --layers 4 --hidden 256 --heads 8 --seq 128 --batch 8 --vocab 64 \
  --policies none,every:1,every:2,every:4,segments:sqrt,sites:*.attn,sites:*.ffn --steps 10 --warmup 2 \
  | tee "$out/stability.md"
