"""What a check costs, in plain training steps: the cost table (a benchmark, not a test).

For the built-in transformer at several depths (and a Python model, GPT-2 from a random config
at several depths, when transformers is installed), measured in this process with the process's CPU time:

  plain step      one forward + backward without checkpoints and without ckcheck's recording:
                  the median of `ckcheck bench --policies none` (C++ model), or of the model's own
                  forward and backward timed here (Python model), measured just before and just
                  after each run, whose figures are over the mean of the two;
  run             `ckcheck run` with every default check, in plain steps (for the Python model
                  its load included: the forward that finds its sites and units);
  its own figure  the run report's `cost.plain_steps`: the check alone (records, comparison and
                  checks) over the run's own plain reference step, first of the process;
  gradients only  `ckcheck run --checks gradients`, in plain steps.

Startup (loading LibTorch, importing the model) is outside every figure. The last column is how
the run's cost grows with depth against the plain step's own growth: 1.00 is linear in depth.

A Python model's check pays a fixed cost in Python per module call and per attribute it reads,
whatever the arithmetic: on a very narrow model that fixed part is most of the run
(--gpt2-hidden 32 --gpt2-seq 16: a step of about 10 ms).

    .venv/bin/python scripts/cost_table.py                     # 4, 8 and 16 layers, width 128
    .venv/bin/python scripts/cost_table.py --layers 4 8 --hidden 64 --repeat 1 --gpt2-layers 2 24
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quiet(fn):
    """fn() with file descriptors 1 and 2 sent to /dev/null."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            return fn()
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def cpu_of(fn):
    """The CPU time of fn() (the process's, every thread)."""
    t0 = time.process_time()
    status = quiet(fn)
    if isinstance(status, int) and status not in (0, 1):
        raise SystemExit(f"cost_table: the command exited with status {status}")
    return time.process_time() - t0


def measure(plain, run, gradients, repeat):
    """Each figure in plain steps measured beside it: a plain step (plain() -> seconds) just before
    and just after each run, so that a machine that slows down or speeds up between them moves
    both; the median over `repeat` rounds. run() -> the run report's own cost figure."""
    rounds = []
    for _ in range(repeat):
        before = plain()
        t0 = time.process_time()
        own = quiet(run)
        whole = time.process_time() - t0
        grads = cpu_of(gradients)
        step = (before + plain()) / 2
        rounds.append((step, whole / step, grads / step, own))
    med = lambda k: statistics.median(r[k] for r in rounds)
    return {"plain_s": med(0), "run": med(1), "gradients": med(2), "own": med(3)}


def cpp_row(ckcheck, layers, model_args, repeat):
    args = ["--model", "transformer", "--layers", str(layers)] + model_args
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.json")

        def report():
            with open(path) as f:
                return json.load(f)

        def plain():
            ckcheck.main(["bench", *args, "--policies", "none", "--steps", "5", "--warmup", "1",
                          "--report", f"json={path}"])
            return next(p for p in report()["policies"] if p["policy"] == "none")["cpu_median_s"]

        def run():
            status = ckcheck.main(["run", *args, "--report", f"json={path}"])
            if status not in (0, 1):
                raise SystemExit(f"cost_table: ckcheck run exited with status {status}")
            return report()["cost"]["plain_steps"]

        row = measure(lambda: quiet(plain), run, lambda: ckcheck.main(["run", *args, "--checks", "gradients"]),
                      repeat)
    return {"model": f"transformer, {layers} layers", **row}


def python_row(ckcheck, layers, hidden, seq, repeat):
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # not its notes on the random config
    spec = importlib.util.spec_from_file_location("tiny_gpt2", os.path.join(ROOT, "fixtures", "python", "tiny_gpt2.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.make_model(layers=layers, hidden=hidden, seq=seq, batch=4, heads=4)
    model, inputs = (made["model"], made["inputs"]) if isinstance(made, dict) else made[:2]
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
        loss = out.loss if getattr(out, "loss", None) is not None else out.logits.float().sum()
        loss.backward()

    def plain():
        times = []
        for _ in range(3):
            t0 = time.process_time()
            step()
            times.append(time.process_time() - t0)
        return statistics.median(times)

    step()  # warm-up
    row = measure(plain, lambda: ckcheck.run(model, inputs).cost["plain_steps"],
                  lambda: ckcheck.run(model, inputs, checks="gradients"), repeat)
    return {"model": f"GPT-2 (Python, its own switch, width {hidden}), {layers} layers", **row}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each check; the median counts (default 3)")
    ap.add_argument("--gpt2-layers", type=int, nargs="+", default=[2, 8],
                    help="depths of the Python model (default 2 8)")
    ap.add_argument("--gpt2-hidden", type=int, default=256, help="width of the Python model (default 256)")
    ap.add_argument("--gpt2-seq", type=int, default=64, help="its sequence length, at most 64 (default 64)")
    ap.add_argument("--no-python", action="store_true", help="skip the Python model")
    a = ap.parse_args(argv)
    if a.repeat < 1 or any(n < 1 for n in a.layers + a.gpt2_layers + [a.gpt2_hidden, a.gpt2_seq]):
        ap.error("--repeat, --layers, --gpt2-layers, --gpt2-hidden and --gpt2-seq must be at least 1")
    if a.gpt2_hidden % 4 or a.gpt2_seq > 64:
        ap.error("--gpt2-hidden must be a multiple of 4 (4 heads) and --gpt2-seq at most 64 (its positions)")
    if importlib.util.find_spec("ckcheck") is None and os.path.isdir(os.path.join(ROOT, "build", "python", "ckcheck")):
        sys.path.insert(0, os.path.join(ROOT, "build", "python"))  # the build folder's, not installed
    import ckcheck
    import torch

    torch.set_num_threads(1)
    model_args = ["--hidden", str(a.hidden), "--seq", str(a.seq), "--batch", str(a.batch), "--heads", "4"]
    rows = [cpp_row(ckcheck, n, model_args, a.repeat) for n in a.layers]
    if not a.no_python and importlib.util.find_spec("transformers") is not None:
        rows += [python_row(ckcheck, n, a.gpt2_hidden, a.gpt2_seq, a.repeat) for n in a.gpt2_layers]
    print(f"Cost of a check in plain training steps (CPU time, 1 thread; transformer width {a.hidden}, "
          f"seq {a.seq}, batch {a.batch}; GPT-2 width {a.gpt2_hidden}, seq {a.gpt2_seq}, batch 4; "
          f"median of {a.repeat} rounds)\n")
    print("| model | plain step | `ckcheck run` | its report's `cost.plain_steps` | `--checks gradients` | growth vs plain |")
    print("|---|---|---|---|---|---|")
    prev = None
    for r in rows:
        growth = ""
        if prev and prev["model"].split(",")[0] == r["model"].split(",")[0]:  # the same model, deeper
            growth = f"{r['run'] / prev['run']:.2f}"
        print(f"| {r['model']} | {1000 * r['plain_s']:.1f} ms | {r['run']:.1f} | {r['own']:.1f} | {r['gradients']:.1f} | {growth} |")
        prev = r
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
