"""The same GPT block as bench/block_bench.cc, forward + backward, in PyTorch.

Pre-LayerNorm, causal multi-head attention, 4x GELU(tanh) MLP. On the CPU in
fp32 (beside block_bench), or with --device cuda --dtype bf16 on a GPU (beside
bench/gpu/gpt2_block_bench, as bench/gpu_check.sh runs them). Prints one JSON
object so the two can be compared line by line.
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
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    block = Block(args.d_model, args.heads).to(device=device, dtype=dtype)
    x = torch.randn(args.batch, args.seq, args.d_model, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x) * 1e-3

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step():
        block.zero_grad(set_to_none=False)
        x.grad = None
        block(x).backward(grad)

    step()
    sync()
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)

    n, c, oc = args.batch * args.seq, args.d_model, 4 * args.d_model
    a, w = torch.randn(n, c, device=device, dtype=dtype), torch.randn(oc, c, device=device, dtype=dtype)
    F.linear(a, w)
    sync()
    gemm = []
    for _ in range(args.reps):
        start = time.perf_counter()
        F.linear(a, w)
        sync()
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
