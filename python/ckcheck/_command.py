"""The `ckcheck` command of an installed ckcheck: the C++ program shipped in the package
(ckcheck/_bin/ckcheck), started with the libraries of the torch installed beside it and this
Python for Python models. Where the package has no program (a build tree), the command line runs
in this process, as `python -m ckcheck`."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys


def _torch_libraries() -> list:
    """The folders of the installed torch's shared libraries and of the NVIDIA wheels it uses."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    torch_dir = list(spec.submodule_search_locations)[0]
    site = os.path.dirname(torch_dir)
    folders = [os.path.join(torch_dir, "lib")]
    folders += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
    return [f for f in folders if os.path.isdir(f)]


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    program = os.path.join(here, "_bin", "ckcheck")
    if not os.access(program, os.X_OK):
        from ckcheck import main as in_process

        sys.exit(in_process(sys.argv[1:]))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(_torch_libraries() + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    env.setdefault("CKCHECK_PYTHON", sys.executable)  # Python models run in this Python
    env["CKCHECK_PYTHON_PACKAGE_DIR"] = ""  # ... which imports this installed package by itself
    os.execve(program, ["ckcheck", *sys.argv[1:]], env)


if __name__ == "__main__":
    main()
