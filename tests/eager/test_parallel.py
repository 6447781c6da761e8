"""Data-parallel training in PyTorch's own engine: `ckcheck run --parallel ddp --world-size N` (and
the same ranks started by torchrun). What PyTorch does comes from ddp_truth.py, PyTorch's DDP alone
on two processes; every detection has its negative control. Gloo on 127.0.0.1 only.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import FIXTURES, ROOT, ckcheck_bin, fixture

sys.path.insert(0, FIXTURES)  # parallel.py builds on twins.py, as ckcheck's factory import finds it

MODELS = fixture("parallel.py")
TRUTH = os.path.join(os.path.dirname(__file__), "ddp_truth.py")
PYTHON = sys.executable


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pytorch_truth(tmp_path, script, args, world=2, models=MODELS):
    """Each rank's {"error", "grads"} from a truth script run by PyTorch alone on `world` processes,
    on the factories of `models`."""
    port, procs, outs = free_port(), [], []
    for rank in range(world):
        out = tmp_path / f"truth-{'-'.join(args)}-{rank}.json"
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_PORT=str(port))
        procs.append(subprocess.Popen([PYTHON, script, models, *args, str(out)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    return [json.loads(o.read_text()) for o in outs]


def pytorch_ddp(tmp_path, factory, checkpoint, world=2):
    """PyTorch alone: each rank's {"error", "grads"} under DDP with every block checkpointed."""
    return pytorch_truth(tmp_path, TRUTH, [factory, checkpoint], world)


def ddp_run(ckcheck, factory, checkpoint, *extra, world=2):
    return ckcheck("run", "--model", f"{MODELS}:{factory}", "--checkpoint", checkpoint, "--parallel", "ddp",
                   "--world-size", world, "--timeout", 300, *extra)


def test_transformer_under_ddp_with_a_non_reentrant_checkpoint_passes(ckcheck, tmp_path):
    # PyTorch: DDP's gradients with every block checkpointed equal the plain ones, bitwise.
    plain, ckpt = pytorch_ddp(tmp_path, "transformer", "none"), pytorch_ddp(tmp_path, "transformer", "torch")
    assert plain[0]["grads"] == ckpt[0]["grads"] and not ckpt[0]["error"]
    r = ddp_run(ckcheck, "transformer", "torch")
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["parallel"] == "ddp" and r.report["config"]["world_size"] == 2
    assert "PyTorch's DistributedDataParallel over gloo" in r.out
    dp = r.check("data-parallel")
    assert dp["status"] == "pass" and "averaged over 2 ranks" in dp["summary"]


def test_dropout_outside_any_checkpoint_is_not_compared_with_one_process(ckcheck):
    # Each rank draws its own masks, so one process cannot reproduce them, checkpointed sites or not.
    r = ddp_run(ckcheck, "transformer_dropout", "torch", "--policy", "none")
    assert r.code == 0, r.out + r.err
    assert r.check("data-parallel")["status"] == "skip" and "draws random numbers" in r.check("data-parallel")["summary"]
    # The control: without dropout the comparison is made.
    ok = ddp_run(ckcheck, "transformer", "torch", "--policy", "none")
    assert ok.code == 0 and ok.check("data-parallel")["status"] == "pass", ok.out + ok.err


def test_world_size_four(ckcheck):
    r = ddp_run(ckcheck, "transformer", "torch", world=4)
    assert r.code == 0, r.out + r.err
    assert r.check("data-parallel")["status"] == "pass" and "over 4 ranks" in r.check("data-parallel")["summary"]


def test_reentrant_checkpoint_on_a_frozen_input_lora_model_fails_the_hooks_check(ckcheck, tmp_path):
    # PyTorch: DDP stops at the next step (the adapters' gradients never came); non-reentrant is fine.
    reentrant = pytorch_ddp(tmp_path, "lora", "torch-reentrant")
    assert "Expected to have finished reduction" in reentrant[0]["error"]
    assert reentrant[0]["grads"]["blocks.0.proj.down.weight"] is None
    assert not pytorch_ddp(tmp_path, "lora", "torch")[0]["error"]

    r = ddp_run(ckcheck, "lora", "torch-reentrant")
    assert r.code == 1, r.out + r.err
    hooks = r.check("hooks")
    assert hooks["status"] == "fail"
    tensors = {f["tensor"] for f in hooks["findings"]}
    assert "blocks.0.proj.down.weight" in tensors and all(f["cause"] == "hook-count" for f in hooks["findings"])
    assert all(f["site"] in ("blocks.0", "blocks.1") for f in hooks["findings"])
    assert any("DDP stopped the step" in f["message"] for f in hooks["findings"])
    # The negative control: the same model under the non-reentrant checkpoint.
    ok = ddp_run(ckcheck, "lora", "torch")
    assert ok.code == 0 and ok.check("hooks")["status"] == "pass", ok.out + ok.err


