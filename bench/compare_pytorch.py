#!/usr/bin/env python3
"""ckcheck's checkpoint against PyTorch's, on the same transformer, in one process.

Six ways to run a training step (forward and backward) of the same architecture, size, seed and
thread count:

  ckcheck none            ckcheck's C++ transformer fixture, nothing checkpointed
  ckcheck every:1         ... every block under ckcheck::checkpoint
  torch none              the same model written in Python, nothing checkpointed
  torch reentrant         every block under torch.utils.checkpoint(use_reentrant=True)
  torch non-reentrant     every block under torch.utils.checkpoint(use_reentrant=False)
  torch SAC               non-reentrant, selective: the attention matmuls (aten.bmm) are saved,
                          everything else recomputed (create_selective_checkpoint_contexts)

ckcheck's step runs in this process through torch.ops.ckcheck_bench (libckcheck_pymemory.so), on
the LibTorch of the imported torch; memory is measured the same way on both sides (ckcheck's
tracking CPU allocator). After a warm-up of each, the measured steps run round-robin, one step of
each way per round, in an order rotated every round, so that every way sees the same slice of the
machine's load. Time ratios are paired per round and given with a 95% bootstrap interval.

    .venv/bin/python bench/compare_pytorch.py --pymemory build/bench/libckcheck_pymemory.so
"""
import argparse
import functools
import math
import os
import random
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


# The transformer block of ckcheck's fixture, written in Python (fixtures/python/twins.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "python"))
from twins import Block  # noqa: E402


def save_attention_matmuls(ctx, op, *args, **kwargs):
    """SAC policy: keep the outputs of attention's batched matmuls, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.bmm.default else CheckpointPolicy.PREFER_RECOMPUTE


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Parameter(torch.randn(a.seq, a.hidden) * 0.02)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads, a.dropout) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.hidden)
        self.head = nn.Linear(a.hidden, a.vocab)

    def forward(self, ids, mode):
        x = self.embed(ids) + self.pos
        for block in self.blocks:
            if mode == "none":
                x = block(x)
            elif mode == "reentrant":
                x = checkpoint(block, x, use_reentrant=True)
            elif mode == "non-reentrant":
                x = checkpoint(block, x, use_reentrant=False)
            else:
                context = functools.partial(create_selective_checkpoint_contexts, save_attention_matmuls)
                x = checkpoint(block, x, use_reentrant=False, context_fn=context)
        return self.head(self.ln_f(x))


class TorchSide:
    """The Python model; one call is one training step, returning (seconds, peak bytes)."""

    def __init__(self, a):
        torch.manual_seed(a.seed)
        self.model = Transformer(a).train()
        self.ids = torch.randint(a.vocab, (a.batch, a.seq))
        self.upstream = None

    def step(self, mode):
        mem = torch.ops.ckcheck_memory
        params = list(self.model.parameters())
        for p in params:
            p.grad = torch.zeros_like(p)  # gradients live across steps, as in ckcheck bench
        mem.reset_peak()
        before = mem.current_bytes()
        t0 = time.perf_counter()
        out = self.model(self.ids, mode)
        if self.upstream is None:
            self.upstream = torch.randn(out.shape)
        # A copy made in the step, as ckcheck's runner makes its outputs' gradient in every step
        # (as a loss's backward would): both peaks hold it.
        out.backward(self.upstream.clone())
        elapsed = time.perf_counter() - t0
        peak = mem.peak_bytes() - before
        del out
        for p in params:
            p.grad = None
        return elapsed, peak


def paired_ratio(num, den, resamples=2000, seed=0):
    """Geometric mean of per-round ratios num[i]/den[i], with a 95% bootstrap interval."""
    logs = [math.log(n / d) for n, d in zip(num, den)]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pymemory", required=True, help="build/bench/libckcheck_pymemory.so")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=10, help="measured steps of each way, interleaved")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps of each way first")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args()
    if a.rounds < 2 or a.warmup < 0 or a.threads < 1:
        p.error("--rounds must be at least 2, --warmup at least 0, --threads at least 1")
    torch.ops.load_library(a.pymemory)
    torch.set_num_threads(a.threads)

    session = torch.ops.ckcheck_bench.make_transformer(a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab,
                                                      a.dropout, a.seed)
    py = TorchSide(a)
    ways = {
        "ckcheck none": lambda: torch.ops.ckcheck_bench.step(session, "none"),
        "ckcheck every:1": lambda: torch.ops.ckcheck_bench.step(session, "every:1"),
        "torch none": lambda: py.step("none"),
        "torch reentrant": lambda: py.step("reentrant"),
        "torch non-reentrant": lambda: py.step("non-reentrant"),
        "torch SAC (attention matmuls saved)": lambda: py.step("sac"),
    }
    names = list(ways)
    for name in names:
        for _ in range(a.warmup):
            ways[name]()
    times = {n: [] for n in names}
    peaks = {n: 0 for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            seconds, peak = ways[name]()
            times[name].append(seconds)
            peaks[name] = max(peaks[name], peak)

    mib = float(1 << 20)
    print(f"transformer: {a.layers} layers, hidden {a.hidden}, {a.heads} heads, seq {a.seq}, batch {a.batch}, "
          f"dropout {a.dropout}; torch {torch.__version__}, {a.threads} threads; {a.rounds} rounds interleaved "
          f"after {a.warmup} warm-up steps each; wall-clock time (time.perf_counter), peak CPU bytes above the "
          f"step's start (ckcheck's tracking allocator)")
    print()
    print("| way | median step | time / its side's none [95% CI] | peak memory | peak / its side's none |")
    print("|---|---|---|---|---|")
    for name in names:
        base = "ckcheck none" if name.startswith("ckcheck") else "torch none"
        ratio, low, high = paired_ratio(times[name], times[base])
        print(f"| {name} | {statistics.median(times[name]) * 1e3:.1f} ms | {ratio:.2f} [{low:.2f}, {high:.2f}] | "
              f"{peaks[name] / mib:.1f} MiB | {peaks[name] / peaks[base]:.2f} |")
    print()
    print("| ckcheck every:1 against | time ratio [95% CI] | peak ratio |")
    print("|---|---|---|")
    for other in ("torch reentrant", "torch non-reentrant", "torch SAC (attention matmuls saved)"):
        ratio, low, high = paired_ratio(times["ckcheck every:1"], times[other])
        print(f"| {other} | {ratio:.2f} [{low:.2f}, {high:.2f}] | {peaks['ckcheck every:1'] / peaks[other]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
