"""The project's compiler flags, defined once: C++ rules and nvcc both read them."""

CXX_STANDARD = "c++20"

# -march=native: CI and developers build on the machine that runs the code;
# the disk cache is per machine, so objects never cross CPU models.
# `--define portable=1` (//tools:portable) builds for x86-64-v3 (AVX2, FMA)
# instead: a binary to carry to another machine, as bench/gpu_bundle.sh does.
# Either way the flag keeps its place, so default command lines are unchanged.
_MARCH = select({
    "//tools:portable": ["-march=x86-64-v3"],
    "//conditions:default": ["-march=native"],
})

# `--config=dev` (//tools:dev): a quicker compile of slower code, for an edit loop.
_OPTIMIZE = select({
    "//tools:dev": ["-O1"],
    "//conditions:default": ["-O3"],
})

CXX_OPTS = [
    "-std=" + CXX_STANDARD,
] + _OPTIMIZE + _MARCH + [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    # GCC 12 reports its own AVX-512 intrinsics header (inlined through Eigen)
    # hundreds of times per file; the warning carries no signal for our code.
    "-Wno-maybe-uninitialized",
    # Every object is position-independent (--force_pic, .bazelrc), and -fPIC alone
    # lets GCC assume a global function may be replaced at load time, so it does not
    # inline one into its callers: the main job ran 3% slower for it.
    "-fno-semantic-interposition",
]

# Machine code for A100 (sm_80) and H100/H200 (sm_90), plus PTX so newer GPUs
# can JIT-compile it.
CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

_NVCC_OPTS_BEFORE_MARCH = [
    "-std=" + CXX_STANDARD,
    # fmt 9 turns constexpr off under nvcc but still uses it in consteval
    # format checks; nvcc's front end then rejects them. Keep constexpr on and
    # skip the consteval check: the same strings are checked in every .cc file.
    "-DFMT_USE_CONSTEXPR=1",
    "-DFMT_CONSTEVAL=",
    "-O3",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
]

# Plain lists (a genrule's cmd is one string): cuda.bzl picks one of the two
# with select() on //tools:portable.
NVCC_OPTS = _NVCC_OPTS_BEFORE_MARCH + ["-Xcompiler=-march=native"] + CUDA_ARCH_FLAGS
NVCC_OPTS_PORTABLE = _NVCC_OPTS_BEFORE_MARCH + ["-Xcompiler=-march=x86-64-v3"] + CUDA_ARCH_FLAGS
