"""The same GPT block as bench/block_bench.cc, forward + backward, in PyTorch on the CPU.

Pre-LayerNorm, causal multi-head attention, 4x GELU(tanh) MLP, fp32. Prints one
JSON object in block_bench's format so the two can be compared line by line.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    block = Block(args.d_model, args.heads)
    x = torch.randn(args.batch, args.seq, args.d_model, requires_grad=True)
    grad = torch.randn_like(x) * 1e-3

    def step():
        block.zero_grad(set_to_none=False)
        x.grad = None
        block(x).backward(grad)

    step()
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)

    n, c, oc = args.batch * args.seq, args.d_model, 4 * args.d_model
    a, w = torch.randn(n, c), torch.randn(oc, c)
    F.linear(a, w)
    gemm = []
    for _ in range(args.reps):
        start = time.perf_counter()
        F.linear(a, w)
        gemm.append(time.perf_counter() - start)
    print(json.dumps({
        "threads": args.threads,
        "tokens_per_s": round(n / seconds, 1),
        "block_ms": round(seconds * 1e3, 3),
        "gemm_gflops": round(2.0 * n * c * oc / statistics.median(gemm) / 1e9, 2),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
