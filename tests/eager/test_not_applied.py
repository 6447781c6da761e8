"""Checkpointing asked for that recomputes nothing: an op-level policy that saves every op warns
with the cause not-applied at each site, and a switch whose flag the forward never reads is refused
(exit 2) saying so. Truth comes from PyTorch alone: the policy's own decisions in a plain
torch.utils.checkpoint step, and the modules that run again during PyTorch's backward."""

import torch
from torch.utils.checkpoint import checkpoint

from conftest import fixture, fixture_module

FILE = "not_applied.py"


def decisions_in_pytorch(name):
    """(ops the policy saved, ops it left to recompute) in one PyTorch step with every block
    checkpointed under the factory's own context_fn."""
    made = getattr(fixture_module(FILE), name)()
    model, x, context_fn = made["model"], made["inputs"], made["context_fn"]
    out = x
    for block in model.blocks:
        out = checkpoint(block, out, use_reentrant=False, context_fn=context_fn)
    out.sum().backward()
    saved = sum(1 for _, s in context_fn.decisions if s)
    return saved, len(context_fn.decisions) - saved


def modules_run_in_backward(name):
    """How many block forwards PyTorch runs during the backward with the model's switch on."""
    model, x = getattr(fixture_module(FILE), name)()
    model.train()
    model.gradient_checkpointing_enable()
    calls = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *_: calls.append(1))
    out = model(x)
    before = len(calls)
    out.sum().backward()
    return len(calls) - before


def test_a_policy_that_saves_every_op_warns_not_applied_at_each_site(ckcheck):
    saved, recomputed = decisions_in_pytorch("keep_every_op")
    assert saved > 0 and recomputed == 0
    r = ckcheck("run", "--model", fixture(f"{FILE}:keep_every_op"), "--checkpoint", "torch-sac")
    assert r.code == 0, r.out + r.err  # a warning: the gradients are right, the checkpoint does nothing
    gradients = r.check("gradients")
    assert gradients["status"] == "warn", gradients
    sites = {f["site"] for f in gradients["findings"] if f["cause"] == "not-applied"}
    assert sites == {"blocks.0", "blocks.1", "blocks.2"}, gradients
    assert all(f["details"]["ops_recomputed"] == 0 for f in gradients["findings"])


def test_a_policy_that_leaves_ops_to_the_recompute_passes(ckcheck):
    saved, recomputed = decisions_in_pytorch("keep_matmuls")
    assert saved > 0 and recomputed > 0
    r = ckcheck("run", "--model", fixture(f"{FILE}:keep_matmuls"), "--checkpoint", "torch-sac")
    assert r.code == 0, r.out + r.err
    assert r.check("gradients")["status"] == "pass", r.check("gradients")


def test_a_switch_whose_flag_the_forward_never_reads_is_refused_as_not_applied(ckcheck):
    assert modules_run_in_backward("unread_flag") == 0
    r = ckcheck("run", "--model", fixture(f"{FILE}:unread_flag"), "--checkpoint", "model")
    assert r.code == 2, r.out + r.err
    line = r.err.strip()
    assert "\n" not in line and "not applied" in line and "gradient_checkpointing" in line, line


def test_the_switch_read_by_the_forward_passes(ckcheck):
    assert modules_run_in_backward("read_flag") == 3
    r = ckcheck("run", "--model", fixture(f"{FILE}:read_flag"), "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
