"""Every kind of model state is compared after the step: a model that updates one kind once per
call of a checkpointed block (its recompute updates it again) fails `buffers` naming that state,
and passes without checkpoints. Each test fails when ckcheck ignores its kind (checked by planting
that bug once)."""

import importlib.util

import pytest
import torch

from conftest import factory_result, fixture

has_transformers = importlib.util.find_spec("transformers") is not None

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


# ---- what a checkpointed unit reads, at each of its calls ---------------------------------------
def _read_by(adapter, sites):
    """From the adapter's whole lists: the parameters and state whose name, or another path of
    theirs (a module reached through several paths), lies within one of `sites`."""
    aliases = adapter.state_aliases()

    def within(name):
        plain = name[1:] if name.startswith("@") else name
        return any(plain == s or plain.startswith(s + ".") for s in sites)

    whole = list(adapter.named_parameters()) + [(n, t) for n, t, _ in adapter.state_tensors()]
    return {n: t for n, t in whole if within(n) or any(within(a) for a in aliases.get(n, []))}


def _same(a, b):
    return a is b or (a is not None and b is not None and a.dtype == b.dtype and torch.equal(a, b))


UNIT_MODELS = [("state_kinds.py", kind) for kind in ("generator", "container", "mode")] + [
    ("fidelity.py", "shared_module_updated")] + ([("tiny_gpt2.py", "make_model")] if has_transformers else [])


@pytest.mark.parametrize("file,name", UNIT_MODELS)
def test_a_unit_reads_what_the_whole_lists_give_its_modules(file, name):
    # Each checkpointed call reads the state of its unit's modules alone (a walk of the whole model
    # at every call costs depth squared): the same names and tensors as the whole lists filtered by
    # path, a shared module under its first path. Fails when a unit's read names a module by the
    # path it was reached through, or leaves out a kind of state.
    from ckcheck import _model

    adapter = _model.load(lambda: factory_result(file, name), 0, {}, "torch", "train")
    try:
        units = [[s] for s in adapter.sites] + [list(p) for p in zip(adapter.sites, adapter.sites[1:])]
        for sites in units:
            expected = _read_by(adapter, sites)
            got = {n: t for n, t, _ in adapter.unit_state(sites)}
            assert sorted(got) == sorted(expected), sites
            assert all(_same(got[n], expected[n]) for n in got), sites
        assert adapter.unit_state(["no.such.module"]) is None
    finally:
        adapter.close()
