#!/usr/bin/env bash
# One GPT block (d_model 512, 8 heads, seq 256, batch 4, fp32) forward+backward:
# swarm's CPU backend beside PyTorch on the CPU, at 1 and 2 threads, in one run.
# PyTorch comes from PyPI into a venv under ~/.cache; without it, this prints
# our numbers and says why the comparison was skipped.
set -uo pipefail

block_bench="$1"
torch_script="$2"
home_dir=$(getent passwd "$(id -un)" | cut -d: -f6)
venv="${SWARM_BENCH_VENV:-$home_dir/.cache/swarm-bench-venv}"

torch_python=""
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch" 2>/dev/null; then
  torch_python="$venv/bin/python"
else
  echo "setting up PyTorch from PyPI in $venv (once)..."
  if python3 -m venv "$venv" && "$venv/bin/pip" install -q torch numpy; then
    torch_python="$venv/bin/python"
  else
    echo "skipped: PyTorch comparison (could not install torch from PyPI into $venv)"
  fi
fi

ratio() {  # ours theirs key
  python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); print(f'{a[sys.argv[3]] / b[sys.argv[3]]:.3f}')" "$1" "$2" "$3"
}

for threads in 1 2; do
  ours=$("$block_bench" --threads "$threads")
  echo "swarm   $ours"
  if [ -n "$torch_python" ]; then
    theirs=$(OMP_NUM_THREADS=$threads "$torch_python" "$torch_script" --threads "$threads")
    echo "pytorch $theirs"
    echo "ratio block fwd+bwd tokens/s, ${threads} thread(s): swarm is $(ratio "$ours" "$theirs" tokens_per_s)x PyTorch"
    echo "ratio MLP GEMM GFLOP/s, ${threads} thread(s): swarm is $(ratio "$ours" "$theirs" gemm_gflops)x PyTorch"
    python3 -c "import json,sys; b=json.loads(sys.argv[1]); a=json.loads(sys.argv[2]); print(f'ratio PyTorch block against the fp32 FLOP limit, {a[\"threads\"]} thread(s): {b[\"tokens_per_s\"]/a[\"roofline_tokens_per_s\"]:.3f}')" "$theirs" "$ours"
  fi
  python3 -c "import json,sys; a=json.loads(sys.argv[1]); print(f'ratio swarm block against the fp32 FLOP limit, {a[\"threads\"]} thread(s): {a[\"tokens_per_s\"]/a[\"roofline_tokens_per_s\"]:.3f} ({a[\"tokens_per_s\"]} of at most {a[\"roofline_tokens_per_s\"]} tokens/s at the GEMM rate measured in this run)')" "$ours"
  python3 -c "import json,sys; a=json.loads(sys.argv[1]); print(f'ratio MLP GEMM GFLOP/s, {a[\"threads\"]} thread(s): swarm matmul is {a[\"gemm_gflops\"]/a[\"eigen_gemm_gflops\"]:.3f}x a plain Eigen GEMM ({a[\"gemm_gflops\"]} vs {a[\"eigen_gemm_gflops\"]} GFLOP/s)')" "$ours"
done
