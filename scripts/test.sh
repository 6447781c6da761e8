#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12/13 machine: install what is needed (Debian packages,
# pip torch in ./.venv), build every target, run every test (CTest: GoogleTest, RapidCheck, CLI,
# package, Python-side tests with the venv's torch and torchvision).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --tests
bash scripts/build.sh
build=${CKCHECK_BUILD_DIR:-build}
"$build/ckcheck" --version
if ! .venv/bin/python -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)'; then
  echo "CUDA build skipped: torch 2.14.1 (the CUDA wheel) is not on this machine's disk, so LibTorch is the CPU build"
elif [[ ! -x .venv/cuda/bin/nvcc ]]; then
  echo "CUDA build skipped: no nvcc on this machine"
fi
cd "$build"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
