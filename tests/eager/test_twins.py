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


# ---- a fix names what the checkpoint under test offers -----------------------------------------
def test_a_buffer_update_hint_speaks_of_the_checkpoint_under_test(ckcheck):
    def hints(mode):
        r = ckcheck("run", "--model", fixture("twins.py:convnet"), "--checkpoint", mode)
        assert r.code == 1, r.out + r.err
        found = [f for f in r.check("buffers")["findings"] if f["cause"] == "buffer-update"]
        assert found, r.out
        return {f["hint"] for f in found}

    for mode in ("torch", "torch-reentrant"):
        for hint in hints(mode):
            assert "torch.utils.checkpoint" in hint and "--restore-buffers" not in hint, hint
            assert "is_recomputing" not in hint, hint
    # negative control: under ckcheck's own checkpoint its --restore-buffers is the fix
    assert all("--restore-buffers" in h for h in hints("ckcheck"))


def test_a_diagnosis_speaks_of_the_checkpoint_under_test(ckcheck):
    """diagnose (and run --diagnose) give the diagnosed site the fix of the checkpoint under test."""
    def site_hints(*args):
        r = ckcheck(*args, "--model", fixture("twins.py:faulty_stateful_counter"))
        assert r.code == 1, r.out + r.err
        sites = [s for s in r.report["diagnosis"]["sites"] if s["cause"] == "stateful"]
        assert sites, r.out
        return [s["hint"] for s in sites]

    for args in (("diagnose", "--checkpoint", "torch"), ("run", "--diagnose", "--checkpoint", "torch-reentrant")):
        for hint in site_hints(*args):
            assert "torch.utils.checkpoint" in hint and "is_recomputing" not in hint, (args, hint)
    # negative control: ckcheck's own checkpoint offers is_recomputing()
    assert all("is_recomputing" in h for h in site_hints("diagnose", "--checkpoint", "ckcheck"))
