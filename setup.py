"""Builds ckcheck's C++ core with the repository's CMake build (scripts/build.sh) against the
torch of the Python that runs pip, and puts the extension (ckcheck/_core.so) and the ckcheck
program (ckcheck/_bin/ckcheck) into the package.

Under pip's build isolation the build environment has no torch; the build runs this same Python
without that isolation, so it finds the torch installed where the package is going.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


def _outside_isolation() -> dict:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PEP517_BUILD_BACKEND"):
        env.pop(name, None)
    return env


class BuildCore(build_py):
    def run(self):
        super().run()
        build = os.environ.get("CKCHECK_BUILD_DIR", os.path.join(ROOT, "build"))
        env = dict(_outside_isolation(), CKCHECK_VENV_PYTHON=sys.executable, CKCHECK_BUILD_DIR=build,
                   CKCHECK_TARGETS="ckcheck_cli ckcheck_python")
        if subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True).returncode != 0:
            sys.exit("ckcheck: torch is not installed in this Python; pip install torch first")
        subprocess.check_call(["bash", os.path.join(ROOT, "scripts", "build.sh")], env=env)
        target = os.path.join(self.build_lib, "ckcheck")
        os.makedirs(os.path.join(target, "_bin"), exist_ok=True)
        shutil.copy2(os.path.join(build, "python", "ckcheck", "_core.so"), target)
        shutil.copy2(os.path.join(build, "python", "ckcheck", "_built.py"), target)  # the torch it links against
        shutil.copy2(os.path.join(build, "ckcheck"), os.path.join(target, "_bin", "ckcheck"))


def _version() -> str:
    """project(ckcheck VERSION X.Y.Z) of CMakeLists.txt: what `ckcheck --version` says too."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(ckcheck VERSION ([0-9.]+)", f.read()).group(1)


def _torch_requirement() -> str:
    """torch== the release the core is built against (the torch of the Python that runs the build):
    the core links against that LibTorch, so no other torch will load it."""
    found = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                           env=_outside_isolation(), capture_output=True, text=True)
    return f"torch=={found.stdout.strip()}" if found.returncode == 0 and found.stdout.strip() else "torch"


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: built for this machine's torch


# setuptools' own build folder stays out of CMake's (./build).
os.makedirs(os.path.join(ROOT, "build", "setuptools"), exist_ok=True)
setup(version=_version(), install_requires=[_torch_requirement()], cmdclass={"build_py": BuildCore},
      distclass=BinaryDistribution,
      options={"build": {"build_base": os.path.join("build", "setuptools")}, "egg_info": {"egg_base": os.path.join("build", "setuptools")}})
