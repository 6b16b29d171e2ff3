#!/usr/bin/env bash
# gpu_check: everything CUDA, on a machine with a GPU and nvcc, in under 8 minutes:
# builds the CUDA kernels, the CUDA backends and their tests and benchmarks, runs
# every CUDA test (each kernel against the CPU backend, and a whole GPT stage),
# then the kernel benchmarks, and sets the GPT-2 block beside PyTorch's. Then
# the system: the `swarm` program itself (carried prebuilt, see below) trains
# GPT-2 small with `swarm train` beside PyTorch on the same model, batch and
# tokens, and as a 2 x 2 swarm with `swarm local`.
#
# The GPU machines we borrow are offline and have no Bazel, so this builds
# directly with nvcc and g++ (the same sources and flags as the Bazel targets,
# for the GPU's own architecture only, which keeps the build short). Headers of
# fmt, doctest, Eigen, nlohmann-json, xxhash and OpenBLAS (with its library)
# come from the system, or from the Debian packages that bench/gpu_deps.sh
# fetched into .gpu_deps/. The whole `swarm` program cannot be built there
# (ZeroMQ, OpenDHT, ...): bench/gpu_deps.sh (through bench/gpu_bundle.sh)
# builds it with Bazel for x86-64-v3 and packs it with its libraries into
# .gpu_deps/swarm-bundle.tar.xz; without that file the system section says so
# and is skipped.
#
#   bash bench/gpu_deps.sh            # here, where the network and Bazel are
#   bash bench/gpu_check.sh           # there; logs go to $OUT (or /tmp/swarm-gpu-check)
#   SWARM_GPU_SANITIZE=1 bash bench/gpu_check.sh   # also every test under compute-sanitizer
#   SWARM_GPU_CHECK_SYSTEM_ONLY=1 bash bench/gpu_check.sh   # only the system section
#   SWARM_GPU_CHECK_SYSTEM_ONLY=1 SWARM_GPU_CHECK_DEVICE=cpu \
#     SWARM_GPU_PYTHON=~/.cache/swarm-bench-venv/bin/python bash bench/gpu_check.sh
#       # the system section's dry run on the CPU: a tiny model, 15-second runs
#
# Other settings: SWARM_GPT2_TOKENS=FILE (an llm.c .bin token file; default: a
# synthetic one), SWARM_PEAK_FLOPS (the GPU's dense bf16 peak for MFU, default
# 989e12: H100/H200 SXM), SWARM_GPU_CHECK_BATCH (8), SWARM_GPU_CHECK_SECONDS
# ("60 40 60": swarm train, PyTorch, swarm local), SWARM_GPU_CHECK_BUDGET (470:
# seconds the whole script may take; the system section shortens its runs to fit),
# SWARM_GPU_LOCAL_ARGS (more flags for swarm local, e.g. "--global-batch 16").
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
LOGS=${OUT:-/tmp/swarm-gpu-check}
BUILD=${SWARM_GPU_BUILD:-/tmp/swarm-gpu-build}
JOBS=$(nproc)
SYSTEM_ONLY=${SWARM_GPU_CHECK_SYSTEM_ONLY:-0}
DEVICE=${SWARM_GPU_CHECK_DEVICE:-cuda}
PYTHON=${SWARM_GPU_PYTHON:-python3}
BUDGET=${SWARM_GPU_CHECK_BUDGET:-470}
mkdir -p "$LOGS" "$BUILD/obj"
START=$(date +%s)
say() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*"; }
passed=0; failed=0; failed_names=(); COMPILE_FAILURES=0

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC="$CUDA_HOME/bin/nvcc"
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ] && [ "$SYSTEM_ONLY" != 1 ]; then echo "gpu_check: no nvcc found"; exit 2; fi

# cuDNN: in the toolkit, or from the nvidia-cudnn wheel next to PyTorch.
CUDNN_DIR=""
if [ ! -f "$CUDA_HOME/include/cudnn.h" ]; then
  CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null \
              || python3 -c 'import nvidia.cudnn, os; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
fi

