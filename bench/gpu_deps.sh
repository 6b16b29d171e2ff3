#!/usr/bin/env bash
# Fetches, on this (networked) machine, the Debian packages whose headers and
# libraries bench/gpu_check.sh needs on a GPU machine that can reach nothing:
# fmt, doctest, Eigen, nlohmann-json and xxhash. They land in .gpu_deps/
# (git-ignored); pass that folder along with the working tree.
#
#   bash bench/gpu_deps.sh && <copy the tree and .gpu_deps to the GPU machine>
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu_deps
cd .gpu_deps
packages=(libfmt-dev libfmt9 doctest-dev libeigen3-dev nlohmann-json3-dev libxxhash-dev libxxhash0)
missing=()
for p in "${packages[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  apt-get download "${missing[@]}"
fi
ls -1 *.deb
