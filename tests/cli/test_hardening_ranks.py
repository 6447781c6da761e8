"""Hardening of data-parallel runs from the ckcheck command line: the timeout is the limit of the
whole run, signals reach the ranks, and nothing is left behind (no rank process, no rank folder in
/tmp).

Run by CTest (cli.hardening_ranks) alone, as it counts the rank folders in /tmp and times the
run's limits; ============================= test session starts ==============================
platform linux -- Python 3.11.7, pytest-9.0.3, pluggy-1.6.0
benchmark: 5.2.3 (defaults: timer=time.perf_counter disable_gc=False min_rounds=5 min_time=0.000005 max_time=1.0 calibration_precision=10 warmup=False warmup_iterations=100000)
rootdir: /work/main
configfile: pyproject.toml
plugins: hypothesis-6.155.2, benchmark-5.2.3
collected 0 items

============================ no tests ran in 1.92s ============================= with CKCHECK_BIN set runs it by
hand.
"""
import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

BIN = os.environ.get("CKCHECK_BIN", "")
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK), reason="CKCHECK_BIN is not set to the ckcheck program")


# The launcher makes its ranks' folder in TMPDIR: this file's runs get one of their own, so that
# another ckcheck on the machine leaves no folder these tests would count.
TMP = tempfile.mkdtemp(prefix="ckcheck-hardening-ranks-")
atexit.register(shutil.rmtree, TMP, True)
ENV = dict(os.environ, NO_COLOR="1", TMPDIR=TMP)


def ckcheck(*args, cwd=None, **kw):
    return subprocess.run([BIN, *args], cwd=cwd, capture_output=True, env=ENV, **kw)


# ---------------------------------------------------------------------------------------------
def rank_folders():
    return {f for f in os.listdir(TMP) if f.startswith("ckcheck-ranks-")}


def children_of(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(d))
            except OSError:
                pass
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_timeout_is_the_limit_of_the_whole_run(tmp_path):
    before = rank_folders()
    start = time.monotonic()
    p = ckcheck("run", "--model", "faulty/rank-fault", "--world-size", "2", "--timeout", "5", cwd=tmp_path, timeout=120)
    took = time.monotonic() - start
    lines = p.stderr.decode().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "rank 1 did not finish within --timeout 5 s" in lines[0], lines
    assert took < 5 + 4, took  # the limit, plus starting and reaping the ranks
    assert rank_folders() == before


def test_lone_rank_under_torchrun_variables_stops_at_the_timeout(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(ENV, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    start = time.monotonic()
    p = subprocess.run([BIN, "run", "--model", "mlp", "--timeout", "4"], cwd=tmp_path, env=env, capture_output=True, timeout=60)
    took = time.monotonic() - start
    lines = p.stderr.decode().splitlines()
    assert p.returncode == 2 and len(lines) == 1, lines
    assert "4 s" in lines[0], lines
    assert took < 4 + 3, took


def start_hung_run(folder, *extra):
    """A two-rank run whose rank 1 hangs, once both ranks have started."""
    p = subprocess.Popen([BIN, "run", "--model", "faulty/rank-fault", "--world-size", "2", "--timeout", "60", *extra],
                         cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    deadline = time.monotonic() + 30
    ranks = []
    while time.monotonic() < deadline and len(ranks) < 2:
        ranks = children_of(p.pid)
        time.sleep(0.1)
    assert len(ranks) == 2, ranks
    return p, ranks


@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_launcher_stops_the_ranks(tmp_path, signo):
    before = rank_folders()
    p, ranks = start_hung_run(tmp_path, "--report", "json=r.json")
    time.sleep(1.0)
    start = time.monotonic()
    p.send_signal(signo)
    out, err = p.communicate(timeout=30)
    assert time.monotonic() - start < 5
    assert p.returncode == 128 + signo, (p.returncode, err)
    lines = err.decode().splitlines()
    assert len(lines) == 1 and "stopped by" in lines[0], lines
    time.sleep(0.2)
    assert not [r for r in ranks if alive(r)]
    assert not (tmp_path / "r.json").exists()
    assert rank_folders() == before


def test_ranks_die_with_a_killed_launcher(tmp_path):
    before = rank_folders()
    p, ranks = start_hung_run(tmp_path)
    p.kill()
    p.wait()
    time.sleep(1.0)
    assert not [r for r in ranks if alive(r)]
    # SIGKILL leaves the launcher no chance to clean up; remove what it left.
    for f in rank_folders() - before:
        subprocess.run(["rm", "-rf", os.path.join(TMP, f)])


def test_failed_and_passing_runs_leave_no_rank_folder(tmp_path):
    before = rank_folders()
    p = ckcheck("run", "--model", "faulty/rank-fault", "--rank-fault", "crash", "--world-size", "2", "--timeout", "30", cwd=tmp_path)
    assert p.returncode == 2 and "rank 1 failed" in p.stderr.decode()
    p = ckcheck("run", "--model", "mlp", "--world-size", "2", "--timeout", "60", "--checks", "gradients", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert rank_folders() == before
