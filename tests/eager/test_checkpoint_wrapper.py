"""--checkpoint torch-wrapper: PyTorch's checkpoint_wrapper around each block, as
apply_activation_checkpointing puts it in place (FSDP and torchtitan-style training). The truth is
PyTorch's alone: the model trained plainly and with apply_activation_checkpointing on its blocks, one
step each from the same state, gradients compared bitwise; ckcheck's verdict must say the same.
"""

import copy
import os
import sys

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointWrapper,
                                                                         apply_activation_checkpointing)

from conftest import FIXTURES

sys.path.insert(0, FIXTURES)
import twins  # noqa: E402


def gradients(model, x, wrapped):
    """One step's gradients, plainly or with each block in checkpoint_wrapper, from the same seed."""
    model = copy.deepcopy(model)
    if wrapped:
        apply_activation_checkpointing(model, check_fn=lambda m: m in set(model.blocks))
        assert sum(isinstance(m, CheckpointWrapper) for m in model.modules()) == len(model.blocks)
    torch.manual_seed(1)
    out = model(x.clone())
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(2)))
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def pytorch_alone_differs(factory):
    torch.manual_seed(0)
    model, x = getattr(twins, factory)()
    plain, wrapped = gradients(model, x, False), gradients(model, x, True)
    names = {n.replace("_checkpoint_wrapped_module.", "") for n in wrapped}
    assert names == set(plain), (names, set(plain))
    wrapped = {n.replace("_checkpoint_wrapped_module.", ""): g for n, g in wrapped.items()}
    return any(not torch.equal(plain[n], wrapped[n]) for n in plain)


@pytest.mark.parametrize("factory, differs, cause", [
    ("mlp", False, None),
    ("transformer", False, None),                   # dropout: the wrapper replays the RNG state
    ("faulty_private_generator", True, "rng"),      # a generator of the block's own is not replayed
    ("faulty_stateful_counter", True, "stateful"),  # the block counts its calls: the recompute is one more
])
def test_the_verdict_is_pytorchs_own(ckcheck, factory, differs, cause):
    assert pytorch_alone_differs(factory) == differs
    r = ckcheck("run", "--model", os.path.join(FIXTURES, f"twins.py:{factory}"), "--checkpoint", "torch-wrapper")
    assert r.report["model"]["checkpoint"] == "torch-wrapper", r.out
    assert r.code == (1 if differs else 0), r.out + r.err
    if cause:
        causes = {f["cause"] for c in r.report["checks"] for f in c["findings"]}
        assert cause in causes, r.out


def test_without_rng_state_the_wrapper_draws_another_mask(ckcheck):
    # preserve_rng_state=False reaches the wrapper's checkpoint: the dropout mask differs.
    r = ckcheck("run", "--model", os.path.join(FIXTURES, "twins.py:transformer"), "--checkpoint", "torch-wrapper",
                "--no-preserve-rng")
    assert r.code == 1 and r.check("rng")["status"] == "fail", r.out


def test_under_the_compiler_it_is_refused(ckcheck):
    r = ckcheck("run", "--model", os.path.join(FIXTURES, "twins.py:mlp"), "--checkpoint", "torch-wrapper",
                "--compile")
    assert r.code == 2 and "torch-wrapper" in r.err, r.err
