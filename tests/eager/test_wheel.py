"""`pip wheel .` at the repository root makes a wheel that installs into a fresh venv with nothing
to build; there the `ckcheck` command and the pytest plugin work. The venv sees only torch (and
pytest, for the scratch project), each with what it requires, from this venv's site-packages."""

import glob
import importlib.metadata as md
import os
import re
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

from conftest import ROOT, ckcheck_bin
from test_package import MODELS, TESTS


def _closure(names):
    """The distributions `names` need, with everything they require (installed ones only)."""
    seen, todo = {}, list(names)
    while todo:
        name = re.split(r"[\s;<>=!~\[(]", todo.pop(), maxsplit=1)[0]
        key = name.lower().replace("_", "-")
        if not key or key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        todo += [r for r in (dist.requires or []) if "extra ==" not in r]
    return list(seen.values())


def _only(names, folder):
    """A folder with links to the files of `names` and their requirements, nothing else."""
    os.makedirs(folder)
    for dist in _closure(names):
        for top in {str(f).split("/")[0] for f in dist.files or []}:
            source = os.path.join(str(dist.locate_file("")), top)
            target = os.path.join(folder, top)
            if os.path.exists(source) and not os.path.lexists(target) and not top.startswith(".."):
                os.symlink(source, target)
    return folder


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """(the venv's folder, the wheel's file name, seconds pip took to install it)."""
    base = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, CKCHECK_BUILD_DIR=os.path.dirname(os.path.abspath(ckcheck_bin())))
    env.pop("PYTHONPATH", None)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(base / "dist"), ROOT],
                   check=True, env=env, capture_output=True, timeout=1800)
    wheel = glob.glob(str(base / "dist" / "ckcheck-*.whl"))[0]
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    site = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0]
    deps = _only(["torch", "pytest", "pip"], str(base / "deps"))
    with open(os.path.join(site, "torch-and-pytest.pth"), "w") as f:
        f.write(deps + "\n")
    start = time.monotonic()
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", wheel], check=True, env=env, capture_output=True, timeout=600)
    return venv, wheel, time.monotonic() - start


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CKCHECK_BIN", "CKCHECK_PYTHON")}
    return env


def test_the_wheel_carries_the_built_core_and_command(fresh):
    _, wheel, seconds = fresh
    names = zipfile.ZipFile(wheel).namelist()
    assert "ckcheck/_core.so" in names and "ckcheck/_bin/ckcheck" in names, names
    assert "ckcheck/_built.py" in names, names
    assert any(n.endswith("entry_points.txt") for n in names)
    print(f"pip installed the wheel in {seconds:.1f} s")


def test_the_wheel_requires_the_torch_its_core_links_against(fresh):
    """The core links against one LibTorch: the wheel's metadata pins torch to it."""
    import torch

    _, wheel, _ = fresh
    archive = zipfile.ZipFile(wheel)
    metadata = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    # What every install needs: that torch alone. The extras ([hf], [lightning], [qlora], [float8])
    # pin the versions the loop and recipe tests run.
    needed = [line for line in requires if "extra ==" not in line]
    assert needed == [f"Requires-Dist: torch=={torch.__version__.split('+')[0]}"], requires
    extras = [line for line in requires if "extra ==" in line]
    assert extras and all("==" in line.split(";")[0] for line in extras), extras


def test_another_torch_is_refused_at_import_with_one_line(fresh, tmp_path):
    """A torch that reports another version (a stand-in package that shadows the real one): import
    ckcheck raises ImportError naming both versions, before the core is loaded."""
    import torch

    venv, _, _ = fresh
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "1.13.1"\n')
    env = dict(_env(), PYTHONPATH=str(tmp_path / "fake"))
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", "import ckcheck"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    built = torch.__version__.split("+")[0]
    assert last.startswith("ImportError: ckcheck was built against torch " + built), last
    assert "1.13.1" in last, last


def test_the_installed_command_runs_from_the_fresh_venv(fresh, tmp_path):
    venv, wheel, _ = fresh
    command = str(venv / "bin" / "ckcheck")
    version = subprocess.run([command, "--version"], env=_env(), cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    # One version: the wheel's is the program's (both from CMakeLists.txt).
    assert version.returncode == 0 and f"ckcheck {os.path.basename(wheel).split('-')[1]}\n" in version.stdout, \
        version.stdout + version.stderr
    builtin = subprocess.run([command, "run", "--model", "mlp"], env=_env(), cwd=tmp_path, capture_output=True,
                             text=True, timeout=600)
    assert builtin.returncode == 0, builtin.stdout + builtin.stderr
    (tmp_path / "models.py").write_text(textwrap.dedent(MODELS))
    python_model = subprocess.run([command, "run", "--model", "models.py:batchnorm", "--checkpoint", "torch"],
                                  env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert python_model.returncode == 1 and "buffer-update" in python_model.stdout, \
        python_model.stdout + python_model.stderr
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import ckcheck; print(ckcheck.__file__)"],
                           env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr


def test_the_plugin_works_in_a_scratch_project_of_the_fresh_venv(fresh, tmp_path):
    venv, _, _ = fresh
    (tmp_path / "models.py").write_text(textwrap.dedent(MODELS))
    (tmp_path / "test_models.py").write_text(textwrap.dedent(TESTS))
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                           "test_models.py"], env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "2 failed, 2 passed" in out, out
    assert "FAILED test_models.py::test_batchnorm_by_marker" in out and "buffer-update" in out, out
