"""The Python package installs with one pip command and works from elsewhere, its pytest plugin
included (a scratch project with its own models, no path into the repository)."""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, ckcheck_bin


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """pip install --no-build-isolation . (the repository) into a folder: (its path, the environment)."""
    env = dict(os.environ, CKCHECK_BUILD_DIR=os.path.dirname(os.path.abspath(ckcheck_bin())))
    env.pop("PYTHONPATH", None)
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                    "--disable-pip-version-check", "--target", str(target), ROOT],
                   check=True, env=env, capture_output=True, timeout=900)
    return target, dict(env, PYTHONPATH=str(target))


def test_the_package_installs_with_one_pip_command(installed, tmp_path):
    target, env = installed
    code = ("import ckcheck, torch; m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)); "
            "print(ckcheck.__file__); print(ckcheck.run(m, torch.randn(2, 4)).verdict)")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    assert out[0].startswith(str(target)) and out[1] == "pass"


MODELS = '''
import torch


class Blocks(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8) if norm else torch.nn.GELU())
            for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def clean():
    return Blocks(norm=False), torch.randn(4, 8)


def batchnorm():
    # torch.utils.checkpoint runs the forward again: the running statistics move twice.
    return Blocks(norm=True), torch.randn(4, 8)
'''

TESTS = '''
import pytest

from models import batchnorm, clean


@pytest.mark.ckcheck(factory=clean, checkpoint="torch")
def test_clean_by_marker():
    pass


@pytest.mark.ckcheck("models:batchnorm", checkpoint="torch")
def test_batchnorm_by_marker():
    pass


def test_clean_by_fixture(ckcheck_equivalent):
    model, x = clean()
    assert ckcheck_equivalent(model, (x,), checkpoint="torch").verdict == "pass"


def test_batchnorm_by_fixture(ckcheck_equivalent):
    model, x = batchnorm()
    ckcheck_equivalent(model, (x,), checkpoint="torch")
'''


def test_the_pytest_plugin_checks_a_scratch_projects_models(installed, tmp_path):
    """The plugin is on through its pytest11 entry point: the clean model passes, the planted
    BatchNorm double update fails with the console report as the message."""
    _, env = installed
    project = tmp_path / "project"
    project.mkdir()
    (project / "models.py").write_text(textwrap.dedent(MODELS))
    (project / "test_models.py").write_text(textwrap.dedent(TESTS))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "test_models.py"],
                          env=env, cwd=project, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 failed, 2 passed" in out, out
    for test in ("test_clean_by_marker", "test_clean_by_fixture"):
        assert f"PASSED test_models.py::{test}" in out, out
    for test in ("test_batchnorm_by_marker", "test_batchnorm_by_fixture"):
        assert f"FAILED test_models.py::{test}" in out, out
    # The message is the console report: the failing check, its site and cause, and how to reproduce.
    assert "buffers" in out and "blocks.0" in out and "buffer-update" in out, out
    assert "reproduce: ckcheck run --model models:batchnorm" in out, out
    assert "Traceback" not in out, out
