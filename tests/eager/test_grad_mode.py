"""A segment whose values depend on grad mode (scaled_dot_product_attention with a mask that
requires grad takes another kernel than without): a checkpoint that runs its forward without
autograd and its recompute with it gives other gradients than the plain step, by rounding (the
same math in another kernel), and ckcheck warns with the cause grad-mode and passes. PyTorch alone
says which steps differ, and, rerun in float64, that the differences shrink with the precision;
the fixed-slope twin and the non-reentrant checkpoint are the negative controls.
"""

import copy

import pytest
import torch
import torch.utils.checkpoint as tc

from conftest import factory_result, fixture

FACTORIES = ["learned_attention_bias", "fixed_attention_bias"]


def _grads(model, x, mode, dtype=torch.float32):
    """PyTorch alone: one step from a copy of `model` in `dtype`, every block plain or under
    torch's checkpoint (mode "plain", "reentrant" or "non-reentrant")."""
    m = copy.deepcopy(model).to(dtype)
    x = x.to(dtype)
    if mode != "plain":
        for b in m.blocks:
            b.forward = lambda h, f=b.forward: tc.checkpoint(f, h, use_reentrant=mode == "reentrant")
    m(x).square().sum().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def _largest_difference(factory, mode, dtype=torch.float32):
    model, x = factory_result("grad_mode.py", factory)
    plain, checkpointed = _grads(model, x, "plain", dtype), _grads(model, x, mode, dtype)
    return max((plain[n].double() - checkpointed[n].double()).abs().max().item() for n in plain)


def _pytorch_step_differs(factory, mode):
    return _largest_difference(factory, mode) > 0


@pytest.mark.parametrize("factory,differs", [("learned_attention_bias", True), ("fixed_attention_bias", False)])
def test_pytorch_alone_a_block_with_a_learned_mask_computes_other_values_without_autograd(factory, differs):
    model, _ = factory_result("grad_mode.py", factory)
    block = model.blocks[0]
    h = torch.randn(2, 16, 32)
    with torch.no_grad():
        without = block(h)
    assert (not torch.equal(without, block(h).detach())) == differs


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("mode", ["torch-reentrant", "torch"])
def test_the_verdict_is_pytorchs_and_the_cause_is_grad_mode(ckcheck, factory, mode):
    differs = _pytorch_step_differs(factory, "reentrant" if mode == "torch-reentrant" else "non-reentrant")
    r = ckcheck("run", "--model", fixture(f"grad_mode.py:{factory}"), "--checkpoint", mode)
    gradients = r.check("gradients")
    causes = {f["cause"] for f in gradients["findings"]}
    if differs:
        # PyTorch alone in float64: the difference shrinks with the precision -- rounding.
        f64 = _largest_difference(factory, "reentrant" if mode == "torch-reentrant" else "non-reentrant", torch.float64)
        f32 = _largest_difference(factory, "reentrant" if mode == "torch-reentrant" else "non-reentrant")
        assert f64 < 1e-6 * f32, (f32, f64)
        assert r.code == 0 and gradients["status"] == "warn", r.out + r.err
        assert causes == {"grad-mode"}, r.out
        assert {f["site"] for f in gradients["findings"]} <= {"blocks.0", "blocks.1"}, r.out
        assert gradients["details"]["rounding"]["rule"] == "float64", gradients["details"]
    else:
        assert r.code == 0, r.out + r.err
        assert gradients["status"] == "pass", r.out
        assert "grad-mode" not in causes, r.out
