#!/usr/bin/env bash
# One GPT block forward+backward: swarm's CPU backend beside PyTorch on the CPU,
# at issue 16's four shapes and 1 and 2 threads, alternating shape by shape in
# one run (block_vs_pytorch.py). PyTorch comes from PyPI into a venv under
# ~/.cache; without it, this prints our numbers and says why the comparison
# was skipped.
#   block_vs_pytorch.sh BLOCK_BENCH TORCH_SCRIPT ORCHESTRATOR [--rounds N] [--reps N]
set -uo pipefail

block_bench="$1"
torch_script="$2"
orchestrator="$3"
shift 3
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

exec python3 "$orchestrator" --block-bench "$block_bench" --torch-python "$torch_python" \
  --torch-script "$torch_script" "$@"
