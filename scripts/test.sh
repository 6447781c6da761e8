#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12/13 machine: install what is needed (Debian packages,
# pip torch in ./.venv), build every target, run every test (CTest: GoogleTest, RapidCheck, CLI,
# package, Python-side tests with the venv's torch and torchvision).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd "${CKCHECK_BUILD_DIR:-build}"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
