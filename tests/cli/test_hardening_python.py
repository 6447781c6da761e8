"""Hardening of the Python-model path and the network surface: --timeout bounds every run, signals
stop a Python model within a second, a model that kills or exits the process is one line and never
status 0, a lingering thread does not hold ckcheck, standard output belongs to the report sent
there, reports keep their target's mode and are written all or none, model text cannot inject HTML
or terminal escapes, every failure of the Python hand-off is one line, and the rendezvous store
listens on loopback only. Each test has its negative control.

Run by CTest (cli.hardening_python) with CKCHECK_BIN set to the ckcheck program.
"""
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

BIN = os.environ.get("CKCHECK_BIN", "")
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK), reason="CKCHECK_BIN is not set to the ckcheck program")

# A tiny model factory; BODY is spliced into the factory, HOOK into the blocks' forward. `calls`
# counts the forward calls of both blocks: 1-2 while ckcheck learns the model's sites, 3-4 in the
# plain step, 5-6 in the checkpointed step.
TEMPLATE = """
import os, signal, sys, threading, time
import torch

class Block(torch.nn.Module):
    calls = 0
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
    def forward(self, x):
        Block.calls += 1
        calls = Block.calls
{hook}
        return torch.tanh(self.lin(x))

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

def make_model():
{body}
    return Net(), torch.randn(2, 4)
"""


def model_file(tmp_path, body="pass", hook="pass", name="model.py"):
    path = tmp_path / name
    path.write_text(TEMPLATE.format(body=textwrap.indent(body, "    "), hook=textwrap.indent(hook, "        ")))
    return str(path)


