#!/usr/bin/env bash
# The installed package finds the LibTorch it was built against even where another LibTorch comes
# first on CMAKE_PREFIX_PATH or in the system folders (as Debian's libtorch-dev does beside a venv's
# pip torch): a decoy LibTorch -- its Torch and Caffe2 packages stop any configure that finds them,
# its libraries are not libraries -- found before pip torch's own by pip's TorchConfig.cmake, which
# looks for its Caffe2 package and libraries with PATHS (searched after the prefix path and the
# system folders). The negative control: a project that asks for Torch itself, with the same prefix
# path, finds the decoy.
#   beside_another_libtorch.sh PREFIX WORK CONSUMER_SOURCE EXPECTED_TORCH_DIR
set -euo pipefail
prefix=$1 work=$2 source=$3 expected=$4
rm -rf "$work" && mkdir -p "$work/decoy/share/cmake/Torch" "$work/decoy/share/cmake/Caffe2" "$work/decoy/lib" "$work/plain"
cat > "$work/decoy/share/cmake/Torch/TorchConfig.cmake" <<'CMAKE'
message(FATAL_ERROR "the decoy LibTorch was found")
CMAKE
cat > "$work/decoy/share/cmake/Caffe2/Caffe2Config.cmake" <<'CMAKE'
message(FATAL_ERROR "the decoy Caffe2 was found")
CMAKE
for lib in torch torch_cpu c10 c10_cuda caffe2_nvrtc kineto; do echo "not a library" > "$work/decoy/lib/lib$lib.so"; done
cat > "$work/plain/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(plain LANGUAGES CXX)
find_package(Torch REQUIRED)
CMAKE
if cmake -S "$work/plain" -B "$work/plain/build" -DCMAKE_PREFIX_PATH="$work/decoy" >"$work/plain.log" 2>&1 \
   || ! grep -q "the decoy LibTorch was found" "$work/plain.log"; then
  echo "negative control failed: a plain find_package(Torch) did not find the decoy" >&2
  cat "$work/plain.log" >&2
  exit 1
fi
# The consumer, with the decoy first and no Torch_DIR or CUDA paths of its own.
if ! cmake -S "$source" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_PREFIX_PATH="$work/decoy;$prefix" >"$work/consumer.log" 2>&1; then
  echo "the consumer did not configure beside the decoy LibTorch:" >&2
  tail -20 "$work/consumer.log" >&2
  exit 1
fi
# The consumer links the libraries of the LibTorch ckcheck was built against (TORCH/share/cmake/Torch).
torch_lib=$(realpath "$expected/../../../lib")
if grep -rqs --include=link.txt --include=build.ninja "$work/decoy/lib" "$work/consumer"; then
  echo "the consumer links the decoy's libraries:" >&2
  grep -rhs --include=link.txt --include=build.ninja -o "[^ ]*decoy/lib[^ ]*" "$work/consumer" | sort -u | head >&2
  exit 1
fi
if ! grep -rqs --include=link.txt --include=build.ninja "$torch_lib/libtorch" "$work/consumer"; then
  echo "the consumer does not link $torch_lib/libtorch* (the LibTorch ckcheck was built against):" >&2
  grep -rhs --include=link.txt --include=build.ninja -o "[^ ]*libtorch[^ ]*" "$work/consumer" | sort -u | head >&2
  exit 1
fi
echo "beside a decoy LibTorch the consumer links $torch_lib, the LibTorch ckcheck was built against"
