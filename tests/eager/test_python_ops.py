"""Custom ops written in Python (fixtures/python/ops.py, torch.library) get from `ckcheck
validate-op --import` and from ckcheck.validate_op the verdicts their C++ twins get
(tests/ops/test_ops.cpp, TORCH_LIBRARY), check by check."""

import importlib.util
import os

import pytest
import torch

import ckcheck as ckcheck_package
from conftest import ROOT, ckcheck_bin, fixture

OPS = fixture("ops.py")


def cpp_ops_library():
    return os.path.join(os.path.dirname(ckcheck_bin()), "tests", "ops", "libckcheck_test_ops.so")


def statuses(report):
    return {c["id"]: c["status"] for c in report["checks"]}


def causes(report):
    return {f["cause"] for c in report["checks"] for f in c["findings"]}


def load_ops():
    """fixtures/python/ops.py, imported once into this process (its ops register once)."""
    if not hasattr(torch.ops.ckcheck_pyops, "clean"):
        spec = importlib.util.spec_from_file_location("ckcheck_fixture_ops", OPS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return torch.ops.ckcheck_pyops


# ---- PyTorch alone: what makes each op unsafe to recompute -------------------------------------
def test_pytorch_alone_the_unsafe_python_ops_do_what_they_are_said_to():
    ops = load_ops()
    x = torch.randn(4, 16)
    first, second = ops.stateful(x), ops.stateful(x)
    assert not torch.equal(first, second)  # state across calls
    y = x.clone()
    ops.mutating(y)
    assert not torch.equal(x, y)  # wrote its input, whose schema is not (a!)
    state = torch.get_rng_state()
    a = ops.numpy_noise(x)
    torch.set_rng_state(state)
    assert not torch.equal(a, ops.numpy_noise(x))  # torch's generator replayed, NumPy's not
    torch.set_rng_state(state)
    b = ops.random(x)
    torch.set_rng_state(state)
    assert torch.equal(b, ops.random(x))  # torch's generator replayed: the same draw
    assert torch.equal(ops.clean(x, x), ops.clean(x, x))


# ---- the command line: --import, against the C++ twins ------------------------------------------
@pytest.mark.parametrize("name, shapes", [("clean", "4x16,4x16"), ("stateful", "4x16"), ("mutating", "4x16"),
                                          ("random", "4x16")])
def test_a_python_op_gets_the_verdict_of_its_cpp_twin(ckcheck, name, shapes):
    cpp = ckcheck("validate-op", "--library", cpp_ops_library(), "--op", f"ckcheck_test::{name}", "--shapes", shapes)
    py = ckcheck("validate-op", "--import", OPS, "--op", f"ckcheck_pyops::{name}", "--shapes", shapes)
    assert cpp.code in (0, 1), cpp.out + cpp.err
    assert py.code == cpp.code, py.out + py.err
    assert statuses(py.report) == statuses(cpp.report), (cpp.out, py.out)
    assert causes(py.report) == causes(cpp.report), (cpp.out, py.out)


def test_a_python_op_drawing_outside_torchs_generator_is_unsafe_and_custom_op_with_autograd_is_safe(ckcheck):
    bad = ckcheck("validate-op", "--import", OPS, "--op", "ckcheck_pyops::numpy_noise", "--shapes", "4x16")
    assert bad.code == 1, bad.out + bad.err
    assert "UNSAFE" in bad.out
    # negative control: torch.library.custom_op with its own autograd formula
    good = ckcheck("validate-op", "--import", OPS, "--op", "ckcheck_pyops::scaled", "--shapes", "4x16")
    assert good.code == 0, good.out + good.err
    assert "SAFE to recompute" in good.out


@pytest.mark.parametrize("args, message", [
    (["--import", "no_such_module_xyz"], "--import no_such_module_xyz: cannot import it: ModuleNotFoundError"),
    (["--import", "missing_ops.py"], "--import missing_ops.py: no such file"),
    (["--import", OPS, "--op", "ckcheck_pyops::nope"], "no op ckcheck_pyops::nope is registered"),
])
def test_a_bad_import_or_op_is_one_line_and_exit_2(ckcheck, args, message):
    if "--op" not in args:
        args = args + ["--op", "ckcheck_pyops::clean"]
    r = ckcheck("validate-op", *args)
    assert r.code == 2, r.out + r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.err


# ---- the Python API ----------------------------------------------------------------------------
def test_validate_op_from_python_gives_the_command_lines_verdicts(ckcheck):
    ops = load_ops()
    for op, shapes in ((ops.clean, [(4, 16), (4, 16)]), (ops.stateful, [(4, 16)]), (ops.mutating.default, [(4, 16)]),
                       ("ckcheck_pyops::random", "4x16")):
        report = ckcheck_package.validate_op(op, shapes=shapes)
        name = op if isinstance(op, str) else report["model"]["name"]
        cli = ckcheck("validate-op", "--import", OPS, "--op", name,
                      "--shapes", shapes if isinstance(shapes, str) else ",".join("x".join(map(str, s)) for s in shapes))
        assert statuses(report) == statuses(cli.report), name
        assert report["verdict"] == cli.report["verdict"], name
        assert "console" in report
    with pytest.raises(ckcheck_package.UsageError, match="not a registered op"):
        ckcheck_package.validate_op(lambda x: x)
