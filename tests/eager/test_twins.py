"""The Python twins of the built-in C++ fixtures (fixtures/python/twins.py) give the C++ fixtures'
verdicts, check by check and cause by cause, under the same checkpoint."""

import pytest

from conftest import fixture


def causes(check):
    return {(f["cause"], f["site"]) for f in check["findings"]}


# ---- the Python twins of the built-in fixtures give the C++ fixtures' verdicts ----------------
TWINS = ["mlp", "transformer", "convnet", "faulty/inplace-input", "faulty/stateful-counter",
         "faulty/private-generator", "faulty/nondeterministic-op", "faulty/nan-log"]


@pytest.mark.parametrize("name", TWINS)
def test_python_twin_gives_the_verdicts_of_the_cpp_fixture(ckcheck, name):
    cpp = ckcheck("run", "--model", name)
    # the same checkpoint on both sides: ckcheck's (a Python model's default is torch's)
    py = ckcheck("run", "--model", fixture("twins.py:" + name.replace("/", "_").replace("-", "_")),
                 "--checkpoint", "ckcheck")
    assert cpp.code == py.code, cpp.out + py.out + py.err
    assert cpp.statuses() == py.statuses(), (cpp.out, py.out)
    for check in cpp.report["checks"]:
        assert {c for c, _ in causes(check)} == {c for c, _ in causes(py.check(check["id"]))}, check["id"]
