"""ckcheck's pytest plugin (entry point pytest11, on once the package is installed).

A marker checks a model factory before the test runs; a fixture checks a model inside it. Either
fails the test with ckcheck's console report as the message:

    @pytest.mark.ckcheck(factory=make_model, checkpoint="torch")   # or factory="pkg.models:make_model"
    def test_checkpointing_changes_nothing():
        ...

    def test_my_block(ckcheck_equivalent):
        ckcheck_equivalent(model, (x,), checkpoint="torch-reentrant")

factory: what `ckcheck run --model` takes -- a callable returning an nn.Module, (module, inputs[,
loss]) or a dict with model and any of inputs, args, kwargs, loss, enable, disable -- or its
"package.module:callable" / "FILE.py:callable" name. The other keywords are ckcheck.run's.

The marker runs the factory's model in a child process (`python -m ckcheck run`, with this session's
sys.path) by default, isolate=True: a model that exits the process (os._exit), crashes or hangs
fails the test instead of ending or holding the pytest session (timeout=, seconds, default 900,
bounds it). A factory that cannot be named for another process (a lambda, a closure) or options
that are callables run in this process; isolate=False asks for that. The fixture takes a model
object and runs in this process.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile

import pytest

import ckcheck

# The marker's bound on a model run in a child process, in seconds.
DEFAULT_TIMEOUT = 900

MARKER = "ckcheck(factory=..., **options): check that checkpointing the model the factory makes changes " \
         "nothing (ckcheck.check_factory) before the test runs; the test fails with ckcheck's report"


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)


def _fail_unless_equivalent(report):
    if not report.passed:
        pytest.fail(report.console, pytrace=False)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    for marker in item.iter_markers(name="ckcheck"):
        options = dict(marker.kwargs)
        if marker.args:
            if "factory" in options or len(marker.args) > 1:
                pytest.fail("@pytest.mark.ckcheck takes one factory (positional or factory=) and ckcheck.run's "
                            "keywords", pytrace=False)
            options["factory"] = marker.args[0]
        if "factory" not in options:
            pytest.fail("@pytest.mark.ckcheck needs factory= (a callable or 'package.module:callable')",
                        pytrace=False)
        factory = options.pop("factory")
        isolate = options.pop("isolate", True)
        timeout = options.pop("timeout", DEFAULT_TIMEOUT)
        spec = _spec_of(factory) if isolate else None
        if spec is not None and _command_line(options) is not None:
            _fail_unless_equivalent(_isolated(spec, options, timeout))
            continue
        try:
            report = ckcheck.check_factory(factory, **options)
        except ckcheck.UsageError as e:
            pytest.fail(f"ckcheck: {e}", pytrace=False)
        _fail_unless_equivalent(report)


def _spec_of(factory):
    """The name another process imports the factory by ("module:callable" or as given), or None."""
    if isinstance(factory, str):
        return factory
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname or "." in qualname:
        return None
    try:
        if getattr(importlib.import_module(module), qualname, None) is not factory:
            return None
    except Exception:
        return None
    return f"{module}:{qualname}"


def _command_line(options):
    """ckcheck run's flags for the marker's keywords, or None where one is not a plain value."""
    flags = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key == "preserve_rng_state":
            if value is False:
                flags.append("--no-preserve-rng")
            elif value is not True:
                return None
        elif value is None or value is False:
            continue
        elif value is True:
            flags.append(flag)
        elif isinstance(value, (str, int, float)):
            flags += [flag, str(value)]
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            flags += [flag, ",".join(value)]
        else:
            return None
    return flags


def _ended(proc):
    """How a child that wrote no report ended, in words."""
    import signal

    if proc.returncode < 0:
        return f"the model's process was killed by {signal.Signals(-proc.returncode).name}"
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("ckcheck: error: ")]
    if lines:
        return lines[-1][len("ckcheck: error: "):]
    return (f"the model exited the process itself with status {proc.returncode} (os._exit or sys.exit in the "
            f"model?)")


def _isolated(spec, options, timeout):
    """check_factory's report, from `python -m ckcheck run` in a child process."""
    with tempfile.TemporaryDirectory(prefix="ckcheck-marker-") as folder:
        path = os.path.join(folder, "report.json")
        argv = [sys.executable, "-m", "ckcheck", "run", "--model", spec, *_command_line(options),
                "--timeout", str(int(timeout)), "--report", f"json={path}"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ckcheck: the model of {spec} did not finish within {timeout} s (the marker's timeout=)",
                        pytrace=False)
        if not os.path.exists(path):
            pytest.fail(f"ckcheck: {_ended(proc)} (the model of {spec} ran in a child process; no report)",
                        pytrace=False)
        with open(path) as f:
            return ckcheck.Report(json.load(f), proc.stdout)


@pytest.fixture
def ckcheck_equivalent():
    """ckcheck_equivalent(model, inputs=None, **options): ckcheck.run on the model; the test fails
    with the console report unless checkpointing changes nothing. Returns the Report."""

    def check(model, inputs=None, **options):
        return _fail_unless_equivalent(ckcheck.run(model, inputs, **options))

    return check
