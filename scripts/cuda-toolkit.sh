#!/usr/bin/env bash
# Usage: cuda-toolkit.sh PYTHON DEST
# Assembles a CUDA toolkit folder at DEST for building against pip torch's CUDA LibTorch: the
# machine's nvcc (bin/, nvvm/) joined with the headers and libraries that the nvidia-*-cu13 wheels
# of PYTHON's environment carry (cuBLAS, cuDNN, cuRAND, cuSPARSE, NCCL, ...), with the unversioned
# library names CMake looks for, and a link-time stand-in for the driver library (libcuda), which
# only a machine with a GPU driver has; the stand-in is dropped from every link (AS_NEEDED), since
# LibTorch opens the real driver at run time. Prints nothing and exits 0 when there is no nvcc.
set -euo pipefail
py=$1
dest=$2
nvcc=""
for cand in "${CUDA_HOME:-}/bin/nvcc" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
  if [[ -x $cand && -f $(dirname "$(readlink -f "$cand")")/nvcc.profile ]]; then nvcc=$cand; break; fi
done
if [[ -z $nvcc ]]; then
  echo "cuda-toolkit: no nvcc on this machine; the CUDA parts of ckcheck will not be built"
  exit 0
fi
root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
site=$("$py" -c 'import os, nvidia; print(os.path.dirname(list(nvidia.__path__)[0]))')
stamp="$root|$site"
if [[ -f $dest/.stamp && $(cat "$dest/.stamp") == "$stamp" ]]; then
  echo "cuda-toolkit: $dest is up to date"
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/include" "$dest/lib/stubs" "$dest/targets/x86_64-linux"
# nvcc finds its own headers and tools relative to itself: copy bin/ (nvcc.profile says TOP=..),
# link the rest.
cp -a "$root/bin/." "$dest/bin/"
ln -s "$root/nvvm" "$dest/nvvm"
ln -s ../../include "$dest/targets/x86_64-linux/include"
ln -s ../../lib "$dest/targets/x86_64-linux/lib"
ln -s lib "$dest/lib64"
link_all() {  # link_all FROM TO: a link in TO for each entry of FROM not already there
  local from=$1 to=$2 f
  [[ -d $from ]] || return 0
  for f in "$from"/*; do
    [[ -e $to/$(basename "$f") ]] || ln -s "$f" "$to/$(basename "$f")"
  done
}
link_all "$root/include" "$dest/include"
for pkg in "$site"/nvidia/*/; do
  link_all "$pkg/include" "$dest/include"
  for lib in "$pkg"/lib/*.so*; do
    [[ -e $lib ]] || continue
    name=$(basename "$lib")
    [[ -e $dest/lib/$name ]] || ln -s "$lib" "$dest/lib/$name"
    plain=${name%%.so*}.so
    [[ -e $dest/lib/$plain ]] || ln -s "$lib" "$dest/lib/$plain"
  done
done
link_all "$root/lib" "$dest/lib"
printf 'void ckcheck_no_cuda_driver(void) {}\n' > "$dest/lib/stubs/stub.c"
cc -shared -fPIC -o "$dest/lib/stubs/libcuda_link_stub.so" "$dest/lib/stubs/stub.c"
echo "INPUT(AS_NEEDED($dest/lib/stubs/libcuda_link_stub.so))" > "$dest/lib/stubs/libcuda.so"
echo "$stamp" > "$dest/.stamp"
echo "cuda-toolkit: $dest joins $root with the CUDA wheels in $site"
