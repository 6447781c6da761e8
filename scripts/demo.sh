#!/usr/bin/env bash
# The main job on a fresh Debian 12/13 machine: install what is needed, build the ckcheck command
# (not the tests), and check that checkpointing the built-in transformer changes nothing (reports in
# ./ckcheck-report.*).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
CKCHECK_TARGETS=ckcheck_cli bash scripts/build.sh
./build/ckcheck --version
./build/ckcheck run --model transformer --layers 4 --policy every:1 \
  --report json=ckcheck-report.json --report markdown=ckcheck-report.md
