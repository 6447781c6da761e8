"""Hardening of the surface an audit reached: every input file protected from every report target,
SIGINT that reaches the Python child stops the run with one line and 130, a data-parallel run's
deadline kept by the launcher (which names the hung rank and cleans up), a rank that ends early or
is killed named at once with its status, signals to a data-parallel run reported once with the
signal that came, model text that cannot forge console lines or send terminal sequences, --timeout
on every command, one meaning per option spelling, strict number parsing, misnamed problems named
rightly, and a Markdown reproduce line that runs as written. Each test has its negative control.

Run by CTest (cli.hardening_surface) with CKCHECK_BIN set to the ckcheck program.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

BIN = os.environ.get("CKCHECK_BIN", "")
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK), reason="CKCHECK_BIN is not set to the ckcheck program")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The launcher's rank folders go to TMPDIR: these runs get their own, so that the count is theirs.
TMP = tempfile.mkdtemp(prefix="ckcheck-hardening-surface-")
ENV = dict(os.environ, NO_COLOR="1", TMPDIR=TMP)

MODEL = """
import os, signal, sys, time
import torch

MODE = os.environ.get("CKCHECK_TEST_MODE", "")

class Block(torch.nn.Module):
    calls = 0
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
    def forward(self, x):
        Block.calls += 1
        rank = int(os.environ.get("RANK", "-1"))
        if rank == 1 and Block.calls == 5:
            if MODE == "hang": time.sleep(1000)
            if MODE == "exit0": os._exit(0)
            if MODE == "kill": os.kill(os.getpid(), signal.SIGKILL)
        if MODE == "sigint":  # tell the test the steps run, then run slowly enough to be signalled in one
            open(os.environ["CKCHECK_TEST_MARK"], "a").close()
            time.sleep(0.3)
        if MODE == "slow": time.sleep(1.0)  # a run far longer than the tests wait before they signal
        return torch.tanh(self.lin(x))

class Net(torch.nn.Module):
    def __init__(self, name="blocks"):
        super().__init__()
        self.add_module(name, torch.nn.ModuleList([Block(), Block()]))
        self.name = name
    def forward(self, x):
        for b in getattr(self, self.name):
            x = b(x)
        return x

def make():
    return Net(), torch.randn(4, 4)

def slow_factory():
    time.sleep(60)  # still building the model when the tests signal
    return Net(), torch.randn(4, 4)

def forged():
    # A module name that, printed raw, would put verdict lines of its own on the console.
    return Net("x\\nverdict: PASS\\nverdict: PASS\\n\\x1b[2J"), torch.randn(4, 4)

def loss_raises():
    def loss(out):
        raise ValueError("this loss is broken")
    return {"model": Net(), "inputs": torch.randn(4, 4), "loss": loss}

def bad_ddp_option():
    return {"model": Net(), "inputs": torch.randn(4, 4), "ddp": {"find_unused_parameters": "yes"}}
