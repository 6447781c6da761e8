#!/usr/bin/env bash
# Installs what ckcheck needs to build and test (with --tests: and to run the tests), on Debian 12 or 13. Idempotent and
# non-interactive: a second run costs one dpkg query and one pip query.
#
# - Debian packages: the compiler, CMake, and the C++ libraries other than LibTorch.
# - LibTorch from pip torch, in a virtual environment in the repository (.venv, ignored by git).
#   torch 2.14.1 (a CUDA 13 build that also runs on the CPU) with torchvision 0.29.1 when that
#   wheel lies on this machine's disk; otherwise torch 2.13.0 (CPU build), with a torchvision only
#   where a matching one lies on disk. CKCHECK_TORCH=2.13.0 (or 2.14.1) forces the choice.
# - For a CUDA torch: a CUDA toolkit folder (.venv/cuda) that joins the machine's nvcc with the
#   headers and libraries of the nvidia-*-cu13 wheels, so that CMake finds a whole toolkit.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(cmake ninja-build g++ ccache pkg-config
      libgtest-dev librapidcheck-dev libfmt-dev libcli11-dev nlohmann-json3-dev libbenchmark-dev
      # headers of the Gloo library behind c10d's ProcessGroupGloo (data-parallel runs)
      libgloo-dev
      python3-venv)
# --tests: what only the test suite needs -- headless Chromium, in which a test renders the bench
# report's chart and measures its layout.
if [[ "${1:-}" == "--tests" ]]; then
  pkgs+=(chromium)
fi
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  sudo=""
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 2; }
    sudo="sudo"
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all ${#pkgs[@]} Debian packages present"
fi

# The interpreter the venv is made from: pyenv's python3 on PATH (pip's wheels on disk are for 3.11).
base_python=${CKCHECK_BASE_PYTHON:-python3}
venv=.venv
if [[ ! -x $venv/bin/python ]]; then
  "$base_python" -m venv "$venv"
fi
py=$venv/bin/python

# Which torch: the one asked for, else 2.14.1 where its wheel is on disk, else 2.13.0.
torch=${CKCHECK_TORCH:-}
if [[ -z $torch ]]; then
  if "$py" scripts/local_wheel.py torch 2.14.1; then torch=2.14.1; else torch=2.13.0; fi
fi
case $torch in
  2.14.1) vision=0.29.1 ;;
  2.13.0) vision=$("$py" scripts/local_wheel.py --print torchvision '0.28.0+cpu' || true) ;;
  *) echo "install-deps: CKCHECK_TORCH=$torch is not a tested version (2.13.0 or 2.14.1)" >&2; exit 2 ;;
esac
want=("torch==$torch" pytest numpy jsonschema lizard)
pins=(-c scripts/constraints.txt)
[[ -n $vision ]] && want+=("torchvision==$vision")
have=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
if [[ $have != "$torch" ]] || ! "$py" -c 'import pytest, numpy, jsonschema, lizard' 2>/dev/null \
   || { [[ -n $vision ]] && ! "$py" -c 'import torchvision' 2>/dev/null; }; then
  echo "install-deps: pip installing ${want[*]} into $venv"
  "$py" -m pip install -q --disable-pip-version-check "${pins[@]}" "${want[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  "$py" -c 'import torch' || { echo "install-deps: torch $torch did not install" >&2; exit 2; }
else
  echo "install-deps: $venv has torch $torch${vision:+ and torchvision $vision}"
fi

# Real models for the eager-Python tests, built from configs with random weights: Hugging Face
# transformers and PEFT (timm where torchvision is there), and the loops ckcheck checks from inside
# (Accelerate, Lightning), QLoRA's 4-bit layers (bitsandbytes) and float8 training (torchao,
# emulated), all on the CPU, at the versions in
# scripts/constraints.txt. torch is named with its version so that nothing replaces it.
# Optional: without them those tests report as skipped.
extras=(transformers peft accelerate lightning bitsandbytes torchao)
[[ -n $vision ]] && extras+=(timm "torchvision==$vision")
# Installed at the pinned versions? (A name without a pin only has to import.)
pinned='
import importlib.metadata as md, sys
pins = dict(l.split("#")[0].strip().split("==") for l in open("scripts/constraints.txt") if "==" in l)
for name in (a.split("==")[0] for a in sys.argv[1:]):
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if name in pins and have != pins[name]:
        sys.exit(1)
'
if ! "$py" -c "$pinned" "${extras[@]}"; then
  echo "install-deps: pip installing ${extras[*]} into $venv"
  "$py" -m pip install -q --disable-pip-version-check "${pins[@]}" "${extras[@]}" "torch==$torch" 2>&1 | grep -v "^WARNING: Location" || true
  "$py" -c 'import transformers, peft' 2>/dev/null \
    || echo "install-deps: ${extras[*]} did not install; the tests on them are skipped"
fi

# A CUDA torch's CMake files look for a whole CUDA toolkit (cuBLAS, cuDNN, ... headers and
# libraries); the machine's nvcc comes without them and the wheels carry them: join the two.
if "$py" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)'; then
  bash scripts/cuda-toolkit.sh "$py" "$venv/cuda"
fi
