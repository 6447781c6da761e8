"""Every kind of model state is compared after the step: a model that updates one kind once per
call of a checkpointed block (its recompute updates it again) fails `buffers` naming that state,
and passes without checkpoints. Each test fails when ckcheck ignores its kind (checked by planting
that bug once)."""

import pytest

from conftest import fixture

KINDS = {  # kind -> the state's name as the report gives it
    "parameter": "blocks.1.steps",
    "buffer": "blocks.1.seen",
    "attribute": "blocks.1.total",
    "scalar": "blocks.1.calls",
    "container": "blocks.1.history",
    "generator": "blocks.1.gen",
    "mode": "blocks.1.child.training",
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_state_updated_again_by_the_recompute_fails_buffers(ckcheck, kind):
    r = ckcheck("run", "--model", fixture(f"state_kinds.py:{kind}"), "--checkpoint", "torch")
    assert r.code == 1, r.out + r.err
    buffers = r.check("buffers")
    assert buffers["status"] == "fail", buffers
    named = " ".join(f["tensor"] + " " + f["message"] for f in buffers["findings"])
    assert KINDS[kind] in named, named
    assert r.check("gradients")["status"] == "pass"  # the state alone differs


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_same_state_without_checkpoints_passes(ckcheck, kind):
    r = ckcheck("run", "--model", fixture(f"state_kinds.py:{kind}"), "--checkpoint", "torch", "--policy", "none")
    assert r.code == 0, r.out + r.err
