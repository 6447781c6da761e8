#!/usr/bin/env bash
# On a GPU machine: builds ckcheck against its pip torch's CUDA LibTorch (with the Debian packages
# unpacked by fetch-device-deps.sh), runs the GPU tests, `ckcheck run` and `ckcheck bench` on
# CUDA, and writes every log under $OUT (default ./device-logs). Each step goes on after a
# failure, so one run shows them all; the summary is in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-logs}
mkdir -p "$out"
deps=$PWD/.device-deps/root
export PATH="$deps/usr/bin:$PATH"
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
summary="$out/summary.txt"
: > "$summary"
step() {  # step NAME COMMAND...: runs it, logs to $out/NAME.log, notes the status
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc ($((SECONDS - t0)) s)" | tee -a "$summary"
  return $rc
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
} > "$out/machine.txt" 2>&1
py=$(command -v python3)
prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
cuda_args=()
if [[ ! -f /usr/local/cuda/include/cublas_v2.h ]]; then
  # As on the build machines: join nvcc with the nvidia wheels' headers and libraries.
  step cuda_toolkit bash scripts/cuda-toolkit.sh "$py" "$PWD/.device-cuda" || exit 1
  cuda_args=("-DCUDA_TOOLKIT_ROOT_DIR=$PWD/.device-cuda" "-DCUDAToolkit_ROOT=$PWD/.device-cuda"
             "-DCMAKE_CUDA_COMPILER=$PWD/.device-cuda/bin/nvcc")
fi
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
step configure cmake -S . -B build-cuda "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix;$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share/cmake" \
  "-DCKCHECK_PYTHON=$py" -DCKCHECK_CUDA_ARCHITECTURES=90 -DCKCHECK_CUDA=ON -DCKCHECK_CCACHE=OFF "${cuda_args[@]}" || exit 1
step build cmake --build build-cuda --parallel "$(nproc)" || exit 1
step gpu_tests build-cuda/tests/ckcheck_tests --gtest_filter='Cuda.*:Checkpoint.*:Conformance.*:Runner.*'
step run_transformer_cuda build-cuda/ckcheck run --model transformer --device cuda --report json="$out/run_cuda.json"
step run_fp16 build-cuda/ckcheck run --model transformer --device cuda --amp fp16 --report json="$out/run_fp16.json"
step run_fp16_no_restore build-cuda/ckcheck run --model transformer --device cuda --amp fp16 --no-restore-autocast
step run_atomic build-cuda/ckcheck run --model faulty/nondeterministic-op --device cuda --hidden 256
step bench_cuda build-cuda/ckcheck bench --model transformer --device cuda --layers 8 --hidden 1024 --heads 16 \
  --seq 1024 --batch 8 --policies none,every:1,every:2,every:4,sites:*.attn --steps 10 --warmup 2 \
  --report json="$out/bench_cuda.json" --report html="$out/bench_cuda.html"
step bench_cuda_budget build-cuda/ckcheck bench --model transformer --device cuda --layers 8 --hidden 1024 --heads 16 \
  --seq 1024 --batch 8 --policies none,every:1,every:2,every:4 --memory-budget 4GiB --steps 5 --warmup 1
step nccl_single_gpu build-cuda/ckcheck run --model transformer --device cuda --world-size 2
cat "$summary"
