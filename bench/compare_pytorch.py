#!/usr/bin/env python3
"""ckcheck's checkpoint against PyTorch's torch.utils.checkpoint, on the same transformer.

Both run on the same LibTorch (Debian's python3-torch is the libtorch-dev build), the same
architecture and size, the same seed and thread count; memory is measured the same way in both
(ckcheck's tracking CPU allocator, loaded into Python from libckcheck_pymemory.so). Reported as
ratios from one run:

    python3 bench/compare_pytorch.py --ckcheck build/ckcheck \\
        --pymemory build/bench/libckcheck_pymemory.so --layers 4 --hidden 256 --heads 8 --seq 128 --batch 8
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Attention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.ln(x)).view(b, s, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        probs = self.attn_drop(torch.softmax(scores, -1))
        y = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, h)
        return self.resid_drop(self.proj(y))


class FeedForward(nn.Module):
    def __init__(self, hidden, dropout):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x)))))


class Block(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.attn = Attention(hidden, heads, dropout)
        self.ffn = FeedForward(hidden, dropout)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.ffn(x)


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Parameter(torch.randn(a.seq, a.hidden) * 0.02)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads, a.dropout) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.hidden)
        self.head = nn.Linear(a.hidden, a.vocab)

    def forward(self, ids, checkpointed):
        x = self.embed(ids) + self.pos
        for block in self.blocks:
            x = checkpoint(block, x) if checkpointed else block(x)
        return self.head(self.ln_f(x))


def measure_python(a, checkpointed):
    torch.manual_seed(a.seed)
    model = Transformer(a).train()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # gradients live across steps, as in ckcheck bench
    ids = torch.randint(a.vocab, (a.batch, a.seq))
    mem = torch.ops.ckcheck_memory
    upstream = None
    times, peak = [], 0
    for i in range(a.warmup + a.steps):
        for p in model.parameters():
            p.grad.zero_()
        mem.reset_peak()
        before = mem.current_bytes()
        t0 = time.perf_counter()
        out = model(ids, checkpointed)
        if upstream is None:
            upstream = torch.randn(out.shape)
        out.backward(upstream)
        elapsed = time.perf_counter() - t0
        del out
        if i >= a.warmup:
            times.append(elapsed)
            peak = max(peak, mem.peak_bytes() - before)
    return statistics.median(times), peak


def measure_ckcheck(a):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.json")
        cmd = [a.ckcheck, "bench", "--model", "transformer", "--layers", str(a.layers), "--hidden", str(a.hidden),
               "--heads", str(a.heads), "--seq", str(a.seq), "--batch", str(a.batch), "--vocab", str(a.vocab),
               "--dropout", str(a.dropout), "--seed", str(a.seed), "--policies", "none,every:1",
               "--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads),
               "--report", "json=" + path]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            report = json.load(f)
    by = {p["policy"]: p for p in report["policies"]}
    return {k: (by[k]["time_median_s"], by[k]["peak_bytes"]) for k in ("none", "every:1")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckcheck", required=True, help="the ckcheck binary")
    p.add_argument("--pymemory", required=True, help="libckcheck_pymemory.so")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args()
    torch.ops.load_library(a.pymemory)
    torch.set_num_threads(a.threads)

    cpp = measure_ckcheck(a)
    py = {"none": measure_python(a, False), "every:1": measure_python(a, True)}
    mib = 1 << 20

    def row(name, c, q, fmt):
        return f"| {name} | {fmt(c)} | {fmt(q)} | {c / q:.2f} |"

    ms = lambda s: f"{s * 1e3:.1f} ms"
    mb = lambda b: f"{b / mib:.1f} MiB"
    ratio = lambda x: f"{x:.2f}"
    print(f"transformer: {a.layers} layers, hidden {a.hidden}, {a.heads} heads, seq {a.seq}, batch {a.batch}; "
          f"torch {torch.__version__}, {a.threads} threads, median of {a.steps} steps after {a.warmup}")
    print()
    print("| | ckcheck::checkpoint (C++) | torch.utils.checkpoint (Python) | C++ / Python |")
    print("|---|---|---|---|")
    print(row("step time, none", cpp["none"][0], py["none"][0], ms))
    print(row("step time, every:1", cpp["every:1"][0], py["every:1"][0], ms))
    print(row("every:1 / none, time", cpp["every:1"][0] / cpp["none"][0], py["every:1"][0] / py["none"][0], ratio))
    print(row("peak above baseline, none", cpp["none"][1], py["none"][1], mb))
    print(row("peak above baseline, every:1", cpp["every:1"][1], py["every:1"][1], mb))
    print(row("every:1 / none, peak", cpp["every:1"][1] / cpp["none"][1], py["every:1"][1] / py["none"][1], ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