def test_reentrant_checkpoint_with_find_unused_parameters_marks_a_parameter_ready_twice(ckcheck, tmp_path):
    # PyTorch: DDP stops the backward ("Expected to mark a variable ready only once"); with
    # static_graph=True the same reentrant checkpoint trains.
    assert "mark a variable ready only once" in pytorch_ddp(tmp_path, "transformer_find_unused", "torch-reentrant")[0]["error"]
    assert not pytorch_ddp(tmp_path, "transformer_static_graph", "torch-reentrant")[0]["error"]
    r = ddp_run(ckcheck, "transformer_find_unused", "torch-reentrant")
    assert r.code == 1, r.out + r.err
    hooks = r.check("hooks")
    assert hooks["status"] == "fail" and [f["cause"] for f in hooks["findings"]] == ["hook-count"], hooks
    finding = hooks["findings"][0]
    assert finding["tensor"].startswith("blocks.") and finding["site"] in ("blocks.0", "blocks.1"), finding
    assert "engine stopped the checkpointed step" in finding["message"]
    assert r.check("gradients")["findings"][0]["cause"] == "hook-count"
    assert r.check("rank-rng")["status"] == "error"  # a failed step's draws are not judged
    ok = ddp_run(ckcheck, "transformer_static_graph", "torch-reentrant")
    assert ok.code == 0, ok.out + ok.err


def test_the_factorys_ddp_options_reach_the_engine(ckcheck, tmp_path):
    # find_unused_parameters=True: PyTorch's DDP goes on without the adapters' gradients.
    truth = pytorch_ddp(tmp_path, "lora_find_unused", "torch-reentrant")
    assert not truth[0]["error"] and truth[0]["grads"]["blocks.0.proj.down.weight"] is None
    r = ddp_run(ckcheck, "lora_find_unused", "torch-reentrant")
    assert r.code == 1
    # No error from the engine this time: the gradients are simply missing.
    causes = {f["cause"] for f in r.check("gradients")["findings"]}
    assert causes == {"missing-grad"}, r.check("gradients")
    assert r.check("hooks")["status"] == "fail"


def test_a_model_that_reseeds_in_its_forward_fails_rank_rng(ckcheck):
    # PyTorch: after the reseed, two ranks' streams are one (the same masks), whatever their seeds.
    import torch

    def masks(seed, reseed):
        torch.manual_seed(seed)
        if reseed:
            torch.manual_seed(1234)
        return torch.rand(16)

    assert torch.equal(masks(1, True), masks(2, True)) and not torch.equal(masks(1, False), masks(2, False))
    r = ddp_run(ckcheck, "dropout_reseeded", "torch")
    assert r.code == 1, r.out + r.err
    rng = r.check("rank-rng")
    assert rng["status"] == "fail" and rng["findings"][0]["site"] == "blocks.0", rng
    ok = ddp_run(ckcheck, "dropout_per_rank", "torch")
    assert ok.code == 0 and ok.check("rank-rng")["status"] == "pass", ok.out + ok.err


def _whole_and_shards(factory):
    """PyTorch alone, one process: the parameter gradients of a mean of the factory's outputs'
    projections on the whole batch, and the average of those on its two halves."""
    import torch
    from conftest import factory_result

    made = factory_result("parallel.py", factory)
    model, inputs = (made["model"], made["inputs"]) if isinstance(made, dict) else made

    def grads(part):
        model.zero_grad(set_to_none=True)
        args = {k: v[part] for k, v in inputs.items()} if isinstance(inputs, dict) else {}
        out = model(**args) if args else model(inputs[part])
        loss = out["loss"] if isinstance(out, dict) else out.sum() / len(inputs)
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole = grads(slice(None))
    halves = [grads(slice(0, 2)), grads(slice(2, 4))]
    return whole, [(a + b) / 2 for a, b in zip(*halves)]


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_a_mean_loss_averaged_over_ranks_is_the_whole_batch_loss(ckcheck, amp):
    # PyTorch: a mean loss's gradient on the whole batch is the average of its halves' (up to rounding).
    import torch

    whole, averaged = _whole_and_shards("transformer_mean_loss")
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(whole, averaged))
    r = ddp_run(ckcheck, "transformer_mean_loss", "torch", "--amp", amp)
    assert r.code == 0 and r.check("data-parallel")["status"] == "pass", r.out + r.err
    assert ("autocast bf16" in r.check("data-parallel")["summary"]) == (amp == "bf16")


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_batchnorm_statistics_per_shard_fail_data_parallel(ckcheck, amp):
    # PyTorch: BatchNorm normalises each half by its own statistics, so the halves' gradients do
    # not average to the whole batch's.
    import torch

    whole, averaged = _whole_and_shards("convnet_batchnorm")
    assert not all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(whole, averaged))
    r = ddp_run(ckcheck, "convnet_batchnorm", "torch", "--checks", "gradients,data-parallel", "--amp", amp)
    assert r.code == 1 and r.check("data-parallel")["status"] == "fail", r.out + r.err
    assert r.check("gradients")["status"] == "pass"


