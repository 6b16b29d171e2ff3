#!/usr/bin/env bash
# gpu_check: everything CUDA, on a machine with a GPU and nvcc, in under 8 minutes:
# builds the CUDA kernels, the CUDA backends and their tests and benchmarks, runs
# every CUDA test (each kernel against the CPU backend, and a whole GPT stage),
# then the kernel benchmarks, and sets the GPT-2 block beside PyTorch's.
#
# The GPU machines we borrow are offline and have no Bazel, so this builds
# directly with nvcc and g++ (the same sources and flags as the Bazel targets,
# for the GPU's own architecture only, which keeps the build short). Headers of
# fmt, doctest, Eigen, nlohmann-json and xxhash come from the system, or from
# the Debian packages that bench/gpu_deps.sh fetched into .gpu_deps/.
#
#   bash bench/gpu_deps.sh            # here, where the network is
#   bash bench/gpu_check.sh           # there; logs go to $OUT (or /tmp/swarm-gpu-check)
#   SWARM_GPU_SANITIZE=1 bash bench/gpu_check.sh   # also every test under compute-sanitizer
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
LOGS=${OUT:-/tmp/swarm-gpu-check}
BUILD=${SWARM_GPU_BUILD:-/tmp/swarm-gpu-build}
JOBS=$(nproc)
mkdir -p "$LOGS" "$BUILD/obj"
START=$(date +%s)
say() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*"; }

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC="$CUDA_HOME/bin/nvcc"
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ]; then echo "gpu_check: no nvcc found"; exit 2; fi

