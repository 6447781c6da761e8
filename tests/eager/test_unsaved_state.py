"""State a checkpointed block reads besides its arguments and saved tensors, changed before its
recompute: a ctx-kept workspace the next micro-batch refills, a closure cell pointed at the next
micro-batch's adapter, a frozen parameter an engine empties after the forward. Truth comes from
PyTorch alone: the same micro-batches through torch.utils.checkpoint and plainly, in the same
order (every forward, then the backwards); each case has a twin that leaves the state as it was."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from conftest import fixture, fixture_module

FILE = "unsaved_state.py"

# (the case, its twin, what ckcheck must name as changed before the recompute)
CASES = [
    ("ctx_buffer", "ctx_buffer_same", "blocks.0.workspace"),
    ("closure_weight", "closure_one", "blocks.0.forward:current.weight"),
    ("frozen_released", "frozen_gathered", "blocks.0.base"),
]


def pytorch_gradients(name, checkpointed, interleaved):
    """Parameter gradients of two micro-batches (the factory's batch and the same samples rolled by
    one), each block under torch.utils.checkpoint (non-reentrant) or plain."""
    torch.manual_seed(0)
    model, x = getattr(fixture_module(FILE), name)()
    if checkpointed:
        for block in model.blocks:
            block.forward = (lambda *a, f=block.forward: checkpoint(f, *a, use_reentrant=False))
    batches = [x, x.roll(1, 0)]
    if interleaved:
        outs = [model(b) for b in batches]
        for out in outs:
            out.sum().backward()
    else:
        for b in batches:
            model(b).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def pytorch_differs(name, interleaved):
    plain = pytorch_gradients(name, False, interleaved)
    ckpt = pytorch_gradients(name, True, interleaved)
    return plain.keys() != ckpt.keys() or any(not torch.equal(plain[n], ckpt[n]) for n in plain)


@pytest.mark.parametrize("case,twin,changed", CASES)
def test_state_changed_before_the_recompute_is_named_under_the_interleaved_schedule(ckcheck, case, twin, changed):
    assert pytorch_differs(case, interleaved=True)
    r = ckcheck("run", "--model", fixture(f"{FILE}:{case}"), "--schedule", "interleaved")
    assert r.code == 1, r.out + r.err
    assert r.check("gradients")["status"] == "fail", r.check("gradients")
    found = r.check("input-mutation")
    assert found["status"] == "fail", found
    named = {f["tensor"]: f["cause"] for f in found["findings"]}
    assert named.get(changed) == "in-place", found
    assert "next micro-batch" in found["findings"][0]["message"]
    assert "--schedule interleaved" in r.report["reproduce"]


@pytest.mark.parametrize("case,twin,changed", CASES)
def test_the_twin_that_keeps_the_state_passes(ckcheck, case, twin, changed):
    assert not pytorch_differs(twin, interleaved=True)
    r = ckcheck("run", "--model", fixture(f"{FILE}:{twin}"), "--schedule", "interleaved")
    assert r.code == 0, r.out + r.err
    assert r.check("input-mutation")["status"] == "pass", r.check("input-mutation")


@pytest.mark.parametrize("case", ["ctx_buffer", "closure_weight"])
def test_the_sequential_schedule_cannot_show_what_the_next_forward_changes(ckcheck, case):
    # PyTorch agrees: each recompute runs before the next micro-batch's forward.
    assert not pytorch_differs(case, interleaved=False)
    r = ckcheck("run", "--model", fixture(f"{FILE}:{case}"), "--accumulate", "2")
    for check in ("gradients", "gradient-accumulation", "input-mutation"):
        assert r.check(check)["status"] == "pass", r.out


def test_a_parameter_emptied_after_the_forward_is_found_in_any_schedule(ckcheck):
    assert pytorch_differs("frozen_released", interleaved=False)
    r = ckcheck("run", "--model", fixture(f"{FILE}:frozen_released"))
    assert r.code == 1, r.out + r.err
    assert "blocks.0.base" in {f["tensor"] for f in r.check("input-mutation")["findings"]}


# ---- by default: the interleaved steps run where a unit reads state the forward rewrites ------

def phases(r):
    return [p["part"] for p in r.report["cost"]["phases"]]


def test_a_default_run_interleaves_where_a_unit_reads_state_the_forward_refills(ckcheck):
    assert pytorch_differs("ctx_buffer", interleaved=True)
    r = ckcheck("run", "--model", fixture(f"{FILE}:ctx_buffer"))
    assert r.code == 1, r.out + r.err
    check = r.check("schedule")
    assert check["status"] == "fail", check
    assert {f["tensor"] for f in check["findings"]} == {"blocks.0.workspace", "blocks.1.workspace"}, check
    assert {f["cause"] for f in check["findings"]} == {"in-place"}
    assert r.check("gradients")["status"] == "pass"  # the sequential step cannot show it


def test_a_default_run_passes_state_the_forward_refills_with_the_same_values(ckcheck):
    assert not pytorch_differs("ctx_buffer_same", interleaved=True)
    r = ckcheck("run", "--model", fixture(f"{FILE}:ctx_buffer_same"))
    assert r.code == 0, r.out + r.err
    assert r.check("schedule")["status"] == "pass", r.check("schedule")
    assert "interleaved checkpointed" in phases(r)


def test_a_model_whose_forward_rewrites_nothing_pays_for_no_interleaved_step(ckcheck):
    r = ckcheck("run", "--model", fixture(f"{FILE}:frozen_gathered"))
    assert r.code == 0, r.out + r.err
    assert r.check("schedule")["status"] == "skip"
    assert not any(p.startswith("interleaved") for p in phases(r)), phases(r)


# ---- --poison: state the forward rewrites, overwritten with NaN until the backward ended -------

def test_poison_makes_a_backward_that_reads_rewritten_state_fail_naming_it(ckcheck):
    # The twin whose refills are equal passes interleaved (PyTorch above): the poison shows that its
    # recompute still reads the workspace, which any other refill would change.
    r = ckcheck("run", "--model", fixture(f"{FILE}:ctx_buffer_same"), "--poison", "--checks", "gradients,buffers")
    assert r.code == 1, r.out + r.err
    (f,) = r.check("gradients")["findings"][:1]
    assert f["cause"] == "in-place" and f["site"] == "blocks.0", f
    assert "blocks.0.workspace" in f["message"] and "--poison" in f["message"], f
    assert r.check("buffers")["status"] == "pass"  # the poisoned values are put back after the backward


def test_poison_leaves_a_model_whose_forward_rewrites_nothing_as_it_is(ckcheck):
    r = ckcheck("run", "--model", fixture(f"{FILE}:closure_one"), "--poison")
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["poison"] is True
