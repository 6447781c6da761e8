"""Random draws comparing the default generator's state cannot see (fixtures/python/rng_paths.py):
a selective checkpoint that saves one random op and recomputes the next, dropout inside
torch.random.fork_rng seeded alike on every rank, and a torch.Generator seeded alike on every rank.
PyTorch alone says what differs -- the step under PyTorch's own selective checkpoint, the draws of
two Gloo ranks -- and each case's twin is the negative control.
"""

import copy
import os

import pytest
import torch
import torch.utils.checkpoint as tc

from conftest import factory_result, fixture
from test_parallel import pytorch_truth

PATHS = fixture("rng_paths.py")
RANK_TRUTH = os.path.join(os.path.dirname(__file__), "rank_draws_truth.py")


def _sac_grads(save):
    """PyTorch alone: the gradients of one step of two_draws, plain (save None) or every block under
    torch.utils.checkpoint with a selective policy that saves the ops of `save`."""
    model, x = factory_result("rng_paths.py", "two_draws")
    m = copy.deepcopy(model)
    if save is not None:
        def policy(ctx, op, *args, **kwargs):
            return tc.CheckpointPolicy.MUST_SAVE if op.overloadpacket in save else tc.CheckpointPolicy.PREFER_RECOMPUTE

        for b in m.blocks:
            b.forward = lambda h, f=b.forward: tc.checkpoint(
                f, h, use_reentrant=False,
                context_fn=lambda: tc.create_selective_checkpoint_contexts(policy))
    torch.manual_seed(5)
    m(x).square().sum().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("save,differs", [((torch.ops.aten.randn_like,), True), ((torch.ops.aten.mm,), False)])
def test_pytorch_alone_a_saved_random_op_shifts_the_draws_after_it(save, differs):
    plain, selective = _sac_grads(None), _sac_grads(save)
    assert any(not torch.equal(plain[n], selective[n]) for n in plain) == differs


@pytest.mark.parametrize("save,differs", [("aten.randn_like", True), ("aten.mm", False)])
def test_ckcheck_names_the_shifted_draw_rng(ckcheck, save, differs):
    r = ckcheck("run", "--model", f"{PATHS}:two_draws", "--checkpoint", "torch-sac", "--sac-save", save)
    assert r.code == (1 if differs else 0), r.out + r.err
    rng = r.check("rng")
    gradients = r.check("gradients")
    if not differs:
        assert rng["status"] == "pass" and gradients["status"] == "pass", r.out
        return
    assert rng["status"] == "fail" and {f["cause"] for f in gradients["findings"]} == {"rng"}, r.out
    for f in rng["findings"]:
        assert f["tensor"] == "aten::bernoulli_" and "skipped a draw" in f["message"], f
        assert "aten::randn_like" in f["message"] and "policy" in f["hint"], f


@pytest.mark.parametrize("factory,same", [("forked_fixed_seed", True), ("forked_own_stream", False),
                                          ("generator_fixed_seed", True), ("generator_per_rank", False)])
def test_ranks_that_draw_alike_fail_rank_rng(ckcheck, tmp_path, factory, same):
    truth = pytorch_truth(tmp_path, RANK_TRUTH, [factory], models=PATHS)
    assert (truth[0]["output"] == truth[1]["output"]) == same  # PyTorch alone: both ranks drew alike
    r = ckcheck("run", "--model", f"{PATHS}:{factory}", "--checkpoint", "torch", "--parallel", "ddp",
                "--world-size", 2, "--timeout", 300)
    assert r.code == (1 if same else 0), r.out + r.err
    rank_rng = r.check("rank-rng")
    assert rank_rng["status"] == ("fail" if same else "pass"), r.out
    if same:
        assert {f["cause"] for f in rank_rng["findings"]} == {"rng"}, r.out
        assert "same generator state" in rank_rng["findings"][0]["message"], r.out
    # The draws each rank makes are replayed by its recompute either way.
    assert r.check("rng")["status"] == "pass" and r.check("gradients")["status"] == "pass", r.out
