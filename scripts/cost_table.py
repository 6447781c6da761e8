"""What a check costs, in plain training steps: the cost table (a benchmark, not a test).

For the built-in transformer at several depths (and a Python model, GPT-2 from a tiny random
config at several depths, when transformers is installed), measured in this process with the process's CPU time:

  plain step      one forward + backward without checkpoints and without ckcheck's recording:
                  the median of `ckcheck bench --policies none` (C++ model), or of the model's own
                  forward and backward timed here (Python model);
  run             `ckcheck run` with every default check, in plain steps (building the model and
                  its first, discovering forward included for the Python model);
  its own figure  the run report's `cost.plain_steps`: the check alone (records, comparison and
                  checks) over the run's own plain reference step, first of the process;
  gradients only  `ckcheck run --checks gradients`, in plain steps.

Startup (loading LibTorch, importing the model) is outside every figure. The last column is how
the run's cost grows with depth against the plain step's own growth: 1.00 is linear in depth.

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


def cpu_of(fn, repeat):
    """The median CPU time of fn() over `repeat` runs (the process's, every thread)."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        status = quiet(fn)
        times.append(time.process_time() - t0)
        if isinstance(status, int) and status not in (0, 1):
            raise SystemExit(f"cost_table: the command exited with status {status}")
    return statistics.median(times)


def cpp_row(ckcheck, layers, model_args, repeat):
    args = ["--model", "transformer", "--layers", str(layers)] + model_args
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.json")
        quiet(lambda: ckcheck.main(["bench", *args, "--policies", "none", "--steps", "10", "--warmup", "2",
                                    "--report", f"json={path}"]))
        with open(path) as f:
            bench = json.load(f)
        none = next(p for p in bench["policies"] if p["policy"] == "none")
        plain = none["cpu_median_s"]
        run = cpu_of(lambda: ckcheck.main(["run", *args, "--report", f"json={path}"]), repeat)
        with open(path) as f:
            own = json.load(f)["cost"]["plain_steps"]
    grads = cpu_of(lambda: ckcheck.main(["run", *args, "--checks", "gradients"]), repeat)
    return {"model": f"transformer, {layers} layers", "plain_s": plain, "run": run / plain, "gradients": grads / plain,
            "own": own}


def python_row(ckcheck, layers, repeat):
    spec = importlib.util.spec_from_file_location("tiny_gpt2", os.path.join(ROOT, "fixtures", "python", "tiny_gpt2.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.make_model(layers=layers)
    model, inputs = (made["model"], made["inputs"]) if isinstance(made, dict) else made[:2]
    model.train()

    def plain_step():
        model.zero_grad(set_to_none=True)
        out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
        loss = out.loss if getattr(out, "loss", None) is not None else out.logits.float().sum()
        loss.backward()

    plain_step()  # warm-up
    times = []
    for _ in range(10):
        t0 = time.process_time()
        plain_step()
        times.append(time.process_time() - t0)
    plain = statistics.median(times)
    run = cpu_of(lambda: ckcheck.run(model, inputs), repeat)
    own = ckcheck.run(model, inputs).cost["plain_steps"]
    grads = cpu_of(lambda: ckcheck.run(model, inputs, checks="gradients"), repeat)
    return {"model": f"GPT-2 (tiny, Python, its own switch), {layers} layers", "plain_s": plain, "run": run / plain,
            "gradients": grads / plain, "own": own}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each check; the median counts (default 3)")
    ap.add_argument("--gpt2-layers", type=int, nargs="+", default=[2, 8],
                    help="depths of the Python model, GPT-2 width 32 (default 2 8)")
    ap.add_argument("--no-python", action="store_true", help="skip the Python model")
    a = ap.parse_args(argv)
    if a.repeat < 1 or any(n < 1 for n in a.layers + a.gpt2_layers):
        ap.error("--repeat, --layers and --gpt2-layers must be at least 1")
    if importlib.util.find_spec("ckcheck") is None and os.path.isdir(os.path.join(ROOT, "build", "python", "ckcheck")):
        sys.path.insert(0, os.path.join(ROOT, "build", "python"))  # the build folder's, not installed
    import ckcheck
    import torch

    torch.set_num_threads(1)
    model_args = ["--hidden", str(a.hidden), "--seq", str(a.seq), "--batch", str(a.batch), "--heads", "4"]
    rows = [cpp_row(ckcheck, n, model_args, a.repeat) for n in a.layers]
    if not a.no_python and importlib.util.find_spec("transformers") is not None:
        rows += [python_row(ckcheck, n, a.repeat) for n in a.gpt2_layers]
    print(f"Cost of a check in plain training steps (CPU time, 1 thread; transformer width {a.hidden}, "
          f"seq {a.seq}, batch {a.batch}; median of {a.repeat})\n")
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
