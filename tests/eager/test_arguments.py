"""A block's arguments reach it as the model passes them: a list the caller hands its blocks (a
cache they append to, auxiliary losses they collect) is the caller's own object in the checked
step, not a copy the caller never sees, so what the list does under a checkpoint is what it does in
training. The truth of each case is PyTorch's alone: the blocks wrapped in torch.utils.checkpoint
by hand, against the plain step."""
import functools
import importlib.util

import pytest
import torch
import torch.utils.checkpoint as tc

from conftest import fixture, fixture_module


def _pytorch_step(factory, mode):
    """Every parameter's gradient of one step, the blocks plain or under torch's checkpoint
    (mode "torch" or "torch-reentrant"), or the name of the error PyTorch raised."""
    torch.manual_seed(0)  # the same model and input for both steps
    model, x = getattr(fixture_module("fidelity.py"), factory)()
    if mode != "plain":
        for b in model.blocks:
            b.forward = lambda h, kept, f=b.forward: tc.checkpoint(f, h, kept, use_reentrant=mode == "torch-reentrant")
    try:
        model(x).square().sum().backward()
    except RuntimeError as e:  # torch.utils.checkpoint.CheckpointError is one
        return type(e).__name__
    return {n: p.grad.clone() for n, p in model.named_parameters()}


CASES = [
    # factory, checkpoint, what PyTorch alone does against the plain step
    ("list_of_aux_losses", "torch", "equal"),  # the recompute appends again, after the loss used the list
    ("list_of_aux_losses", "torch-reentrant", "differs"),  # the terms were computed without autograd
    ("list_cache", "torch", "raises"),  # the recompute attends over its own keys twice: other shapes
    ("list_cache", "torch-reentrant", "raises"),
    ("object_cache", "torch", "raises"),  # the same with the keys in an attribute of a cache object
    ("object_cache", "torch-reentrant", "raises"),
    ("list_read_only", "torch", "equal"),
    ("list_read_only", "torch-reentrant", "equal"),
]


@pytest.mark.parametrize("factory,mode,truth", CASES)
def test_pytorch_alone(factory, mode, truth):
    plain, checkpointed = _pytorch_step(factory, "plain"), _pytorch_step(factory, mode)
    assert isinstance(plain, dict)
    if truth == "raises":
        assert isinstance(checkpointed, str), "PyTorch ran the step"
    else:
        assert isinstance(checkpointed, dict), checkpointed
        assert all(torch.equal(plain[n], checkpointed[n]) for n in plain) == (truth == "equal")


@pytest.mark.parametrize("factory,mode,truth", CASES)
def test_a_list_handed_to_the_blocks_is_the_callers_in_the_checked_step(ckcheck, factory, mode, truth):
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"), "--checkpoint", mode)
    assert r.code == (0 if truth == "equal" else 1), r.out + r.err
    assert r.report["model"]["units"] == ["blocks.0", "blocks.1"]
    gradients = r.check("gradients")
    if truth == "equal":
        assert gradients["status"] == "pass", r.out
        assert r.check("determinism")["status"] == "pass", r.out
    elif truth == "raises":
        assert gradients["summary"] == "the checkpointed step failed where the plain step did not", r.out
        # The determinism probe runs a unit again from the list as it was handed: the block repeats
        # itself from there and not from the list it grew, which is state kept outside the model.
        for check in ("gradients", "determinism"):
            assert {f["cause"] for f in r.check(check)["findings"]} == {"stateful"}, r.out
    else:
        # Each recompute reproduced its forward: the terms the blocks left in the list lost their graph.
        assert r.check("determinism")["status"] == "pass", r.out
        assert {f["cause"] for f in gradients["findings"]} == {"reentrant-no-grad"}, r.out


# ---- a Hugging Face decoder run with use_cache=True under a checkpoint the user wraps its layers in
# (FSDP's apply_activation_checkpointing, torch.utils.checkpoint by hand): each layer appends to the
# DynamicCache it is handed, and the recompute appends again ----------------------------------------
has_transformers = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not has_transformers, reason="transformers is not installed")


def _gpt2(factory, mode):
    """PyTorch alone: the loss's backward of GPT-2 with its layers wrapped in torch's checkpoint
    (mode "torch" or "torch-reentrant"), or the error it raised ("" when it ran)."""
    made = getattr(fixture_module("tiny_gpt2.py"), factory)()
    model, inputs = made["model"], made["inputs"]
    for layer in model.transformer.h:
        if mode == "torch-reentrant":
            layer.forward = lambda *a, f=layer.forward, **k: tc.checkpoint(functools.partial(f, **k), *a,
                                                                          use_reentrant=True)
        else:
            layer.forward = lambda *a, f=layer.forward, **k: tc.checkpoint(f, *a, use_reentrant=False, **k)
    try:
        model(**inputs).loss.backward()
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return ""


@needs_transformers
@pytest.mark.parametrize("mode", ["torch", "torch-reentrant"])
def test_a_decoder_whose_layers_append_to_their_cache_fails_stateful(ckcheck, mode):
    # PyTorch alone: with use_cache=True the recompute attends over a cache twice as long and the
    # backward raises; without the cache it runs (the negative control).
    assert _gpt2("with_cache", mode) != ""
    assert _gpt2("make_model", mode) == ""
    r = ckcheck("run", "--model", fixture("tiny_gpt2.py:with_cache"), "--checkpoint", mode)
    assert r.code == 1, r.out + r.err
    assert r.check("gradients")["summary"] == "the checkpointed step failed where the plain step did not", r.out
    for check in ("gradients", "determinism"):
        assert {f["cause"] for f in r.check(check)["findings"]} == {"stateful"}, r.out
        # the cache is named, with its type, and the fix says to turn it off
        for f in r.check(check)["findings"]:
            assert ": DynamicCache" in f["message"] and "use_cache=False" in f["hint"], f
    ok = ckcheck("run", "--model", fixture("tiny_gpt2.py:make_model"), "--checkpoint", mode)
    assert ok.code == 0, ok.out + ok.err
