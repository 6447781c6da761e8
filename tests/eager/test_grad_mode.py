"""A segment whose values depend on grad mode (scaled_dot_product_attention with a mask that
requires grad takes another kernel than without): a checkpoint that runs its forward without
autograd and its recompute with it gives other gradients than the plain step, and ckcheck names
the cause grad-mode. PyTorch alone says which steps differ; the fixed-slope twin and the
non-reentrant checkpoint are the negative controls.
"""

import copy

import pytest
import torch
import torch.utils.checkpoint as tc

from conftest import factory_result, fixture

FACTORIES = ["learned_attention_bias", "fixed_attention_bias"]


def _grads(model, x, mode):
    """PyTorch alone: one step from a copy of `model`, every block plain or under torch's
    checkpoint (mode "plain", "reentrant" or "non-reentrant")."""
    m = copy.deepcopy(model)
    if mode != "plain":
        for b in m.blocks:
            b.forward = lambda h, f=b.forward: tc.checkpoint(f, h, use_reentrant=mode == "reentrant")
    m(x).square().sum().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def _pytorch_step_differs(factory, mode):
    model, x = factory_result("grad_mode.py", factory)
    plain, checkpointed = _grads(model, x, "plain"), _grads(model, x, mode)
    return any(not torch.equal(plain[n], checkpointed[n]) for n in plain)


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
    assert r.code == (1 if differs else 0), r.out + r.err
    gradients = r.check("gradients")
    causes = {f["cause"] for f in gradients["findings"]}
    if differs:
        assert causes == {"grad-mode"}, r.out
        assert {f["site"] for f in gradients["findings"]} <= {"blocks.0", "blocks.1"}, r.out
    else:
        assert gradients["status"] == "pass", r.out
        assert "grad-mode" not in causes, r.out