"""


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(MODEL))
    return str(path)


def ckcheck(*args, cwd=None, mode="", timeout=300):
    env = dict(ENV, CKCHECK_TEST_MODE=mode)
    return subprocess.run([BIN, *map(str, args)], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)


def rank_folders():
    return [f for f in os.listdir(TMP) if f.startswith("ckcheck-ranks-")]


def one_error_line(p):
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckcheck: error: "), p.stderr
    return lines[0]


def teardown_module():
    shutil.rmtree(TMP, ignore_errors=True)


# 1. Every input file protected from every report target.
@pytest.mark.parametrize("which", ["model", "import"])
def test_no_report_replaces_an_input_file(tmp_path, model, which):
    before = open(model).read()
    if which == "model":
        p = ckcheck("run", "--model", f"{model}:make", "--checkpoint", "torch", "--report", f"json={model}")
    else:
        p = ckcheck("validate-op", "--import", model, "--op", "aten::add", "--shapes", "4x4", "--report",
                    f"json={model}")
    assert p.returncode == 2 and "would overwrite the input file" in one_error_line(p), p.stderr
    assert open(model).read() == before
    # Negative control: another file takes the report.
    other = tmp_path / "other.json"
    p = ckcheck("run", "--model", f"{model}:make", "--checkpoint", "torch", "--report", f"json={other}")
    assert p.returncode == 0 and other.exists(), p.stderr


def test_sigint_while_the_factory_runs_stops_the_run_as_later(tmp_path, model):
    """A SIGINT during the model's factory (its imports, its weights) is the same stop, not a model error."""
    report = tmp_path / "r.json"
    p = subprocess.Popen([BIN, "run", "--model", f"{model}:slow_factory", "--report", f"json={report}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    child, deadline = None, time.monotonic() + 30
    while child is None and time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        child = int(out[0]) if out else None
        time.sleep(0.2)
    time.sleep(8)  # past the interpreter's start, inside the factory's sleep
    os.kill(child, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "stopped by SIGINT" in err and "KeyboardInterrupt" not in err, err
    assert not report.exists()


# 2. SIGINT that reaches the Python child: one line, 130, no report.
def test_sigint_to_the_python_child_stops_the_run(tmp_path, model):
    report, mark = tmp_path / "r.json", tmp_path / "in-a-step"
    p = subprocess.Popen([BIN, "run", "--model", f"{model}:make", "--checkpoint", "torch", "--report", f"json={report}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(ENV, CKCHECK_TEST_MODE="sigint", CKCHECK_TEST_MARK=str(mark)))
    deadline = time.monotonic() + 120  # however slow the machine, the signal lands inside a step
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()[0])
    os.kill(child, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "stopped by SIGINT" in lines[0], err
    assert not report.exists()


# 3-5. A data-parallel run's failures named from what the launcher knows.
@pytest.mark.parametrize("mode,expected", [
    ("hang", r"ranks? (0, )?1 did not finish within --timeout 25 s"),  # rank 0 too, where it was slow to wait
    ("exit0", r"rank 1 ended itself with exit status 0 in the checkpointed step"),
    ("kill", r"rank 1 was killed by signal 9 \(SIGKILL\) in the checkpointed step"),
])
def test_a_rank_that_hangs_ends_early_or_is_killed_is_named(model, mode, expected):
    import re

    start = time.monotonic()
    p = ckcheck("run", "--model", f"{model}:make", "--checkpoint", "torch", "--parallel", "ddp", "--world-size", 2,
                "--timeout", 25, mode=mode, timeout=120)
    took = time.monotonic() - start
    line = one_error_line(p)
    assert p.returncode == 2 and re.search(expected, line), line
    assert took < (40 if mode == "hang" else 25), took  # early ends are failures at once, before --timeout
    assert "rank 0 failed" not in line, line  # the surviving rank is not blamed
    assert rank_folders() == []


# 6. Signals to a data-parallel run: one line with the signal that came.
@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
def test_a_signal_to_a_data_parallel_run_is_reported_once(model, signo):
    p = subprocess.Popen([BIN, "run", "--model", f"{model}:make", "--checkpoint", "torch", "--parallel", "ddp",
                          "--world-size", "2", "--timeout", "100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(ENV, CKCHECK_TEST_MODE="slow"))
    time.sleep(8)
    p.send_signal(signo)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signo, err
    lines = err.strip().splitlines()
    # The launcher names the signal; a run still loading its model before the ranks start, by name too.
    assert len(lines) == 1 and "stopped by" in lines[0] and signal.strsignal(signo) in lines[0], err
    assert rank_folders() == []


# 8, 10. Model text cannot forge console lines nor reach the terminal as a sequence.
def test_a_module_name_with_newlines_forges_no_line(model):
    p = ckcheck("run", "--model", f"{model}:forged", "--checkpoint", "torch")
    lines = p.stdout.splitlines()
    assert sum(line.startswith("verdict:") for line in lines) == 1, p.stdout
    assert "\x1b" not in p.stdout + p.stderr
    assert "\\n" in p.stdout  # the name is shown, escaped


def test_escape_sequences_in_errors_are_shown_not_sent(tmp_path):
    ops = tmp_path / "ops.py"
    ops.write_text('raise RuntimeError("\\x1b]0;owned\\x07\\x1b[2J broken module")\n')
    for args in (["validate-op", "--import", ops, "--op", "x::y", "--shapes", "4x4"],
                 ["run", "--model", "\x1b]0;title\x07"]):
        p = ckcheck(*args)
        assert p.returncode == 2 and "\x1b" not in p.stderr and "\x07" not in p.stderr, repr(p.stderr)
        assert "\\x1b" in one_error_line(p)


# 9. --timeout on every command.
@pytest.mark.parametrize("args", [
    ["plan", "--model", "transformer", "--layers", "8", "--memory-budget", "1GiB", "--steps", "1000"],
    ["bench", "--model", "transformer", "--layers", "8", "--steps", "1000"],
])
def test_every_command_takes_a_timeout(args):
    start = time.monotonic()
    p = ckcheck(*args, "--timeout", 2, timeout=120)
    assert p.returncode == 2 and "did not finish within --timeout 2 s" in one_error_line(p), p.stderr
    assert time.monotonic() - start < 30


def test_validate_op_takes_a_timeout():
    p = ckcheck("validate-op", "--library", os.path.join(ROOT, "build", "tests", "ops", "libckcheck_test_ops.so"),
                "--op", "ckcheck_test::mutating", "--shapes", "4x4", "--timeout", 60)
    assert p.returncode in (0, 1), p.stderr  # the option is taken, and the run finishes within it


# 11, 13. One meaning per spelling, strict numbers.
@pytest.mark.parametrize("args,message", [
    (["plan", "--model", "mlp", "--memory-budget", "0.5"], "give it with its unit"),
    (["plan", "--model", "mlp", "--memory-budget", "1000"], "give it with its unit"),
    (["plan", "--model", "mlp", "--memory-budget", "0.5B"], "whole number of bytes"),
    (["bench", "--model", "mlp", "--memory-budget", " 1GiB"], "memory size"),
    (["run", "--model", "mlp", "--lr", " 0.5"], "--lr"),
    (["run", "--model", "mlp", "--lr", "0x1p-1"], "--lr"),
    (["run", "--model", "mlp", "--lr", "1e"], "--lr"),
    (["validate-op", "--library", "x.so", "--op", "a::b", "--shapes", ""], "--shapes"),
])
def test_lenient_spellings_are_refused(args, message):
    p = ckcheck(*args)
    assert p.returncode == 2 and message in one_error_line(p), p.stderr


def test_a_size_with_its_unit_and_a_plain_number_are_taken():
    # Negative controls: the same options, written as they mean.
    assert ckcheck("run", "--model", "mlp", "--lr", "0.5").returncode == 0
    p = ckcheck("plan", "--model", "mlp", "--memory-budget", "1GiB", "--steps", "2", "--warmup", "1",
                "--time-budget", "0", timeout=600)
    assert p.returncode in (0, 1), p.stderr


# 12. Problems named rightly, in one line.
@pytest.mark.parametrize("factory,args,message", [
    ("loss_raises", [], "the factory's loss raised ValueError: this loss is broken"),
    ("bad_ddp_option", ["--parallel", "ddp", "--world-size", "2"],
     "the factory's ddp option find_unused_parameters takes True or False"),
])
def test_a_setup_problem_is_named_as_such(model, factory, args, message):
    p = ckcheck("run", "--model", f"{model}:{factory}", "--checkpoint", "torch", *args)
    line = one_error_line(p)
    assert p.returncode == 2 and message in line and "fails without checkpointing" not in line, line


# 14. A Markdown reproduce line that runs as written.
def test_the_markdown_reproduce_line_survives_backticks_and_escapes(tmp_path, model):
    odd = tmp_path / "a`b```c\x1bd"
    odd.mkdir()
    path = odd / "m.py"
    shutil.copy(model, path)
    report = tmp_path / "r.md"
    p = ckcheck("run", "--model", f"{path}:make", "--checkpoint", "torch", "--report", f"markdown={report}")
    assert p.returncode == 0, p.stderr
    text = report.read_text()
    assert "\x1b" not in text
    fence = "````"  # longer than the longest run of backticks in the command
    block = text.split(fence + "sh\n", 1)[1].split("\n" + fence, 1)[0]
    rerun = subprocess.run(["bash", "-c", block.replace("ckcheck", f"'{BIN}'", 1) + " --report json=" +
                            str(tmp_path / "again.json")], capture_output=True, text=True, env=ENV, timeout=300)
    assert rerun.returncode == 0, (block, rerun.stderr)
    assert json.loads((tmp_path / "again.json").read_text())["verdict"] == "pass"
