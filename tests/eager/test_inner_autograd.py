"""Segments that run autograd inside themselves (forces as the gradient of a learned energy) or
compute what the loss does not use (a detached probe head): PyTorch alone says checkpointing them
changes no gradient, and ckcheck says so under its own checkpoint and PyTorch's. Dropout inside
the energy, recomputed without the forward's RNG state, is the negative control.
"""

import copy
import warnings

import pytest
import torch
import torch.utils.checkpoint as tc

from conftest import factory_result, fixture

FILE = "inner_autograd.py"


def _grads(model, x, checkpointed, preserve_rng_state=True):
    """PyTorch alone: one step from a copy of `model` (seeded), every block plain or under torch's
    non-reentrant checkpoint; each parameter's .grad (None where it got none)."""
    m = copy.deepcopy(model)
    if checkpointed:
        for b in m.blocks:
            b.forward = lambda h, f=b.forward: tc.checkpoint(f, h, use_reentrant=False,
                                                             preserve_rng_state=preserve_rng_state)
    torch.manual_seed(0)
    m(x).square().sum().backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in m.named_parameters()}


def _same(a, b):
    return a.keys() == b.keys() and all(
        (a[n] is None and b[n] is None) or (a[n] is not None and b[n] is not None and torch.equal(a[n], b[n]))
        for n in a)


@pytest.mark.parametrize("factory", ["force_field", "probed"])
def test_pytorch_alone_checkpointing_these_blocks_changes_no_gradient(factory):
    model, x = factory_result(FILE, factory)
    plain = _grads(model, x, checkpointed=False)
    assert _same(plain, _grads(model, x, checkpointed=True))
    probes = [n for n in plain if ".probe." in n]
    # The probe heads' parameters get no gradient: the plain backward never reaches them.
    assert (factory == "probed") == bool(probes) and all(plain[n] is None for n in probes)


@pytest.mark.parametrize("factory", ["force_field", "probed"])
@pytest.mark.parametrize("mode", ["ckcheck", "torch"])
def test_ckcheck_passes_them_under_its_own_checkpoint_and_pytorchs(ckcheck, factory, mode):
    r = ckcheck("run", "--model", fixture(f"{FILE}:{factory}"), "--checkpoint", mode)
    assert r.code == 0, r.out + r.err
    assert r.check("gradients")["status"] == "pass", r.out
    # A probe parameter's hook fires once, without a gradient, under ckcheck's checkpoint (its node
    # returns none for it) and never in the plain step: DDP takes it as unused either way.
    assert r.check("hooks")["status"] == "pass", r.out


def test_dropout_in_the_energy_recomputed_without_the_rng_state_fails(ckcheck):
    model, x = factory_result(FILE, "force_field_dropout")
    plain = _grads(model, x, checkpointed=False)
    assert not _same(plain, _grads(model, x, checkpointed=True, preserve_rng_state=False))
    assert _same(plain, _grads(model, x, checkpointed=True))
    r = ckcheck("run", "--model", fixture(f"{FILE}:force_field_dropout"), "--checkpoint", "ckcheck",
                "--no-preserve-rng")
    assert r.code == 1, r.out + r.err
    assert r.check("gradients")["status"] == "fail" and r.check("rng")["status"] == "fail", r.out
    ok = ckcheck("run", "--model", fixture(f"{FILE}:force_field_dropout"), "--checkpoint", "ckcheck")
    assert ok.code == 0 and ok.check("gradients")["status"] == "pass", ok.out + ok.err


def test_the_probed_model_as_torchscript_passes_in_one_process_and_data_parallel(ckcheck, tmp_path):
    # A TorchScript model is checkpointed by ckcheck's own checkpoint; data-parallel, by ckcheck's
    # bucketed all-reduce, which takes a hook that fires without a gradient as DDP does.
    model, _ = factory_result(FILE, "probed")
    path = tmp_path / "probed.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script's deprecation notice
        torch.jit.script(model).save(str(path))
    for extra in ([], ["--world-size", 2]):
        r = ckcheck("run", "--model", path, "--input-shape", "4,8", "--sites", "blocks.?", *extra, "--timeout", 300)
        assert r.code == 0, r.out + r.err
        assert r.check("gradients")["status"] == "pass" and r.check("hooks")["status"] == "pass", r.out
        if extra:
            assert r.check("data-parallel")["status"] == "pass", r.out