def ckcheck(*args, cwd, timeout=300, env=None):
    e = dict(os.environ, NO_COLOR="1")
    e.update(env or {})
    start = time.monotonic()
    p = subprocess.run([BIN, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)
    p.took = time.monotonic() - start
    return p


def one_line(p):
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckcheck: error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


# ---- --timeout bounds every run -------------------------------------------------------------
# The limit leaves a loaded machine time to import torch and build the model before the phase
# that hangs (the checkpointed step's).
@pytest.mark.parametrize("where,body,hook,phase,limit", [
    ("factory", "time.sleep(600)", "pass", "loading the model", 8),
    ("checkpointed step", "pass", "if calls >= 5: time.sleep(600)", "the checkpointed step", 40),
])
def test_timeout_stops_a_python_model_naming_the_phase(tmp_path, where, body, hook, phase, limit):
    m = model_file(tmp_path, body, hook)
    p = ckcheck("run", "--model", m, "--timeout", str(limit), "--report", "json=r.json", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    line = one_line(p)
    assert f"--timeout {limit} s" in line and phase in line, line
    assert p.took < limit + 5, p.took
    assert not (tmp_path / "r.json").exists()


def test_timeout_of_a_cpp_model_in_one_process(tmp_path):
    p = ckcheck("run", "--model", "transformer", "--layers", "16", "--hidden", "512", "--seq", "512", "--timeout", "1",
                cwd=tmp_path)
    assert p.returncode == 2 and "--timeout 1 s" in one_line(p)
    assert p.took < 1 + 5


def test_a_run_within_its_timeout_passes(tmp_path):
    p = ckcheck("run", "--model", model_file(tmp_path), "--timeout", "120", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


# ---- signals --------------------------------------------------------------------------------
@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_python_model_within_a_second(tmp_path, signo):
    m = model_file(tmp_path, hook="if calls >= 3: time.sleep(600)")
    marker = tmp_path / "r.json"
    proc = subprocess.Popen([BIN, "run", "--model", m, "--report", f"json={marker}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(15)  # torch imported, the model running
    sent = time.monotonic()
    proc.send_signal(signo)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 1.5
    assert proc.returncode == 128 + signo, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "stopped by" in lines[0] and "Traceback" not in err, err
    assert not marker.exists()


# ---- a model that ends the process itself ---------------------------------------------------
@pytest.mark.parametrize("body,hook,words", [
    ("os.kill(os.getpid(), signal.SIGSEGV)", "pass", "killed by signal 11 (SIGSEGV"),
    ("os._exit(0)", "pass", "exited the process itself with status 0"),
    ("pass", "if calls >= 3: os._exit(0)", "exited the process itself with status 0"),
    ("pass", "if calls >= 3: os._exit(3)", "exited the process itself with status 3"),
])
def test_a_model_that_ends_the_process_is_one_line_and_never_status_0(tmp_path, body, hook, words):
    p = ckcheck("run", "--model", model_file(tmp_path, body, hook), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert words in one_line(p)


def test_a_lingering_thread_does_not_hold_ckcheck_after_its_report(tmp_path):
    body = "threading.Thread(target=time.sleep, args=(600,)).start()"
    p = ckcheck("run", "--model", model_file(tmp_path, body), cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "verdict: PASS" in p.stdout and p.took < 60


# ---- standard output belongs to the report ----------------------------------------------------
@pytest.mark.parametrize("target", ["json=-", "json", "json=/dev/stdout"])
def test_the_models_prints_go_to_stderr_while_a_report_is_on_stdout(tmp_path, target):
    m = model_file(tmp_path, body="print('factory says hi')", hook="print('forward says hi')")
    p = ckcheck("run", "--model", m, "--report", target, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)  # one JSON document, nothing else (no console summary either)
    assert report["verdict"] == "pass"
    assert "forward says hi" in p.stderr and "factory says hi" in p.stderr


def test_without_a_report_on_stdout_the_models_prints_stay_there(tmp_path):
    p = ckcheck("run", "--model", model_file(tmp_path, hook="print('forward says hi')"), cwd=tmp_path)
    assert p.returncode == 0 and "forward says hi" in p.stdout and "verdict: PASS" in p.stdout


def test_two_reports_on_stdout_are_refused(tmp_path):
    p = ckcheck("run", "--model", "mlp", "--report", "json=-", "--report", "markdown=-", cwd=tmp_path)
    assert p.returncode == 2 and "standard output" in one_line(p)
    assert p.stdout == ""


# ---- report files -------------------------------------------------------------------------
def test_a_replaced_report_keeps_its_mode(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old\n")
    os.chmod(target, 0o600)
    p = ckcheck("run", "--model", "mlp", "--report", "json=r.json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


def test_a_target_that_changes_during_the_run_leaves_every_report_untouched(tmp_path):
    (tmp_path / "a.json").write_text("old a\n")
    (tmp_path / "b.md").write_text("old b\n")
    body = f"os.remove({str(tmp_path / 'b.md')!r}); os.mkdir({str(tmp_path / 'b.md')!r})"
    p = ckcheck("run", "--model", model_file(tmp_path, body), "--report", "json=a.json", "--report", "markdown=b.md",
                cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "b.md" in one_line(p)
    assert (tmp_path / "a.json").read_text() == "old a\n"
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    # negative control: the same run with the target left alone replaces both
    q = ckcheck("run", "--model", model_file(tmp_path, name="ok.py"), "--report", "json=a.json", cwd=tmp_path)
    assert q.returncode == 0 and (tmp_path / "a.json").read_text() != "old a\n"


def test_a_timed_out_run_leaves_its_report_untouched(tmp_path):
    (tmp_path / "r.json").write_text("old\n")
    m = model_file(tmp_path, hook="if calls >= 3: time.sleep(600)")
    p = ckcheck("run", "--model", m, "--timeout", "8", "--report", "json=r.json", cwd=tmp_path)
    assert p.returncode == 2
    assert (tmp_path / "r.json").read_text() == "old\n"


def test_a_pipe_without_a_reader_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    p = ckcheck("run", "--model", "mlp", "--checks", "gradients", "--report", f"json={fifo}", cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "no reader" in one_line(p)


# ---- model text in reports ------------------------------------------------------------------
def test_markdown_escapes_html_and_the_console_strips_control_characters(tmp_path):
    hook = "if calls >= 5: raise RuntimeError('<img src=x onerror=alert(1)> \\x1b[2J\\x1b]0;owned\\x07')"
    m = model_file(tmp_path, hook=hook)
    p = ckcheck("run", "--model", m, "--report", "markdown=r.md", "--report", "console=c.txt", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    md = (tmp_path / "r.md").read_text()
    assert "onerror" in md and "<img" not in md and "&lt;img" in md
    console = (tmp_path / "c.txt").read_text() + p.stdout
    assert "onerror" in console and "\x1b" not in console and "\x07" not in console


# ---- the Python hand-off --------------------------------------------------------------------
@pytest.mark.parametrize("python,words", [
    ("/bin/false", "exited with status 1 before ckcheck started"),
    ("/nonexistent/python3", "cannot start /nonexistent/python3"),
    (sys.executable + "-not-there", "cannot start"),
])
def test_every_failure_of_the_python_hand_off_is_one_line(tmp_path, python, words):
    p = ckcheck("run", "--model", model_file(tmp_path), cwd=tmp_path, env={"CKCHECK_PYTHON": python})
    assert p.returncode == 2 and words in one_line(p)


def test_a_python_without_ckcheck_is_one_line(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    p = ckcheck("run", "--model", model_file(tmp_path), cwd=tmp_path,
                env={"CKCHECK_PYTHON": str(bare / "bin" / "python"), "PYTHONPATH": ""})
    assert p.returncode == 2 and "cannot run ckcheck's Python side" in one_line(p)


# ---- the network surface --------------------------------------------------------------------
def listening_addresses(pids):
    """(address, port) of every TCP socket in LISTEN that one of `pids` holds."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    out = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    addr, port = cols[1].split(":")
                    out.append((addr, int(port, 16)))
    return out


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == p:
                            out.append(int(d))
                            todo.append(int(d))
                except OSError:
                    pass
    return out


def test_the_rendezvous_store_listens_on_loopback_only(tmp_path):
    proc = subprocess.Popen([BIN, "run", "--model", "transformer", "--layers", "4", "--hidden", "128", "--seq", "128",
                             "--world-size", "2", "--checks", "gradients,data-parallel"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    while proc.poll() is None:
        seen += listening_addresses(descendants(proc.pid))
        time.sleep(0.2)
    assert proc.returncode == 0, proc.stderr.read()
    assert seen, "no listening socket was seen during the run"
    loopback = {"0100007F", "00000000000000000000000001000000"}
    assert {a for a, _ in seen} <= loopback, seen
