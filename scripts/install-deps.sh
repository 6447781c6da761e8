#!/usr/bin/env bash
# Installs what ckcheck needs to build and test on Debian bookworm. Idempotent and non-interactive:
# packages already present are skipped, so a second run costs one dpkg query.
set -euo pipefail

pkgs=(cmake ninja-build g++ ccache
      libtorch-dev libgtest-dev librapidcheck-dev libfmt-dev libcli11-dev nlohmann-json3-dev
      libbenchmark-dev
      # headers of the Gloo library behind c10d's ProcessGroupGloo (data-parallel runs)
      libgloo-dev
      # Debian's LibTorch calls whatever BLAS the alternatives system provides; without OpenBLAS
      # that is the reference BLAS, about ten times slower on the matrix products of a training step.
      libopenblas0-pthread)
# Optional: the Python side of the same LibTorch, used by the torchvision test and the comparison
# with torch.utils.checkpoint. Skipped with CKCHECK_NO_PYTHON=1.
if [[ "${CKCHECK_NO_PYTHON:-0}" != 1 ]]; then
  pkgs+=(python3-torch python3-torchvision)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 2; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
