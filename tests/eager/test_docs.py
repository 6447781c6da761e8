"""The docs' commands run as written: every `ckcheck ...` line of a ```sh block in README.md and
docs/*.md runs, from a folder that has the repository's fixtures and build, and ends with the exit
status its comment gives (`# exit N`; 0 when none). ```text blocks are synopses with the user's own
files and are not run."""

import glob
import os
import re
import subprocess

import pytest

from conftest import ROOT, ckcheck_bin

PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
# Pages about a command or an API: each shows at least one command that runs.
COMMAND_PAGES = ["run.md", "diagnose.md", "bench.md", "plan.md", "validate-op.md", "list.md", "python.md", "report.md",
                 "data-parallel.md", "selftest.md"]


def commands(path):
    """(line number, command, expected exit status) of each ckcheck command in the page's sh blocks."""
    out = []
    text = open(path).read()
    for block in re.finditer(r"^```sh\n(.*?)^```", text, re.S | re.M):
        first = text[: block.start()].count("\n") + 2
        logical, start = "", None
        for offset, line in enumerate(block.group(1).split("\n")):
            if start is None:
                start = first + offset
            logical += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
            if line.endswith("\\"):
                continue
            if logical.split()[:1] == ["ckcheck"]:
                status = re.search(r"#.*\bexit (\d)", logical)
                out.append((start, logical.strip(), int(status.group(1)) if status else 0))
            logical, start = "", None
    return out


CASES = [(os.path.relpath(p, ROOT), line, cmd, code) for p in PAGES for line, cmd, code in commands(p)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with the repository's fixtures and build, and `ckcheck` on PATH."""
    folder = tmp_path_factory.mktemp("docs")
    os.symlink(os.path.join(ROOT, "fixtures"), folder / "fixtures")
    os.symlink(os.path.dirname(os.path.abspath(ckcheck_bin())), folder / "build")
    (folder / "bin").mkdir()
    os.symlink(os.path.abspath(ckcheck_bin()), folder / "bin" / "ckcheck")
    return folder


@pytest.mark.parametrize("page, line, command, expected", CASES,
                         ids=[f"{page}:{line}" for page, line, _, _ in CASES])
def test_a_documented_command_runs_as_written(workdir, page, line, command, expected):
    env = dict(os.environ, PATH=f"{workdir / 'bin'}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == expected, f"{page}:{line}: {command}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("page", COMMAND_PAGES)
def test_every_command_page_shows_a_command_that_runs(page):
    assert commands(os.path.join(ROOT, "docs", page)), f"docs/{page} has no ckcheck command in a sh block"


def test_the_readme_is_a_front_door():
    assert len(open(os.path.join(ROOT, "README.md")).read().splitlines()) <= 150
