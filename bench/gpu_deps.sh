#!/usr/bin/env bash
# Prepares, on this (networked) machine with Bazel, what bench/gpu_check.sh
# needs on a GPU machine that can reach nothing and has no Bazel:
#  - the Debian packages whose headers and libraries the kernel tests build
#    with: fmt, doctest, Eigen, nlohmann-json, xxhash, and OpenBLAS (the CPU
#    backend's GEMMs; OpenMP build) with its Fortran runtime;
#  - .gpu_deps/swarm-bundle.tar.xz, the whole `swarm` program built for
#    x86-64-v3 with every shared library it needs (bench/gpu_bundle.sh), for
#    the script's system section. SWARM_GPU_DEPS_NO_BUNDLE=1 skips it.
# Everything lands in .gpu_deps/ (git-ignored); carry that folder along with
# the working tree (about 28 MiB: 14 of packages, 14 of bundle; both compressed).
#
#   bash bench/gpu_deps.sh && <copy the tree and .gpu_deps to the GPU machine>
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu_deps
(
  cd .gpu_deps
  packages=(libfmt-dev libfmt9 doctest-dev libeigen3-dev nlohmann-json3-dev libxxhash-dev libxxhash0
            # cblas.h and libopenblas.so (kernels/cpu/matmul.cc), and what libopenblas.so.0
            # needs beyond glibc and libgomp (which any machine with g++ has).
            libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libquadmath0)
  missing=()
  for p in "${packages[@]}"; do
    ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    apt-get download "${missing[@]}"
  fi
  ls -1 *.deb
)
if [ "${SWARM_GPU_DEPS_NO_BUNDLE:-0}" != 1 ]; then
  bash bench/gpu_bundle.sh
fi
du -sh .gpu_deps
