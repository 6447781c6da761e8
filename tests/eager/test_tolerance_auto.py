"""--tolerance auto: the checkpointed step judged against the plain step's own noise
(fixtures/python/noisy_sum.py: a reduction whose order changes from call to call, emulated).

PyTorch alone says that two plain steps of that model differ by rounding, and that dropout
recomputed without RNG replay differs by far more; ckcheck with auto must pass the first every time
and fail the second. Bitwise comparison, which cannot judge a step that does not repeat, is the
negative control that the model does vary.
"""

import copy

import pytest
import torch
import torch.utils.checkpoint as tc

from conftest import factory_result, fixture


def _step(model, x, checkpointed=False, preserve_rng_state=True):
    """PyTorch alone: the parameters' gradients after one step of a copy of `model`."""
    m = copy.deepcopy(model)
    if checkpointed:
        for b in m.blocks:
            b.forward = lambda h, f=b.forward: tc.checkpoint(f, h, use_reentrant=False,
                                                            preserve_rng_state=preserve_rng_state)
    torch.manual_seed(1)
    m(x).square().sum().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def _largest_relative(a, b):
    return max(((a[n] - b[n]).abs().max() / a[n].abs().max()).item() for n in a)


def test_pytorch_alone_two_plain_steps_differ_by_rounding():
    model, x = factory_result("noisy_sum.py", "noisy")
    rel = _largest_relative(_step(model, x), _step(model, x))
    assert 0 < rel < 1e-5, rel


def test_pytorch_alone_dropout_without_rng_replay_differs_beyond_rounding():
    model, x = factory_result("noisy_sum.py", "noisy_dropout")
    assert _largest_relative(_step(model, x), _step(model, x, True, preserve_rng_state=False)) > 1e-2


def test_auto_passes_twenty_of_twenty_runs_of_the_noisy_model(ckcheck):
    for run in range(20):
        r = ckcheck("run", "--model", fixture("noisy_sum.py:noisy"), "--tolerance", "auto", "--seed", run)
        assert r.code == 0, f"run {run}: {r.out}{r.err}"
        g = r.check("gradients")
        assert g["status"] == "pass", r.out
        noise = g["details"]["noise"]
        assert noise["plain_reruns"] == 4 and len(set(noise["threads"])) == 2, noise
        assert noise["varying"] > 0, noise


def test_auto_still_fails_dropout_without_rng_replay(ckcheck):
    r = ckcheck("run", "--model", fixture("noisy_sum.py:noisy_dropout"), "--tolerance", "auto", "--no-preserve-rng")
    assert r.code == 1, r.out + r.err
    assert r.check("gradients")["status"] == "fail", r.out
    assert {f["cause"] for f in r.check("gradients")["findings"]} == {"rng"}, r.out
    assert r.check("rng")["status"] == "fail", r.out


def test_bitwise_cannot_judge_the_noisy_model(ckcheck):
    r = ckcheck("run", "--model", fixture("noisy_sum.py:noisy"))
    assert r.code == 1, r.out + r.err
    g = r.check("gradients")
    assert g["status"] == "error" and "not repeatable" in g["summary"], r.out
    assert "--tolerance auto" in g["summary"], r.out


@pytest.mark.parametrize("model", ["transformer", "mlp"])
def test_auto_on_a_repeatable_model_reruns_nothing(ckcheck, model):
    r = ckcheck("run", "--model", model, "--tolerance", "auto")
    assert r.code == 0, r.out + r.err
    assert "noise" not in r.check("gradients")["details"], r.report
    assert [p["part"] for p in r.report["cost"]["phases"]][:2] == ["reference", "checkpointed"]
    assert not any(p["part"].startswith("reference, re") for p in r.report["cost"]["phases"]), r.report["cost"]