def _listening_sockets(pids):
    """(pid, local address) of every TCP socket in LISTEN state the processes hold -- what `ss
    -ltnp` shows, read from where it reads it (/proc/net/tcp{,6} and each process's fds)."""
    inodes = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    found.append((inodes[cols[9]], cols[1].split(":")[0]))
    return found


def _descendants(root):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc writes them


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_the_ranks_listen_on_loopback_only(tmp_path, engine):
    p = subprocess.Popen([ckcheck_bin(), "run", "--model", f"{MODELS}:transformer", "--checkpoint", "torch",
                          "--parallel", engine, "--world-size", "2", "--timeout", "300"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.extend(_listening_sockets(_descendants(p.pid)))
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    out, err = p.communicate(timeout=420)
    stop.set()
    t.join()
    assert p.returncode == 0, out + err
    assert seen, "no listening socket was seen: the watch missed the run"
    assert all(addr in LOOPBACK for _, addr in seen), seen


def torchrun_nodes(program, node_args, report):
    """Two torchrun launchers (--nnodes 2, one rank each) on loopback, node K with node_args[K]:
    (exit status, stdout, stderr) of each."""
    port = free_port()
    # torchrun's agent leaves a torchelastic_* folder in the temporary folder: the test's own.
    env = dict(os.environ, TMPDIR=str(os.path.dirname(report)), PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "build", "python"), os.environ.get("PYTHONPATH", "")]))
    launchers = []
    for node, args in enumerate(node_args):
        argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
                str(node), "--master-addr", "127.0.0.1", "--master-port", str(port), *program, *args,
                "--timeout", "300", "--report", f"json={report}"]
        launchers.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
    return [_finish(p) for p in launchers]


def _finish(p):
    out, err = p.communicate(timeout=420)
    return p.returncode, out, err


def test_ranks_that_disagree_on_the_plan_are_refused(tmp_path):
    args = ["--model", f"{MODELS}:transformer", "--checkpoint", "torch", "--parallel", "ddp"]
    results = torchrun_nodes(["-m", "ckcheck", "run"], [args + ["--policy", "every:1"], args + ["--policy", "none"]],
                             tmp_path / "r.json")
    code, out, err = results[0]
    assert code != 0
    assert "rank 1 runs model" in err and "policy none" in err and "start every rank with the same command" in err, err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("model", ["python", "python-fsdp", "builtin"])
def test_two_torchrun_nodes_give_the_report_of_world_size_two(ckcheck, tmp_path, model):
    """Two torchrun launchers (--nnodes 2, one rank each) on loopback: torchrun's agent hosts the
    store, which the ranks join; the report is that of --world-size 2."""
    if model.startswith("python"):
        engine = "fsdp" if model == "python-fsdp" else "ddp"
        args = ["--model", f"{MODELS}:transformer_dropout", "--checkpoint", "torch", "--parallel", engine]
        program = ["-m", "ckcheck", "run"]
    else:
        args = ["--model", "transformer", "--layers", "2", "--batch", "4"]
        program = ["--no-python", ckcheck_bin(), "run"]
    reference = ckcheck("run", *args, "--world-size", 2, "--timeout", 300)
    assert reference.code == 0, reference.out + reference.err
    report = tmp_path / "torchrun.json"
    for code, out, err in torchrun_nodes(program, [args, args], report):
        assert code == 0, out + err[-3000:]
    got = json.loads(report.read_text())
    summary = lambda rep: [(c["id"], c["status"], c["summary"]) for c in rep["checks"]]
    assert summary(got) == summary(reference.report)
    assert got["tensors"] == reference.report["tensors"]
    assert got["config"]["world_size"] == 2


@pytest.mark.parametrize("command, args, message", [
    *[(command, args, message) for command in ("run", "diagnose") for args, message in [
        (["--world-size", "2"], "add --parallel ddp"),
        (["--parallel", "ddp"], "add --world-size N"),
        (["--parallel", "ddp", "--world-size", "2", "--compile"], "--parallel applies to eager training"),
    ]],
    ("run", ["--parallel", "ddp", "--world-size", "2", "--bench"], "--bench runs in one process"),
])
def test_usage_errors(ckcheck, command, args, message):
    r = ckcheck(command, "--model", f"{MODELS}:transformer", *args)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and message in lines[0], r.err


def test_parallel_applies_to_python_models(ckcheck):
    r = ckcheck("run", "--model", "mlp", "--parallel", "ddp", "--world-size", "2")
    assert r.code == 2 and "--parallel applies to Python models" in r.err, r.err
