#!/usr/bin/env python3
"""How stable `ckcheck bench` is on a busy machine: the same command N times with nothing else
running, then N times beside a competing CPU-bound process that starts and stops at random.
Prints how often the recommendation changed, each policy's time ratio (x none) over the runs with
its spread, and whether any policy that does more work than none was ever reported faster than
none beyond the noise.

    python3 scripts/bench_stability.py --ckcheck build/ckcheck --runs 5 -- --model transformer --layers 4 ...
"""
import argparse
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def burn(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x = (x * 1103515245 + 12345) % 2147483648
    return x


class Competitor:
    """A CPU-bound process that starts and stops at random (busy 0.5-3 s, idle 0.5-3 s)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.busy_seconds = 0.0

    def loop(self):
        while not self.stop.is_set():
            busy = self.rng.uniform(0.5, 3.0)
            proc = multiprocessing.Process(target=burn, args=(busy,))
            proc.start()
            proc.join()
            self.busy_seconds += busy
            self.stop.wait(self.rng.uniform(0.5, 3.0))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def run_once(ckcheck, bench_args, keep=None):
    with tempfile.TemporaryDirectory() as tmp:
        path = keep or os.path.join(tmp, "bench.json")
        cmd = [ckcheck, "bench", *bench_args, "--report", "json=" + path]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckcheck", required=True)
    p.add_argument("--runs", type=int, default=5, help="runs in each condition")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", help="folder to keep each run's JSON report in")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then the arguments of ckcheck bench")
    a = p.parse_args()
    bench_args = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args
    reports = []
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
    for condition in ("quiet", "loaded"):
        for i in range(a.runs):
            t0 = time.monotonic()
            keep = os.path.join(a.keep, f"{condition}-{i + 1}.json") if a.keep else None
            if condition == "quiet":
                r = run_once(a.ckcheck, bench_args, keep)
                busy = 0.0
            else:
                with Competitor(a.seed * 1000 + i) as c:
                    r = run_once(a.ckcheck, bench_args, keep)
                busy = c.busy_seconds
            took = time.monotonic() - t0
            reports.append((condition, r))
            print(f"{condition} run {i + 1}: recommendation {r['recommendation']} "
                  f"({took:.0f} s, {r['rounds']} rounds, competitor busy {busy:.0f} s)", flush=True)

    recs = [r["recommendation"] for _, r in reports]
    changes = sum(1 for x, y in zip(recs, recs[1:]) if x != y)
    distinct = sorted({str(x) for x in recs})
    print()
    print(f"recommendation: {len(distinct)} distinct over {len(recs)} runs ({', '.join(distinct)}); "
          f"changed {changes} times from one run to the next")
    faster = []
    print("| policy | time x none, quiet (mean; min..max) | time x none, loaded (mean; min..max) | widest 95% interval |")
    print("|---|---|---|---|")
    names = [pol["policy"] for pol in reports[0][1]["policies"] if pol.get("time_ratio") is not None]
    for name in names:
        cells, widest = [], 0.0
        for condition in ("quiet", "loaded"):
            ratios = []
            for cond, r in reports:
                for pol in r["policies"]:
                    if pol["policy"] != name or pol.get("time_ratio") is None or cond != condition:
                        continue
                    ratios.append(pol["time_ratio"])
                    widest = max(widest, pol["time_ratio_high"] - pol["time_ratio_low"])
                    if pol["checkpointed"] and pol["time_ratio_high"] < 1.0:
                        faster.append(f"{name} ({condition})")
            cells.append(f"{statistics.fmean(ratios):.2f}; {min(ratios):.2f}..{max(ratios):.2f}" if ratios else "-")
        print(f"| {name} | {cells[0]} | {cells[1]} | {widest:.2f} |")
    noisy = sum(1 for _, r in reports if r.get("too_noisy"))
    print()
    print(f"reported faster than none beyond the noise: {', '.join(faster) if faster else 'never'}; "
          f"runs that withheld the time verdict as too noisy: {noisy}")
    target = len(distinct) == 1 and not faster
    print(f"target (one recommendation in all runs, no policy faster than none): {'met' if target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
