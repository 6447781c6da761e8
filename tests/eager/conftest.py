import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "fixtures", "python")


def ckcheck_bin():
    return os.environ.get("CKCHECK_BIN") or os.path.join(ROOT, "build", "ckcheck")


class Run:
    def __init__(self, proc, report):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.report = report

    def check(self, check_id):
        return next(c for c in self.report["checks"] if c["id"] == check_id)

    def statuses(self):
        return {c["id"]: c["status"] for c in self.report["checks"]}


@pytest.fixture
def ckcheck(tmp_path):
    """Runs the ckcheck binary; returns a Run with the JSON report (None when there is none)."""

    def run(*args, timeout=600):
        path = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
        argv = [ckcheck_bin(), *map(str, args)]
        if args and args[0] in ("run", "diagnose", "bench", "validate-op", "selftest"):
            argv += ["--report", f"json={path}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        report = json.loads(path.read_text()) if path.exists() else None
        return Run(proc, report)

    return run


def fixture(name):
    """fixtures/python/NAME, as an absolute path (NAME may end in :factory)."""
    return os.path.join(FIXTURES, name)


def fixture_module(file):
    """fixtures/python/FILE, loaded as a module of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ckcheck_fixture_" + file.replace(".py", ""), fixture(file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def factory_result(file, name):
    """fixtures/python/FILE's factory NAME called (weights from seed 0): what it returns."""
    import torch

    module = fixture_module(file)
    torch.manual_seed(0)
    return getattr(module, name)()


def twin(name):
    """fixtures/python/twins.py's factory NAME called (weights from seed 0): (model, inputs)."""
    return factory_result("twins.py", name)
