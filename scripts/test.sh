#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: install what is needed, build, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd "${CKCHECK_BUILD_DIR:-build}"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
