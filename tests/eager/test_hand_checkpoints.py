"""Checkpoints written by hand (an autograd Function that runs the block again in its backward, as
Megatron-LM's and DeepSpeed's are) and the gradient hooks data-parallel training counts. DDP's
reducer marks a parameter ready after its gradient accumulator runs, not when a tensor hook sees a
gradient: a backward that takes the parameters' gradients with torch.autograd.grad and returns them
fires their tensor hooks twice and DDP's once. What PyTorch does comes from PyTorch alone (DDP on
one Gloo rank on 127.0.0.1, ddp_truth.py); the negative control accumulates each gradient twice.
"""

import pytest

from conftest import fixture, fixture_module
from test_parallel import TRUTH, pytorch_truth

MODELS = fixture("fidelity.py")


def _made(factory):
    model, x = getattr(fixture_module("fidelity.py"), factory)()
    model.train()
    return model, x


def _fires(model, x, on):
    """How often each block parameter's tensor hook and post-accumulate hook fire in one backward."""
    tensor, accumulated = {}, {}
    handles = []
    for name, p in model.blocks.named_parameters():
        handles.append(p.register_hook(lambda g, n=name: tensor.__setitem__(n, tensor.get(n, 0) + 1)))
        handles.append(p.register_post_accumulate_grad_hook(
            lambda _p, n=name: accumulated.__setitem__(n, accumulated.get(n, 0) + 1)))
    model.zero_grad(set_to_none=True)
    model.gradient_checkpointing = on
    model(x).sum().backward()
    for h in handles:
        h.remove()
    return set(tensor.values()), set(accumulated.values())


@pytest.mark.parametrize("factory, tensor_fires, accumulator_fires", [
    ("hand_checkpoint_by_grad", {2}, {1}),
    ("hand_checkpoint_accumulating_twice", {2}, {2}),
])
def test_pytorch_alone_tensor_hooks_and_accumulator_hooks_count_differently(factory, tensor_fires, accumulator_fires):
    model, x = _made(factory)
    assert _fires(model, x, on=False) == ({1}, {1})
    assert _fires(model, x, on=True) == (tensor_fires, accumulator_fires)


@pytest.mark.parametrize("factory, marked_twice", [
    ("hand_checkpoint_by_grad", False),
    ("hand_checkpoint_accumulating_twice", True),
])
def test_pytorch_alone_ddp_marks_a_parameter_ready_twice_only_where_it_is_accumulated_twice(tmp_path, factory,
                                                                                            marked_twice):
    (truth,) = pytorch_truth(tmp_path, TRUTH, [factory, "model"], world=1, models=MODELS)
    assert ("mark a variable ready only once" in truth["error"]) == marked_twice, truth["error"]


def test_a_hand_checkpoint_that_returns_gradients_from_grad_passes(ckcheck):
    r = ckcheck("run", "--model", f"{MODELS}:hand_checkpoint_by_grad", "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
    assert r.report["model"]["units"] == ["blocks.0", "blocks.1"]
    for check in ("gradients", "hooks"):
        assert r.check(check)["status"] == "pass", r.out


def test_a_hand_checkpoint_that_accumulates_twice_fails_hooks_at_its_units(ckcheck):
    r = ckcheck("run", "--model", f"{MODELS}:hand_checkpoint_accumulating_twice", "--checkpoint", "model")
    assert r.code == 1, r.out + r.err
    hooks = r.check("hooks")
    assert hooks["status"] == "fail", r.out
    assert {f["cause"] for f in hooks["findings"]} == {"hook-count"}, r.out
    assert {f["site"] for f in hooks["findings"]} == {"blocks.0", "blocks.1"}, r.out
    assert {f["details"]["fires"] for f in hooks["findings"]} == {2}, r.out
    assert r.check("gradients")["status"] == "fail", r.out