# Header and library dependencies: the system's, else the carried packages.
INCLUDES=(-I"$REPO")
LIBDIRS=()
# SWARM_GPU_USE_DEBS=1 takes the carried packages even where the system has them.
if [ "${SWARM_GPU_USE_DEBS:-0}" = 1 ] || [ ! -f /usr/include/fmt/core.h ] || [ ! -f /usr/include/doctest/doctest.h ] \
   || [ ! -d /usr/include/eigen3 ] || [ ! -f /usr/include/nlohmann/json.hpp ] || [ ! -f /usr/include/xxhash.h ]; then
  if ! ls .gpu_deps/*.deb >/dev/null 2>&1; then
    echo "gpu_check: fmt/doctest/Eigen headers are missing and .gpu_deps/ is empty; run bench/gpu_deps.sh first"
    exit 2
  fi
  ROOT="$BUILD/deps"
  mkdir -p "$ROOT"
  for deb in .gpu_deps/*.deb; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$deb" "$ROOT"
    else (cd "$ROOT" && ar p "$REPO/$deb" "$(ar t "$REPO/$deb" | grep '^data.tar')" | tar -x -a -f - 2>/dev/null \
          || ar p "$REPO/$deb" data.tar.xz | tar -xJ); fi
  done
  INCLUDES+=(-isystem "$ROOT/usr/include" -isystem "$ROOT/usr/include/eigen3")
else
  INCLUDES+=(-isystem /usr/include/eigen3)
fi
INCLUDES+=(-isystem "$CUDA_HOME/include")
LIBDIRS+=(-L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64")

# cuDNN: in the toolkit, or from the nvidia-cudnn wheel next to PyTorch.
if [ ! -f "$CUDA_HOME/include/cudnn.h" ]; then
  CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null \
              || python3 -c 'import nvidia.cudnn, os; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
  if [ -n "$CUDNN_DIR" ]; then
    INCLUDES+=(-isystem "$CUDNN_DIR/include")
    LIBDIRS+=(-L"$CUDNN_DIR/lib" -Wl,-rpath,"$CUDNN_DIR/lib")
    [ -e "$CUDNN_DIR/lib/libcudnn.so" ] || ln -sf "$(ls "$CUDNN_DIR"/lib/libcudnn.so.* | head -1)" "$BUILD/libcudnn.so"
    LIBDIRS+=(-L"$BUILD")
  fi
fi

CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
[ -n "$CAP" ] || CAP=90
[ "$CAP" = 90 ] && ARCH=(-gencode=arch=compute_90,code=sm_90) || ARCH=(-gencode=arch=compute_$CAP,code=sm_$CAP)
say "nvcc: $("$NVCC" --version | tail -1); GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) (sm_$CAP); $JOBS cores"

# Header-only fmt and xxhash: nothing to link, no ABI to match.
DEFINES=(-DFMT_HEADER_ONLY -DXXH_INLINE_ALL)
CXXFLAGS=(-std=c++20 -O3 -march=native -fopenmp -Wno-deprecated-declarations "${DEFINES[@]}" "${INCLUDES[@]}")
NVCCFLAGS=(-std=c++20 -O3 --expt-relaxed-constexpr -DFMT_USE_CONSTEXPR=1 -DFMT_CONSTEVAL= -Xcompiler=-march=native
           "${ARCH[@]}" "${DEFINES[@]}" "${INCLUDES[@]}")
# Files whose Bazel rules turn off contraction (bit-identical optimizer replicas).
NO_CONTRACT_CC="swarm/optim/"
NO_FMAD_CU=$(grep -l "fmad=false" kernels/cuda/BUILD.bazel >/dev/null && grep -B12 'fmad=false' kernels/cuda/BUILD.bazel | grep -o '"[a-z_]*\.cu"' | tr -d '"' || true)

LIB_CC=$(ls swarm/core/*.cc kernels/cpu/*.cc swarm/optim/*.cc swarm/compression/*.cc kernels/cuda/*.cc \
            models/gpt/config.cc models/gpt/init.cc models/gpt/inputs.cc models/gpt/gpt_stage_cpu.cc \
            models/gpt/gpt_stage_cuda_*.cc 2>/dev/null)
LIB_CU=$(ls kernels/cuda/*.cu)
TESTS=$(ls tests/cuda/*_test.cc tests/models/gpt/gpt_stage_cuda_test.cc)
BENCHES=$(ls bench/gpu/*_bench.cc)

compile() {  # source -> object, one line of log
  local src=$1 obj="$BUILD/obj/${1//\//_}.o" extra=()
  if [[ $src == *.cu ]]; then
    for f in $NO_FMAD_CU; do [[ $src == kernels/cuda/$f ]] && extra=(--fmad=false); done
    "$NVCC" "${NVCCFLAGS[@]}" "${extra[@]}" -c "$src" -o "$obj" > "$obj.log" 2>&1
  else
    [[ $src == $NO_CONTRACT_CC* ]] && extra=(-ffp-contract=off)
    g++ "${CXXFLAGS[@]}" "${extra[@]}" -c "$src" -o "$obj" > "$obj.log" 2>&1
  fi
  local rc=$?
  if [ $rc -ne 0 ]; then echo "COMPILE FAILED: $src"; cat "$obj.log"; else echo "compiled $src"; fi
  return $rc
}
export -f compile
export BUILD NVCC NO_CONTRACT_CC NO_FMAD_CU
# xargs runs a fresh bash: pass the arrays through declare -p.
export ARRAYS="$(declare -p NVCCFLAGS CXXFLAGS)"

say "compiling $(echo $LIB_CC $LIB_CU $TESTS $BENCHES tests/doctest_main.cc | wc -w) files on $JOBS cores"
printf '%s\n' $LIB_CU $LIB_CC $TESTS $BENCHES tests/doctest_main.cc |
  xargs -P "$JOBS" -I{} bash -c 'eval "$ARRAYS"; compile "$@"' _ {} > "$LOGS/compile.log" 2>&1
grep -A30 "COMPILE FAILED" "$LOGS/compile.log" | head -120
COMPILE_FAILURES=$(grep -c "COMPILE FAILED" "$LOGS/compile.log")
say "compiled; $COMPILE_FAILURES failures (log: $LOGS/compile.log)"

obj() { echo "$BUILD/obj/${1//\//_}.o"; }
rm -f "$BUILD/libswarm_gpu.a"
ar rcs "$BUILD/libswarm_gpu.a" $(for f in $LIB_CC $LIB_CU; do [ -f "$(obj $f)" ] && obj $f; done)
LINK=("$BUILD/libswarm_gpu.a" "${LIBDIRS[@]}" -lcudnn -lcublasLt -lcublas -lcudart -lgomp -lpthread -ldl -lrt)

passed=0; failed=0; failed_names=()
for t in $TESTS; do
  name=$(basename "$t" .cc)
  if ! g++ -fopenmp "$(obj $t)" "$(obj tests/doctest_main.cc)" "${LINK[@]}" -o "$BUILD/$name" > "$LOGS/$name.link.log" 2>&1; then
    say "LINK FAILED $name"; head -20 "$LOGS/$name.link.log"; failed=$((failed+1)); failed_names+=("$name"); continue
  fi
  if timeout 150 "$BUILD/$name" > "$LOGS/$name.log" 2>&1; then
    passed=$((passed+1)); say "PASSED $name ($(grep 'test cases' "$LOGS/$name.log" | tail -1 | tr -s ' '))"
  else
    failed=$((failed+1)); failed_names+=("$name"); say "FAILED $name"; grep -B3 -A12 "ERROR\|FAILED\|error" "$LOGS/$name.log" | head -60
  fi
done

# SWARM_GPU_SANITIZE=1: every test binary again under compute-sanitizer's
# memcheck (out-of-bounds and misaligned accesses, leaks). Slow: opt-in.
if [ "${SWARM_GPU_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for t in $TESTS; do
    name=$(basename "$t" .cc)
    [ -x "$BUILD/$name" ] || continue
    if timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$BUILD/$name" > "$LOGS/$name.memcheck.log" 2>&1; then
      say "memcheck clean: $name"
    else
      failed=$((failed+1)); failed_names+=("$name(memcheck)"); say "MEMCHECK FAILED $name"
      grep -m20 -A6 "Invalid\|ERROR" "$LOGS/$name.memcheck.log"
    fi
  done
fi

say "benchmarks"
for b in $BENCHES; do
  name=$(basename "$b" .cc)
  if g++ -fopenmp "$(obj $b)" "${LINK[@]}" -o "$BUILD/$name" > "$LOGS/$name.link.log" 2>&1; then
    echo "--- $name"
    timeout 120 "$BUILD/$name" 2>&1 | tee "$LOGS/$name.log" | grep -v '^{'
  else
    say "LINK FAILED $name"; head -20 "$LOGS/$name.link.log"
  fi
done

if [ -f "$LOGS/gpt2_block_bench.log" ] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "--- PyTorch, the same block (bf16, SDPA)"
  timeout 120 python3 bench/torch_block.py --device cuda --dtype bf16 --d-model 768 --heads 12 --seq 1024 --batch 8 \
    --reps 10 | tee "$LOGS/torch_block.json"
  python3 - "$LOGS/gpt2_block_bench.log" "$LOGS/torch_block.json" <<'PY'
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["tokens_per_s"]
torch = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["tokens_per_s"]
if ours > 0 and torch > 0:
    print(f"ratio block bf16: ours is {ours / torch:.2f}x the speed of PyTorch ({ours:.0f} vs {torch:.0f} tokens/s)")
PY
fi

say "done: $passed passed, $failed failed ${failed_names[*]:-}; compile failures: $COMPILE_FAILURES"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$COMPILE_FAILURES" -eq 0 ]
