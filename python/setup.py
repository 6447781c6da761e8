"""Builds ckcheck._core with the repository's CMake build (scripts/build.sh, against the torch of
the Python that runs pip) and installs it with the package:

    pip install --no-build-isolation ./python

--no-build-isolation: the module is built against the torch already installed, which it must be
loaded beside (a build environment would fetch another torch).
"""
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class BuildCore(build_py):
    def run(self):
        super().run()
        build = os.environ.get("CKCHECK_BUILD_DIR", os.path.join(ROOT, "build"))
        env = dict(os.environ, CKCHECK_VENV_PYTHON=sys.executable, CKCHECK_BUILD_DIR=build,
                   CKCHECK_TARGETS="ckcheck_python")
        subprocess.check_call(["bash", os.path.join(ROOT, "scripts", "build.sh")], env=env)
        target = os.path.join(self.build_lib, "ckcheck")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(os.path.join(build, "python", "ckcheck", "_core.so"), target)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: _core.so is built for this machine's torch


setup(cmdclass={"build_py": BuildCore}, distclass=BinaryDistribution)
