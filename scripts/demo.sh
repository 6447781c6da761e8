#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what is needed, build, and check that
# checkpointing the built-in transformer changes nothing (reports in ./ckcheck-report.*).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/ckcheck run --model transformer --layers 4 --policy every:1 \
  --report json=ckcheck-report.json --report markdown=ckcheck-report.md
