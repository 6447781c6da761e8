"""The Python package installs with one pip command and works from elsewhere."""


def test_the_package_installs_with_one_pip_command(tmp_path):
    """pip install --no-build-isolation ./python, into a folder, then used from elsewhere."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, ckcheck_bin

    env = dict(os.environ, CKCHECK_BUILD_DIR=os.path.dirname(os.path.abspath(ckcheck_bin())))
    env.pop("PYTHONPATH", None)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                    "--disable-pip-version-check", "--target", str(target), os.path.join(ROOT, "python")],
                   check=True, env=env, capture_output=True, timeout=900)
    code = ("import ckcheck, torch; m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)); "
            "print(ckcheck.__file__); print(ckcheck.run(m, torch.randn(2, 4))['verdict'])")
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(target)), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    assert out[0].startswith(str(target)) and out[1] == "pass"
