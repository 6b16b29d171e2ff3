"""One GPT block forward+backward, swarm's CPU backend against PyTorch, at the
shapes and thread counts of issue 16, in one run.

For every (shape, threads) the two programs alternate for --rounds rounds, each
printing the median of its own repeats; the ratio is PyTorch's median time over
ours (above 1: swarm is faster). Alternating, rather than running one program
through every shape and then the other, spreads this shared machine's noise
over both sides.

  python3 block_vs_pytorch.py --block-bench BIN --torch-python PY --torch-script torch_block.py
"""
import argparse
import json
import statistics
import subprocess
import os

SHAPES = [(512, 8, 256, 4), (768, 12, 512, 2), (256, 4, 128, 16), (128, 4, 128, 16)]


def run_json(command, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def shape_args(shape, threads, reps):
    d, heads, seq, batch = shape
    return ["--threads", str(threads), "--d-model", str(d), "--heads", str(heads), "--seq", str(seq),
            "--batch", str(batch), "--reps", str(reps)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-bench", required=True)
    parser.add_argument("--torch-python", default="")
    parser.add_argument("--torch-script", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()

    rows = []
    for shape in SHAPES:
        for threads in (1, 2):
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(run_json([args.block_bench] + shape_args(shape, threads, args.reps), threads))
                if args.torch_python:
                    theirs.append(run_json([args.torch_python, args.torch_script] +
                                           shape_args(shape, threads, args.reps), threads))
            row = {"shape": shape, "threads": threads,
                   "ours_ms": statistics.median(r["block_ms"] for r in ours),
                   "gemm_gflops": statistics.median(r["gemm_gflops"] for r in ours),
                   "eigen_gemm_gflops": statistics.median(r["eigen_gemm_gflops"] for r in ours),
                   "roofline_tokens_per_s": statistics.median(r["roofline_tokens_per_s"] for r in ours)}
            tokens = shape[2] * shape[3]
            row["ours_tokens_per_s"] = tokens / row["ours_ms"] * 1e3
            if theirs:
                row["torch_ms"] = statistics.median(r["block_ms"] for r in theirs)
                row["torch_gemm_gflops"] = statistics.median(r["gemm_gflops"] for r in theirs)
                row["ratio"] = row["torch_ms"] / row["ours_ms"]
                row["torch"] = theirs[0]["torch"]
            rows.append(row)
            print(json.dumps(row), flush=True)

    print()
    print("| shape (d, heads, T, B) | threads | swarm ms | PyTorch ms | swarm / PyTorch speed |"
          " swarm GEMM GFLOP/s | Eigen GEMM GFLOP/s | swarm vs fp32 FLOP limit |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        torch_ms = f"{r['torch_ms']:.1f}" if "torch_ms" in r else "-"
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        limit = r["ours_tokens_per_s"] / r["roofline_tokens_per_s"]
        print(f"| {', '.join(map(str, r['shape']))} | {r['threads']} | {r['ours_ms']:.1f} | {torch_ms} | {ratio} |"
              f" {r['gemm_gflops']:.0f} | {r['eigen_gemm_gflops']:.0f} | {limit:.2f} |")
    print()
    for r in rows:
        shape = ", ".join(map(str, r["shape"]))
        if "ratio" in r:
            print(f"ratio block fwd+bwd, ({shape}), {r['threads']} thread(s): swarm is {r['ratio']:.3f}x PyTorch")
        print(f"ratio swarm GEMM against plain Eigen, ({shape}), {r['threads']} thread(s): "
              f"{r['gemm_gflops'] / r['eigen_gemm_gflops']:.3f}")
    ratios = [r for r in rows if "ratio" in r]
    if ratios:
        worst = min(ratios, key=lambda r: r["ratio"])
        print(f"slowest: swarm is {worst['ratio']:.3f}x PyTorch at ({', '.join(map(str, worst['shape']))}), "
              f"{worst['threads']} thread(s); PyTorch {worst['torch']}, {args.rounds} alternating rounds of "
              f"{args.reps} repeats")


if __name__ == "__main__":
    main()
