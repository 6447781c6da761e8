"""Rounding told from a lost contribution by evidence, not by size (fixtures/python/rounding.py).

PyTorch alone says, for each model, how the reentrant step differs from the plain one in float32
and in float64, and that a threshold on size (1024 epsilons of the step's largest gradient, the
rule ckcheck had) judges both wrongly; ckcheck must pass the rounding with accumulation-order and
fail the lost load-balancing gradient with reentrant-no-grad. The non-reentrant checkpoint, under
which PyTorch's steps are equal, is the negative control.
"""

import copy

import pytest
import torch
import torch.utils.checkpoint as tc

from conftest import factory_result, fixture

EPS32 = torch.finfo(torch.float32).eps


def _grads(model, x, mode, dtype):
    """PyTorch alone: one step of a copy of `model` in `dtype`, its blocks plain or under torch's
    checkpoint ("plain", "reentrant", "non-reentrant"), the output projected on a seeded upstream."""
    m = copy.deepcopy(model).to(dtype)
    if mode != "plain":
        for b in m.blocks:
            b.forward = lambda *a, f=b.forward: tc.checkpoint(f, *a, use_reentrant=mode == "reentrant")
    out = m(x.to(dtype))
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float32).to(dtype)
    (out * up).sum().backward()
    return {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def _differences(factory, mode, dtype):
    """{name: (max abs difference, own largest value)} of the gradients that differ, and the step's
    largest gradient."""
    model, x = factory_result("rounding.py", factory)
    plain, other = _grads(model, x, "plain", dtype), _grads(model, x, mode, dtype)
    largest = max(g.abs().max().item() for g in plain.values())
    return {n: ((plain[n] - other[n]).abs().max().item(), plain[n].abs().max().item())
            for n in plain if not torch.equal(plain[n], other[n])}, largest


def test_pytorch_alone_the_cancelling_bias_is_rounding_that_size_alone_calls_real():
    f32, largest = _differences("cancelling_bias", "reentrant", torch.float32)
    f64, _ = _differences("cancelling_bias", "reentrant", torch.float64)
    assert set(f32) == {"bias"}, f32
    diff, own = f32["bias"]
    # Beyond 1024 epsilons of its own value and of the step's largest gradient ...
    assert diff > 1024 * EPS32 * max(own, largest), (diff, own, largest)
    # ... and in float64 it shrinks with the precision: summation order.
    assert f64.get("bias", (0.0, 0.0))[0] < diff * 1e-6, (f64, diff)


def test_pytorch_alone_the_lost_aux_loss_is_real_where_size_alone_calls_it_rounding():
    f32, largest = _differences("lost_aux_loss", "reentrant", torch.float32)
    f64, _ = _differences("lost_aux_loss", "reentrant", torch.float64)
    assert {"blocks.0.gate.weight", "blocks.1.gate.weight"} <= set(f32), f32
    # Every gradient within 1024 epsilons of the step's largest one: size alone says rounding ...
    assert all(d <= 1024 * EPS32 * largest for d, _ in f32.values()), (f32, largest)
    # ... and in float64 the gates' differences keep their size: the load-balancing term is lost.
    for name in ("blocks.0.gate.weight", "blocks.1.gate.weight"):
        assert f64[name][0] > 0.5 * f32[name][0], (name, f32[name], f64.get(name))


@pytest.mark.parametrize("factory", ["cancelling_bias", "lost_aux_loss"])
def test_pytorch_alone_the_non_reentrant_steps_are_equal(factory):
    assert _differences(factory, "non-reentrant", torch.float32)[0] == {}


def _gradients(r):
    g = r.check("gradients")
    return g, {f["cause"] for f in g["findings"]}


def test_ckcheck_passes_the_cancelling_bias_as_rounding_by_the_float64_rerun(ckcheck):
    r = ckcheck("run", "--model", fixture("rounding.py:cancelling_bias"), "--checkpoint", "torch-reentrant")
    assert r.code == 0, r.out + r.err
    g, causes = _gradients(r)
    assert g["status"] == "warn" and causes == {"accumulation-order"}, r.out
    assert g["details"]["rounding"]["rule"] == "float64", g["details"]
    assert "rerun in float64" in g["findings"][0]["message"], r.out
    assert any(p["part"] == "float64 rerun" for p in r.report["cost"]["phases"]), r.report["cost"]


def test_ckcheck_fails_the_lost_aux_loss_with_reentrant_no_grad(ckcheck):
    r = ckcheck("run", "--model", fixture("rounding.py:lost_aux_loss"), "--checkpoint", "torch-reentrant")
    assert r.code == 1, r.out + r.err
    g, causes = _gradients(r)
    assert causes == {"reentrant-no-grad"}, r.out
    assert {f["site"] for f in g["findings"]} == {"blocks.0", "blocks.1"}, r.out
    assert g["details"]["rounding"]["rounding"] is False and g["details"]["rounding"]["rule"] == "float64", g["details"]
    assert "not rounding" in r.out, r.out


@pytest.mark.parametrize("factory", ["cancelling_bias", "lost_aux_loss"])
def test_ckcheck_passes_both_under_the_non_reentrant_checkpoint(ckcheck, factory):
    r = ckcheck("run", "--model", fixture(f"rounding.py:{factory}"), "--checkpoint", "torch")
    assert r.code == 0, r.out + r.err
    g, causes = _gradients(r)
    assert g["status"] == "pass" and not causes, r.out


def test_without_a_float64_rerun_the_lost_term_is_judged_on_the_gates_own_scale(ckcheck):
    """A model that cannot compute in float64 (it refuses inputs other than float32): the rerun says
    why it could not be made, and the lost term still fails on its own scale."""
    r = ckcheck("run", "--model", fixture("rounding.py:lost_aux_loss_float32_only"), "--checkpoint", "torch-reentrant")
    assert r.code == 1, r.out + r.err
    g, causes = _gradients(r)
    assert causes == {"reentrant-no-grad"}, r.out
    assert g["details"]["rounding"]["rule"] == "own-scale", g["details"]
    assert "float64 rerun could not be made" in g["details"]["rounding"]["evidence"], g["details"]


def test_a_model_that_pins_float32_is_still_rerun_in_float64(ckcheck):
    """Casts to float32 and float32 factories inside the blocks: the rerun computes them in float64,
    and the pure summation order passes by the float64 rule (the own-scale bound would fail it)."""
    r = ckcheck("run", "--model", fixture("rounding.py:cancelling_bias_pinned"), "--checkpoint", "torch-reentrant")
    assert r.code == 0, r.out + r.err
    g, causes = _gradients(r)
    assert causes == {"accumulation-order"} and g["details"]["rounding"]["rule"] == "float64", g["details"]