kernel_checks() {
  # Header and library dependencies: the system's, else the carried packages.
  INCLUDES=(-I"$REPO")
  LIBDIRS=()
  local blas_include=/usr/include/x86_64-linux-gnu/openblas-openmp
  BLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-openmp
  # SWARM_GPU_USE_DEBS=1 takes the carried packages even where the system has them.
  if [ "${SWARM_GPU_USE_DEBS:-0}" = 1 ] || [ ! -f /usr/include/fmt/core.h ] || [ ! -f /usr/include/doctest/doctest.h ] \
     || [ ! -d /usr/include/eigen3 ] || [ ! -f /usr/include/nlohmann/json.hpp ] || [ ! -f /usr/include/xxhash.h ] \
     || [ ! -f "$blas_include/cblas.h" ] || [ ! -e "$BLAS_DIR/libopenblas.so" ]; then
    if ! ls .gpu_deps/*.deb >/dev/null 2>&1; then
      echo "gpu_check: fmt/doctest/Eigen/OpenBLAS headers are missing and .gpu_deps/ is empty; run bench/gpu_deps.sh first"
      exit 2
    fi
    local root="$BUILD/deps" deb
    mkdir -p "$root"
    for deb in .gpu_deps/*.deb; do
      if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$deb" "$root"
      else (cd "$root" && ar p "$REPO/$deb" "$(ar t "$REPO/$deb" | grep '^data.tar')" | tar -x -a -f - 2>/dev/null \
            || ar p "$REPO/$deb" data.tar.xz | tar -xJ); fi
    done
    blas_include="$root$blas_include"
    BLAS_DIR="$root$BLAS_DIR"
    INCLUDES+=(-isystem "$root/usr/include" -isystem "$root/usr/include/eigen3")
    # libopenblas.so.0 needs libgfortran.so.5 and libquadmath.so.0 (carried here).
    LIBDIRS+=(-Wl,-rpath,"$root/usr/lib/x86_64-linux-gnu")
  else
    INCLUDES+=(-isystem /usr/include/eigen3)
  fi
  INCLUDES+=(-isystem "$blas_include" -isystem "$CUDA_HOME/include")
  # OpenBLAS by its folder, as third_party/openblas.BUILD links it. DT_RPATH (not
  # RUNPATH) so that libopenblas's own dependencies are found through it too.
  LIBDIRS+=(-Wl,--disable-new-dtags -L"$BLAS_DIR" -Wl,-rpath,"$BLAS_DIR" -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64")
  if [ -n "$CUDNN_DIR" ]; then
    INCLUDES+=(-isystem "$CUDNN_DIR/include")
    LIBDIRS+=(-L"$CUDNN_DIR/lib" -Wl,-rpath,"$CUDNN_DIR/lib")
    [ -e "$CUDNN_DIR/lib/libcudnn.so" ] || ln -sf "$(ls "$CUDNN_DIR"/lib/libcudnn.so.* | head -1)" "$BUILD/libcudnn.so"
    LIBDIRS+=(-L"$BUILD")
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
  # Files whose Bazel rules turn off contraction (bit-identical optimizer replicas):
  # //swarm/optim and //kernels/cuda:device_updater.
  NO_CONTRACT_CC="swarm/optim/ kernels/cuda/device_updater.cc"
  NO_FMAD_CU=$(grep -l "fmad=false" kernels/cuda/BUILD.bazel >/dev/null && grep -B12 'fmad=false' kernels/cuda/BUILD.bazel | grep -o '"[a-z_]*\.cu"' | tr -d '"' || true)

  LIB_CC=$(ls swarm/core/*.cc kernels/cpu/*.cc swarm/optim/*.cc swarm/compression/*.cc kernels/cuda/*.cc \
              models/gpt/config.cc models/gpt/init.cc models/gpt/inputs.cc models/gpt/gpt_stage_cpu.cc \
              models/gpt/gpt_stage_cuda_*.cc 2>/dev/null)
  LIB_CU=$(ls kernels/cuda/*.cu)
  TESTS=$(ls tests/cuda/*_test.cc tests/kernels/cuda/device_updater_test.cc tests/models/gpt/gpt_stage_cuda_test.cc)
  BENCHES=$(ls bench/gpu/*_bench.cc)

  compile() {  # source -> object, one line of log
    local src=$1 obj="$BUILD/obj/${1//\//_}.o" extra=() f
    if [[ $src == *.cu ]]; then
      for f in $NO_FMAD_CU; do [[ $src == kernels/cuda/$f ]] && extra=(--fmad=false); done
      "$NVCC" "${NVCCFLAGS[@]}" "${extra[@]}" -c "$src" -o "$obj" > "$obj.log" 2>&1
    else
      for f in $NO_CONTRACT_CC; do [[ $src == $f* ]] && extra=(-ffp-contract=off); done
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
  LINK=("$BUILD/libswarm_gpu.a" "${LIBDIRS[@]}" -lopenblas -lcudnn -lcublasLt -lcublas -lcudart -lgomp -lpthread -ldl -lrt)

  local t name b
  for t in $TESTS; do
    name=$(basename "$t" .cc)
    if ! g++ -fopenmp "$(obj $t)" "$(obj tests/doctest_main.cc)" "${LINK[@]}" -o "$BUILD/$name" > "$LOGS/$name.link.log" 2>&1; then
      say "LINK FAILED $name"; head -20 "$LOGS/$name.link.log"; failed=$((failed+1)); failed_names+=("$name"); continue
    fi
    if timeout 150 "$BUILD/$name" > "$LOGS/$name.log" 2>&1; then
      passed=$((passed+1)); say "PASSED $name ($(grep 'test cases' "$LOGS/$name.log" | tail -1 | tr -s ' '))"
      grep -m1 '^skipped:' "$LOGS/$name.log"
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

  if [ -f "$LOGS/gpt2_block_bench.log" ] && "$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "--- PyTorch, the same block (bf16, SDPA)"
    timeout 120 "$PYTHON" bench/torch_block.py --device cuda --dtype bf16 --d-model 768 --heads 12 --seq 1024 --batch 8 \
      --reps 10 | tee "$LOGS/torch_block.json"
    "$PYTHON" - "$LOGS/gpt2_block_bench.log" "$LOGS/torch_block.json" <<'PY'
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["tokens_per_s"]
torch = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["tokens_per_s"]
if ours > 0 and torch > 0:
    print(f"ratio block bf16: ours is {ours / torch:.2f}x the speed of PyTorch ({ours:.0f} vs {torch:.0f} tokens/s)")
PY
  fi
}

# ---------------------------------------------------------------------------
# The system: the carried `swarm` program on $DEVICE.
system_fail() { failed=$((failed+1)); failed_names+=("$1"); say "FAILED $1: $2"; }
left() { echo $(( START + BUDGET - $(date +%s) )); }
# A run's hard limit: its own, or what is left of the budget if that is less.
cap() { local want=$1 l; l=$(left); (( want < l )) && echo "$want" || echo "$(( l > 5 ? l : 5 ))"; }
# "step    20/100000 | loss 9.1234 | ..." lines: the first or last loss.
logged_loss() { grep -oE '^step +[0-9]+/[0-9]+ \| loss [0-9.naif]+' "$1" | awk '{print $NF}' | sed -n "$2"; }

system_checks() {
  echo "=== system: the swarm program on $DEVICE"
  local tarball=${SWARM_BUNDLE:-.gpu_deps/swarm-bundle.tar.xz}
  if [ ! -f "$tarball" ]; then
    say "system: SKIPPED: no $tarball (bench/gpu_deps.sh builds it where Bazel is, through bench/gpu_bundle.sh)"
    return 0
  fi
  if [ "$DEVICE" = cuda ] && ! nvidia-smi -L >/dev/null 2>&1; then
    say "system: SKIPPED: no CUDA device here (SWARM_GPU_CHECK_DEVICE=cpu runs this section on the CPU)"
    return 0
  fi
  local bundle="$BUILD/bundle/swarm-bundle"
  rm -rf "$BUILD/bundle" && mkdir -p "$BUILD/bundle" && tar -xJf "$tarball" -C "$BUILD/bundle" || {
    system_fail system-bundle "cannot unpack $tarball"; return 0; }
  local swarm="$bundle/bin/swarm"
  say "bundle: $(sed -n 1p "$bundle/MANIFEST")"
  # The bundle's libraries, then CUDA's: the toolkit's runtime and cuBLAS, and
  # cuDNN from the toolkit or PyTorch's wheel. libstdc++, libgcc_s and libgomp
  # are the machine's own unless they are older than the build machine's.
  SYS_LD="$bundle/lib:$CUDA_HOME/lib64${CUDNN_DIR:+:$CUDNN_DIR/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! LD_LIBRARY_PATH="$SYS_LD" "$swarm" --help > "$LOGS/swarm-help.log" 2>&1; then
    SYS_LD="$SYS_LD:$bundle/lib/gcc"
    say "system: the machine's C++ runtime is older than the bundle's ($(grep -m1 -o "version .* not found" "$LOGS/swarm-help.log" || echo "see $LOGS/swarm-help.log")): using the bundle's"
    if ! LD_LIBRARY_PATH="$SYS_LD" "$swarm" --help > "$LOGS/swarm-help.log" 2>&1; then
      system_fail system-start "swarm does not start"; cat "$LOGS/swarm-help.log" | head -20; return 0
    fi
  fi
  LD_LIBRARY_PATH="$SYS_LD" ldd "$swarm" > "$LOGS/swarm-ldd.log" 2>&1
  echo "swarm's libraries: $(grep -c "=> $bundle/" "$LOGS/swarm-ldd.log") from the bundle, $(grep -c "=> $CUDA_HOME\|=> ${CUDNN_DIR:-/nonexistent}" "$LOGS/swarm-ldd.log") from CUDA, $(grep -c "not found" "$LOGS/swarm-ldd.log") not found (ldd: $LOGS/swarm-ldd.log)"

  # The model, the batch and how long each run trains.
  local d layers heads seq batch precision torch_dtype ntok lr warmup local_extra=()
  local seconds=(${SWARM_GPU_CHECK_SECONDS:-})
  if [ "$DEVICE" = cuda ]; then
    d=768 layers=12 heads=12 seq=1024 batch=${SWARM_GPU_CHECK_BATCH:-8} precision=bf16 torch_dtype=bf16
    ntok=2000000 lr=6e-4 warmup=50
    ((${#seconds[@]} == 3)) || seconds=(60 40 60)
    # LAMB at 1e-2 (swarm local's default) suits the default tiny model; GPT-2 small wants
    # less. A global step every 64 sequences (8 microbatches) rather than 16, and 4
    # microbatches in flight so that the 4 peers sharing the GPU always have work.
    local_extra=(--lr 2e-3 --global-batch 64 --in-flight 4)
  else
    # A tiny model and a few dozen steps: a higher lr and a short warm-up, so the loss moves.
    d=64 layers=2 heads=2 seq=64 batch=${SWARM_GPU_CHECK_BATCH:-4} precision=fp32 torch_dtype=fp32
    ntok=500000 lr=3e-3 warmup=5
    ((${#seconds[@]} == 3)) || seconds=(15 15 15)
  fi
  # Start-up, validation and the data file take about this long beyond the runs.
  local overhead=$([ "$DEVICE" = cuda ] && echo 90 || echo 45)
  local want=$(( seconds[0] + seconds[1] + seconds[2] + overhead )) have
  have=$(left)
  if (( have < want )); then
    local scale_num=$(( have - overhead )) scale_den=$(( seconds[0] + seconds[1] + seconds[2] )) i
    if (( scale_num < 30 )); then
      say "system: SKIPPED: ${have}s left of the ${BUDGET}s budget, ${want}s wanted (SWARM_GPU_CHECK_SYSTEM_ONLY=1 runs only this)"
      return 0
    fi
    for i in 0 1 2; do seconds[$i]=$(( seconds[i] * scale_num / scale_den )); (( seconds[i] >= 10 )) || seconds[$i]=10; done
    say "system: ${have}s left of the ${BUDGET}s budget: runs shortened to ${seconds[*]} s (train, PyTorch, local)"
  fi

  # a) GPT-2 tokens: the given file, or a synthetic one that can be learned:
  # 4096 phrases of 64 tokens, each token drawn from a Zipf distribution over
  # the whole 50257-token vocabulary (frequent ids shuffled), the phrases then
  # repeated in random order. A model first learns the token frequencies (loss
  # falls from ln 50257 = 10.8 towards their entropy, printed), then the
  # phrases (every token after a phrase's first is predictable).
  local tokens=${SWARM_GPT2_TOKENS:-}
  if [ -z "$tokens" ]; then
    tokens="$BUILD/synthetic_gpt2_tokens.bin"
    local about
    about=$(python3 - "$tokens" "$ntok" <<'PY'
import array, itertools, math, random, struct, sys
path, count = sys.argv[1], int(sys.argv[2])
vocab, phrases, length = 50257, 4096, 64
rng = random.Random(20240520)
ids = list(range(vocab))
rng.shuffle(ids)
weights = [1.0 / (rank + 1) for rank in range(vocab)]
total = sum(weights)
entropy = -sum(w / total * math.log(w / total) for w in weights)
drawn = rng.choices(ids, cum_weights=list(itertools.accumulate(weights)), k=phrases * length)
table = [array.array("H", drawn[i * length:(i + 1) * length]) for i in range(phrases)]
tokens = array.array("H")
while len(tokens) < count:
    tokens.extend(table[rng.randrange(phrases)])
del tokens[count:]
if sys.byteorder != "little":
    tokens.byteswap()
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
    f.write(tokens.tobytes())
print(f"{count} tokens, {phrases} phrases of {length} Zipf-distributed GPT-2 ids, unigram entropy {entropy:.2f} nats")
PY
    ) || { system_fail system-data "cannot write $tokens"; return 0; }
    echo "tokens: $tokens (synthetic: $about)"
  else
    echo "tokens: $tokens (SWARM_GPT2_TOKENS)"
  fi
  local shape=(--d-model "$d" --layers "$layers" --heads "$heads" --seq-len "$seq")
  echo "model: GPT-2 shape d_model $d, $layers layers, $heads heads, seq $seq, vocab 50257, batch $batch; $DEVICE $precision"

  # b) swarm train. cuDNN's attention first, the hand-written flash kernel if cuDNN fails.
  local compute=(--device "$DEVICE" --precision "$precision") attention="" att tl rc
  local train_log="$LOGS/swarm_train.log"
  for att in $([ "$DEVICE" = cuda ] && echo "cudnn flash" || echo "none"); do
    local att_flags=(); [ "$att" = none ] || att_flags=(--attention "$att")
    tl=$(cap $(( seconds[0] + 60 )))
    say "swarm train ${compute[*]}${att_flags[*]:+ ${att_flags[*]}}: ${seconds[0]} s (hard limit ${tl} s)"
    timeout -k 10 "$tl" env LD_LIBRARY_PATH="$SYS_LD" "$swarm" \
      train "${compute[@]}" "${att_flags[@]}" "${shape[@]}" --batch "$batch" --data "$tokens" --gpt2-tokens \
      --steps 1000000 --lr "$lr" --warmup "$warmup" --time-limit "${seconds[0]}" --log-every 10 --eval-every 1000000 \
      --eval-windows 8 --sample-length 0 --metrics "$LOGS/swarm_train.$att.metrics.jsonl" \
      > "$LOGS/swarm_train.$att.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q '^validation loss:' "$LOGS/swarm_train.$att.log"; then attention=$att; break; fi
    say "swarm train with ${att} attention failed (rc $rc):"; tail -5 "$LOGS/swarm_train.$att.log"
  done
  local train_tps="" params=""
  if [ -z "$attention" ]; then
    system_fail swarm-train "see $LOGS/swarm_train.*.log"
  else
    cp "$LOGS/swarm_train.$attention.log" "$train_log"
    params=$(grep -m1 -oE '^model: [0-9]+ parameters' "$train_log" | awk '{print $2}')
    train_tps=$(grep '^validation loss:' "$train_log" | grep -oE '[0-9.]+ tokens/s' | awk '{print $1}')
    local first last
    first=$(logged_loss "$train_log" 1p); last=$(logged_loss "$train_log" '$p')
    echo "swarm train ($([ "$attention" = none ] && echo "default" || echo "$attention") attention): $(grep -m1 '^model:' "$train_log")"
    echo "swarm train: $(grep '^validation loss:' "$train_log")"
    echo "swarm train tokens/s: $train_tps"
    echo "swarm train first logged loss: $first, last logged loss: $last ($(grep -c '^step .*| loss' "$train_log") logged, every 10 steps)"
    # MFU. FLOPs per token: 6 per matmul parameter (forward 2, backward 4): every
    # parameter but the embedding lookups wte [V,d] and wpe [T,d] (the LM head is
    # untied, so it is a matmul of its own), plus causal attention, 6*L*T*d
    # (QK^T and AV are 2*T*d each per layer forward, halved by the causal mask,
    # tripled for forward and backward).
    local vals logged
    vals=$(grep '^validation loss:' "$train_log" | grep -oE '[0-9.naif]+ -> [0-9.naif]+' | tr -d '>-')
    logged=$(grep -c '^step .*| loss' "$train_log")
    "$PYTHON" - "$params" "$train_tps" "$d" "$layers" "$seq" "${SWARM_PEAK_FLOPS:-989e12}" "${first:-nan}" "${last:-nan}" \
      "$logged" $vals <<'PY'
import sys
n, tps, d, L, T, peak = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
V = 50257
matmul_params = n - V * d - T * d
per_token = 6 * matmul_params + 6 * L * T * d
print(f"swarm train MFU: {100 * tps * per_token / peak:.3g}% ({tps * per_token / 1e12:.2f} TFLOP/s of {peak / 1e12:.0f}; "
      f"{per_token / 1e9:.3f} GFLOP/token = 6 x {matmul_params} matmul parameters + 6 x {L} x {T} x {d} attention)")
first, last, logged = float(sys.argv[7]), float(sys.argv[8]), int(sys.argv[9])
what = "logged training loss"
if logged < 2:  # one progress line only (a short run): the validation losses instead
    first, last, what = float(sys.argv[10]), float(sys.argv[11]), "validation loss (fewer than 2 logged steps)"
fell = last < first
print(f"swarm train loss fell: {'yes' if fell else 'NO'} ({what} {first:.4f} -> {last:.4f})")
sys.exit(0 if fell else 1)
PY
    [ $? -eq 0 ] || system_fail swarm-train-loss "the logged loss did not fall"
  fi

  # c) PyTorch on the same model, batch and token file.
  local torch_tps=""
  if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    say "PyTorch: SKIPPED: $PYTHON has no torch (SWARM_GPU_PYTHON names another interpreter)"
  else
    tl=$(cap $(( seconds[1] + 60 )))
    say "PyTorch GPT ($torch_dtype, SDPA, eager): ${seconds[1]} s (hard limit ${tl} s)"
    local torch_threads=(); [ "$DEVICE" = cuda ] || torch_threads=(--threads "$JOBS")
    if timeout -k 10 "$tl" "$PYTHON" bench/torch_gpt.py --data "$tokens" --device "$DEVICE" --dtype "$torch_dtype" \
         --d-model "$d" --layers "$layers" --heads "$heads" --seq-len "$seq" --batch "$batch" --lr "$lr" \
         --warmup "$warmup" --seconds "${seconds[1]}" "${torch_threads[@]}" > "$LOGS/torch_gpt.json" 2> "$LOGS/torch_gpt.log"; then
      cat "$LOGS/torch_gpt.json"
      torch_tps=$("$PYTHON" -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["tokens_per_s"])' "$LOGS/torch_gpt.json")
      echo "PyTorch tokens/s: $torch_tps"
      "$PYTHON" - "$LOGS/torch_gpt.json" "$d" "$layers" "$seq" "${SWARM_PEAK_FLOPS:-989e12}" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
d, L, T, peak = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
per_token = 6 * (r["parameters"] - 50257 * d - T * d) + 6 * L * T * d  # the same count as swarm train's
print(f"PyTorch MFU: {100 * r['tokens_per_s'] * per_token / peak:.3g}%; {r['parameters']} parameters; "
      f"first logged loss {r['first_loss']}, last {r['last_loss']} ({r['steps']} steps)")
PY
      if [ -n "$train_tps" ]; then
        awk -v a="$train_tps" -v b="$torch_tps" 'BEGIN { if (b > 0) printf "ratio swarm train / PyTorch tokens/s: %.3f (%.0f vs %.0f)\n", a / b, a, b }'
      fi
    else
      system_fail torch-gpt "see $LOGS/torch_gpt.log"; tail -5 "$LOGS/torch_gpt.log"
    fi
  fi

  # d) swarm local: 2 stages x 2 peer processes over ZeroMQ on loopback, one trainer,
  # the same model shape and microbatch as above. Peers stay on their stage
  # (--rebalance-period 0) and write no checkpoints, so the run measures training.
  local run_dir="$BUILD/swarm-local-run" local_log="$LOGS/swarm_local.log"
  local local_att=(); [ -n "$attention" ] && [ "$attention" != none ] && local_att=(--attention "$attention")
  rm -rf "$run_dir"
  tl=$(cap $(( seconds[2] + 90 )))
  say "swarm local --stages 2 --peers-per-stage 2 ${compute[*]}${local_att[*]:+ ${local_att[*]}}: ${seconds[2]} s (hard limit ${tl} s)"
  timeout -k 15 "$tl" env LD_LIBRARY_PATH="$SYS_LD" "$swarm" \
    local "${compute[@]}" "${local_att[@]}" --stages 2 --peers-per-stage 2 "${shape[@]}" \
    --microbatch "$batch" --data "$tokens" --gpt2-tokens --steps 1000000 --time-limit "${seconds[2]}" \
    --eval-windows 8 --checkpoint-every 0 --rebalance-period 0 "${local_extra[@]}" ${SWARM_GPU_LOCAL_ARGS:-} \
    --run-dir "$run_dir" \
    > "$local_log" 2>&1
  rc=$?
  mkdir -p "$LOGS/swarm-local-run"
  cp -r "$run_dir"/*.json* "$run_dir"/peers "$LOGS/swarm-local-run/" 2>/dev/null
  if [ $rc -ne 0 ] || ! grep -q '^done:' "$local_log"; then
    system_fail swarm-local "rc $rc; see $local_log and $LOGS/swarm-local-run/peers"; tail -8 "$local_log"
  else
    local local_tps mismatches
    local_tps=$(grep '^done:' "$local_log" | grep -oE '[0-9.]+ tokens/s' | awk '{print $1}')
    echo "swarm local: $(grep '^done:' "$local_log")"
    echo "swarm local: $(grep '^stages:' "$local_log")"
    echo "swarm local: $(grep '^ledger:' "$local_log")"
    echo "swarm local tokens/s: $local_tps"
    [ -n "$train_tps" ] && awk -v a="$local_tps" -v b="$train_tps" \
      'BEGIN { if (b > 0) printf "ratio swarm local / swarm train tokens/s: %.3f (%.0f vs %.0f)\n", a / b, a, b }'
    mismatches=$(grep '^stages:' "$local_log" | grep -oE 'differing parameter hashes: [0-9]+' | awk '{print $NF}')
    [ "${mismatches:-1}" = 0 ] || system_fail swarm-local-replicas "replicas with differing parameter hashes: ${mismatches:-?}"
  fi
}

if [ "$SYSTEM_ONLY" = 1 ]; then
  say "SWARM_GPU_CHECK_SYSTEM_ONLY=1: no kernel build, tests or benchmarks"
else
  kernel_checks
fi
system_checks

say "done: $passed passed, $failed failed ${failed_names[*]:-}; compile failures: $COMPILE_FAILURES"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$COMPILE_FAILURES" -eq 0 ]
