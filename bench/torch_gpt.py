"""The GPT that `swarm train` trains, trained in PyTorch on the same token file.

The PyTorch side of bench/gpu_check.sh's system section: the same model as
models/gpt (token + position embeddings, pre-LayerNorm blocks like
bench/torch_block.py's Block, final LayerNorm, an untied LM head without bias:
swarm's lm_head.weight is its own [vocab, d_model] tensor, not wte), the same
initialisation (normal 0.02, wpe 0.01, residual projections 0.02/sqrt(2L)),
and the same optimizer as swarm train's default (AdamW, betas 0.9/0.95, eps
1e-6, weight decay 0.01 on matrices only, clipping at 1.0, linear warm-up).
With --dtype bf16 the weights stay fp32 and autocast computes in bf16, as
swarm's CudaBf16Backend keeps fp32 masters and computes in bf16. Attention is
SDPA, causal. Batches are random windows of an llm.c .bin token file (header
of 256 int32: magic 20240520, version 1, token count; then uint16 tokens).

Trains for --seconds of wall time and prints one JSON object: tokens_per_s
over the steps after --warmup-steps (cuBLAS and SDPA set themselves up in the
first ones), tokens_per_s_all over every step, and the first and last logged
losses. Every step reads its loss back (loss.item()), as swarm train does.

  python bench/torch_gpt.py --data tokens.bin --device cuda --dtype bf16 \\
      --d-model 768 --layers 12 --heads 12 --seq-len 1024 --batch 8 --seconds 40
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_block import Block  # noqa: E402  (the block bench/gpu_check.sh already compares)

GPT2_MAGIC, GPT2_VERSION, GPT2_VOCAB = 20240520, 1, 50257


def load_tokens(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != GPT2_MAGIC or header[1] != GPT2_VERSION:
            raise SystemExit(f"{path}: not an llm.c version-1 token file (magic {header[0]}, version {header[1]})")
        count = header[2]
        data = bytearray(f.read(2 * count))
    if len(data) != 2 * count:
        raise SystemExit(f"{path}: header says {count} tokens, file holds {len(data) // 2}")
    # uint16 through int16 (torch's uint16 support is partial): mask back to 0..65535.
    tokens = torch.frombuffer(data, dtype=torch.int16).to(torch.int32) & 0xFFFF
    if int(tokens.max()) >= GPT2_VOCAB:
        raise SystemExit(f"{path}: token {int(tokens.max())} is outside GPT-2's vocabulary")
    return tokens


class GPT(nn.Module):
    def __init__(self, vocab, seq_len, d_model, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)  # untied, as in models/gpt
        residual_std = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name == "wpe.weight":
                nn.init.normal_(p, std=0.01)
            elif name.endswith("proj.weight"):  # attention proj and MLP fc_proj
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="llm.c .bin file of GPT-2 tokens")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--max-steps", type=int, default=1 << 30)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--warmup", type=int, default=50, help="linear lr warm-up steps")
    parser.add_argument("--warmup-steps", type=int, default=3, help="steps left out of tokens_per_s")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (off: eager)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    tokens = load_tokens(args.data).to(device)
    model = GPT(GPT2_VOCAB, args.seq_len, args.d_model, args.layers, args.heads).to(device)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-6, fused=cuda)
    step_fn = torch.compile(model) if args.compile else model
    window = torch.arange(args.seq_len + 1, device=device)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    losses, logged = [], []
    step, timed_tokens, timed_seconds, all_seconds = 0, 0, 0.0, 0.0
    started = time.perf_counter()
    while step < args.max_steps and time.perf_counter() - started < args.seconds:
        t0 = time.perf_counter()
        offsets = torch.randint(0, tokens.numel() - args.seq_len - 1, (args.batch, 1), device=device)
        chunk = tokens[offsets + window].long()
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / max(1, args.warmup))
        with autocast:
            loss = step_fn(chunk[:, :-1], chunk[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())  # synchronizes, as swarm train reads each step's loss
        sync()
        seconds = time.perf_counter() - t0
        step += 1
        all_seconds += seconds
        if step > args.warmup_steps:
            timed_seconds += seconds
            timed_tokens += args.batch * args.seq_len
        if step % args.log_every == 0:
            mean = sum(losses[-args.log_every:]) / args.log_every
            logged.append(mean)
            print(f"torch step {step} | loss {mean:.4f} | {step * args.batch * args.seq_len / all_seconds:.0f} tok/s",
                  file=sys.stderr, flush=True)
    if not logged and losses:
        logged.append(sum(losses) / len(losses))
    print(json.dumps({
        "tokens_per_s": round(timed_tokens / timed_seconds, 1) if timed_seconds > 0 else 0.0,
        "tokens_per_s_all": round(step * args.batch * args.seq_len / all_seconds, 1) if all_seconds > 0 else 0.0,
        "steps": step,
        "first_loss": round(logged[0], 4) if logged else None,
        "last_loss": round(logged[-1], 4) if logged else None,
        "parameters": params,
        "seconds": round(time.perf_counter() - started, 1),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "dtype": args.dtype,
        "compiled": args.compile,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
