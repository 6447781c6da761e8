#!/usr/bin/env python3
"""The checkpoint machinery's cost per call, in instructions: each benchmark pair of
bench/checkpoint_bench.cpp run under callgrind, its steps counted, the pair's difference printed.

Instructions do not swing with the load of a shared machine as wall-clock time does, so they are
how a change to the machinery is judged here; wall-clock time comes from the benchmark itself
(`ckcheck_bench_checkpoint --benchmark_repetitions=15 --benchmark_enable_random_interleaving=true`).

    python3 scripts/machinery_instructions.py [--bench build/bench/ckcheck_bench_checkpoint]

Needs valgrind (Debian: apt-get install valgrind). Takes about 4 minutes.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# (checkpointed, its plain counterpart): the difference is the machinery of one call.
PAIRS = [("Checkpoint", "PlainTwoForwards"), ("CheckpointFrozen", "PlainTwoForwardsFrozen")]
# Called once in every step of every benchmark: the steps are counted by its calls.
ONCE_PER_STEP = "at::Tensor::_backward("


def fail(message):
    print(f"machinery_instructions: {message}", file=sys.stderr)
    sys.exit(2)


def read_counts(out_file):
    """From one pass over a callgrind file: the total instructions and the calls of ONCE_PER_STEP."""
    names, calls, target, total = {}, 0, None, None
    with open(out_file) as f:
        for line in f:
            m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
            if m:
                kind, ident, name = m.groups()
                if name:
                    names[ident] = name.strip()
                target = ident if kind == "cfn" else None
                continue
            if total is None and line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
            m = re.match(r"calls=(\d+)", line)
            if m and target is not None and names.get(target, "").startswith(ONCE_PER_STEP):
                calls += int(m.group(1))
            target = None if m else target
    return total, calls


def setup_cost(out_file):
    """The inclusive cost of the benchmark's one-time setup."""
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out_file],
                               capture_output=True, text=True, check=True).stdout
    for line in annotated.splitlines():
        if "Setup::Setup" in line:
            return int(line.split()[0].replace(",", ""))
    return 0


def per_step(bench, name, workdir):
    out_file = os.path.join(workdir, f"{name}.callgrind")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
           f"--toggle-collect=(anonymous namespace)::{name}(benchmark::State&)", bench,
           f"--benchmark_filter=^{name}/8$", "--benchmark_min_time=1"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no message"])[-1]
        fail(f"{name}: callgrind exited {run.returncode}: {last}")
    total, steps = read_counts(out_file)
    setup = setup_cost(out_file)
    if total is None or steps == 0:
        fail(f"{name}: no steps counted in {out_file}")
    return (total - setup) / steps, steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", default=os.path.join(os.environ.get("CKCHECK_BUILD_DIR", "build"), "bench",
                                                        "ckcheck_bench_checkpoint"),
                        help="the benchmark binary (default: build/bench/ckcheck_bench_checkpoint)")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            fail(f"{tool} not found; install valgrind (Debian: apt-get install valgrind)")
    if not os.access(args.bench, os.X_OK):
        fail(f"{args.bench} is not an executable; build first (bash scripts/build.sh)")
    print("| pair (width 8) | checkpointed | plain | machinery a call |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for checkpointed, plain in PAIRS:
            (ck, ck_steps), (pl, pl_steps) = per_step(args.bench, checkpointed, workdir), per_step(args.bench, plain,
                                                                                                  workdir)
            print(f"| {checkpointed} - {plain} | {ck / 1000:.1f}K ({ck_steps} steps) | {pl / 1000:.1f}K "
                  f"({pl_steps} steps) | {(ck - pl) / 1000:.1f}K |", flush=True)


if __name__ == "__main__":
    main()
