#!/usr/bin/env bash
# Configures and builds ckcheck into ./build (or $CKCHECK_BUILD_DIR) against the LibTorch of pip
# torch in ./.venv (scripts/install-deps.sh makes it), found through torch.utils.cmake_prefix_path.
# With a CUDA torch and the toolkit folder .venv/cuda, CUDA is compiled in (H100/H200 and A100
# code: CKCHECK_CUDA_ARCHITECTURES 90;80). Extra arguments go to the CMake configure step.
# Targets to build may be named with CKCHECK_TARGETS (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CKCHECK_BUILD_DIR:-build}
py=${CKCHECK_VENV_PYTHON:-$PWD/.venv/bin/python}
[[ -x $py ]] || { echo "build: no $py; run scripts/install-deps.sh first" >&2; exit 2; }
prefix=$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
args=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix" "-DCKCHECK_PYTHON=$py")
cuda=$PWD/.venv/cuda
if [[ -x $cuda/bin/nvcc ]] && "$py" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)'; then
  args+=("-DCUDA_TOOLKIT_ROOT_DIR=$cuda" "-DCUDAToolkit_ROOT=$cuda" "-DCMAKE_CUDA_COMPILER=$cuda/bin/nvcc"
         "-DCKCHECK_CUDA_ARCHITECTURES=${CKCHECK_CUDA_ARCHITECTURES:-90;80}" -DCKCHECK_CUDA=ON)
fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" "${generator[@]}" "${args[@]}" "$@"
elif [[ $# -gt 0 ]]; then
  cmake -S . -B "$build" "$@"
fi
targets=()
for t in ${CKCHECK_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" --parallel "$(nproc)" "${targets[@]}"
