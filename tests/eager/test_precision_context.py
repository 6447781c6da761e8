"""A recompute outside the precision context its forward ran under: float8 training (torchao,
emulated on the CPU) switched on by a context the model enters around its blocks, as Transformer
Engine's fp8_autocast is -- a checkpointed block's recompute runs in the backward, outside it. Its
twin enters the context inside each block. Truth from PyTorch alone: the same blocks under
torch.utils.checkpoint against none, same weights and batch."""

import subprocess

import pytest
import torch

pytest.importorskip("torchao.float8")

import ckcheck  # noqa: E402
from conftest import ckcheck_bin, fixture, fixture_module  # noqa: E402

FILE = "precision_context.py"


def pytorch_differs(name, reentrant):
    """Whether PyTorch alone gives other gradients (or refuses the step) with every block checkpointed."""

    def grads(checkpointed):
        model, x = getattr(fixture_module(FILE), name)()
        if checkpointed:
            for block in model.blocks:
                block.forward = (lambda *a, f=block.forward: torch.utils.checkpoint.checkpoint(
                    f, *a, use_reentrant=reentrant))
        model(x).square().sum().backward()
        return [p.grad for p in model.parameters()]

    plain = grads(False)
    try:
        ckpt = grads(True)
    except torch.utils.checkpoint.CheckpointError:
        return True
    return any(a is None or b is None or not torch.equal(a, b) for a, b in zip(plain, ckpt))


@pytest.mark.parametrize("checkpoint, reentrant", [("torch", False), ("torch-reentrant", True)])
def test_a_recompute_outside_its_float8_context_is_found_naming_the_op(checkpoint, reentrant):
    assert pytorch_differs("float8_context_lost", reentrant)
    model, x = fixture_module(FILE).float8_context_lost()
    report = ckcheck.run(model, (x,), checkpoint=checkpoint, loss=lambda out: out.square().sum())
    assert not report.passed, report.console
    autocast = report.check("autocast")
    assert autocast.status == ckcheck.Status.FAIL, report.console
    sites = {f.site for f in autocast.findings}
    assert sites == {"blocks.0", "blocks.1"}, report.console
    for f in autocast.findings:
        assert f.cause == ckcheck.Cause.PRECISION_CONTEXT and "Float8" in f.tensor, report.console
    assert {f.cause for f in report.check("gradients").findings} == {ckcheck.Cause.PRECISION_CONTEXT}, report.console


@pytest.mark.parametrize("checkpoint, reentrant", [("torch", False), ("torch-reentrant", True)])
def test_the_context_entered_inside_each_block_passes(checkpoint, reentrant):
    assert not pytorch_differs("float8_context_kept", reentrant)
    model, x = fixture_module(FILE).float8_context_kept()
    report = ckcheck.run(model, (x,), checkpoint=checkpoint, loss=lambda out: out.square().sum())
    assert report.passed, report.console


def test_the_command_line_names_the_cause():
    out = subprocess.run([ckcheck_bin(), "run", "--model", fixture(FILE + ":float8_context_lost")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "precision-context" in out.stdout and "Float8_e4m3fn" in out.stdout, out.stdout
