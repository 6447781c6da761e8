#!/usr/bin/env bash
# For a GPU machine that has pip torch (CUDA) but no Debian packages: downloads the Debian
# packages ckcheck builds against and unpacks them into .device-deps/ (ignored by git; carry it
# to the machine). Run here, on a Debian bookworm machine with apt.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.device-deps
rm -rf "$dest" && mkdir -p "$dest/debs"
grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
pkgs=(libgtest-dev librapidcheck-dev libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev
      libbenchmark-dev libbenchmark1debian libgloo-dev ninja-build)
(cd "$dest/debs" && apt-get download "${pkgs[@]}")
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest/root"; done
rm -rf "$dest/debs"
echo "unpacked into $dest/root: ${pkgs[*]}"
