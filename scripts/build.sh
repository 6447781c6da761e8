#!/usr/bin/env bash
# Configures and builds ckcheck into ./build (or $CKCHECK_BUILD_DIR). Extra arguments go to the
# CMake configure step, e.g. -DCMAKE_PREFIX_PATH=/path/to/libtorch for a CUDA LibTorch 2.x.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CKCHECK_BUILD_DIR:-build}
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [[ $# -gt 0 ]]; then
  cmake -S . -B "$build" "$@"
fi
cmake --build "$build" --parallel "$(nproc)"
