"""The pytest marker runs the factory's model in a child process by default: a factory that exits
the process (os._exit(0)), crashes or hangs fails its test, and the session goes on and ends with
the failures counted -- never exit 0 without a summary, never 139, never held. A factory defined where
another process cannot import it runs in the session's process, as isolate=False asks. ckcheck.run's
keywords are checked as typed (preserve_rng_state='no' is refused, not taken as True).
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

MODELS = """
import os, signal, time
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return x

def good():
    return Net(), torch.randn(2, 4)

def exits():
    os._exit(0)

def crashes():
    os.kill(os.getpid(), signal.SIGSEGV)

def hangs():
    time.sleep(1000)
"""

TESTS = """
import pytest
import models

@pytest.mark.ckcheck(factory=models.good, checkpoint="torch")
def test_good(): pass

@pytest.mark.ckcheck(factory=models.exits)
def test_exits(): pass

@pytest.mark.ckcheck(factory=models.crashes)
def test_crashes(): pass

@pytest.mark.ckcheck(factory=models.hangs, timeout=20)
def test_hangs(): pass

def test_after(): pass
"""


def test_a_marker_factory_that_exits_crashes_or_hangs_fails_its_test_and_the_session_goes_on(tmp_path):
    (tmp_path / "models.py").write_text(textwrap.dedent(MODELS))
    (tmp_path / "test_models.py").write_text(textwrap.dedent(TESTS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "build", "python"), str(tmp_path)]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "ckcheck.pytest_plugin", "-p", "no:cacheprovider",
                           "-rA", "test_models.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "3 failed, 2 passed" in out, out
    for test in ("test_good", "test_after"):
        assert f"PASSED test_models.py::{test}" in out, out
    assert "exited the process itself with status 0" in out, out
    assert "SIGSEGV" in out, out
    assert "did not finish within --timeout 20 s" in out, out


def test_an_unimportable_factory_runs_in_this_process(tmp_path):
    (tmp_path / "test_local.py").write_text(textwrap.dedent("""
        import pytest, torch

        def make():
            return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), torch.randn(2, 4)

        @pytest.mark.ckcheck(factory=lambda: make(), checkpoint="torch", sites="0,1")
        def test_lambda(): pass
        """))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "python"))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "ckcheck.pytest_plugin", "-p", "no:cacheprovider",
                           "test_local.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("value", ["no", 0, None])
def test_preserve_rng_state_takes_a_bool(value):
    import torch

    import ckcheck

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.raises(ckcheck.UsageError) as e:
        ckcheck.run(model, torch.randn(2, 4), preserve_rng_state=value)
    assert e.value.field == "preserve_rng_state" and "True or False" in str(e.value)


CTRL_C = """
import itertools, signal, sys, time, threading
import torch
import ckcheck

# Counted outside what ckcheck compares and puts back between its steps (a module-level number is
# the model's state): the third forward is one of the steps.
calls = itertools.count(1)

class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    def forward(self, x):
        if next(calls) == 3:
            print("running", flush=True)
            time.sleep(600)
        for b in self.blocks:
            x = torch.tanh(b(x))
        return x

try:
    ckcheck.run(Slow(), torch.randn(2, 4))
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(130)
except Exception as e:
    print("swallowed:", type(e).__name__, e, flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("interrupt", [True, False], ids=["ctrl-c", "no-signal"])
def test_ctrl_c_in_ckcheck_run_is_a_keyboard_interrupt(tmp_path, interrupt):
    import signal
    import time

    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C if interrupt else CTRL_C.replace("time.sleep(600)", "pass"))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "python"))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "running"
    if interrupt:
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if interrupt:
        # Within a second, as the exception Python code catches with except KeyboardInterrupt.
        assert time.monotonic() - sent < 3, out + err
        assert proc.returncode == 130 and "KeyboardInterrupt" in out, out + err
    else:
        # The negative control: the same run without the signal finishes and is no interruption.
        assert proc.returncode == 0 and "KeyboardInterrupt" not in out, out + err


def test_an_api_error_is_one_line_naming_the_cause():
    import torch

    import ckcheck

    def loss(out):
        raise ValueError("the labels are missing")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.raises(ckcheck.UsageError) as e:
        ckcheck.run(model, torch.randn(2, 4), loss=loss)
    message = str(e.value)
    assert "\n" not in message and "At:" not in message, message
    assert "the labels are missing" in message and "loss" in message, message
    assert "without checkpointing" not in message, message
