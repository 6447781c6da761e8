"""The collectives a checkpointed block's recompute issues against those of its forward, on two
Gloo ranks under PyTorch's DDP. Truth from PyTorch alone (ddp_truth.py: every block under
torch.utils.checkpoint against none, each rank's gradients); each case has its twin."""

import pytest

from conftest import fixture
from test_parallel import TRUTH, pytorch_truth

MODELS = fixture("collectives.py")


def truth_differs(tmp_path, factory):
    plain = pytorch_truth(tmp_path, TRUTH, [factory, "none"], models=MODELS)
    ckpt = pytorch_truth(tmp_path, TRUTH, [factory, "torch"], models=MODELS)
    assert all(not r["error"] for r in plain + ckpt), (plain, ckpt)
    return any(p["grads"] != c["grads"] for p, c in zip(plain, ckpt))


def run(ckcheck, factory):
    return ckcheck("run", "--model", f"{MODELS}:{factory}", "--parallel", "ddp", "--world-size", 2,
                   "--checks", "gradients,collectives", "--timeout", 300)


def test_a_recompute_that_drops_its_forwards_all_reduce_is_named(ckcheck, tmp_path):
    assert truth_differs(tmp_path, "reduce_once")
    r = run(ckcheck, "reduce_once")
    assert r.code == 1, r.out + r.err
    check = r.check("collectives")
    assert check["status"] == "fail", r.out
    assert {f["site"] for f in check["findings"]} == {"blocks.0", "blocks.1"}, r.out
    for f in check["findings"]:
        assert f["cause"] == "recompute-collective" and f["tensor"].startswith("c10d::allreduce_"), f
        assert f["details"]["recompute"] == [] and len(f["details"]["forward"]) == 1, f
    assert {f["cause"] for f in r.check("gradients")["findings"]} == {"recompute-collective"}, r.out


def test_a_recompute_that_issues_the_forwards_all_reduce_passes(ckcheck, tmp_path):
    assert not truth_differs(tmp_path, "reduce_always")
    r = run(ckcheck, "reduce_always")
    assert r.code == 0, r.out + r.err
    assert r.check("collectives")["status"] == "pass", r.out
    assert "2 checkpointed calls recompute the collectives" in r.check("collectives")["summary"]


def test_a_single_process_skips_it(ckcheck):
    r = ckcheck("run", "--model", fixture("collectives.py:reduce_always"), "--checks", "collectives")
    assert r.code == 0 and r.check("collectives")["status"] == "skip", r.out


def test_a_recompute_on_another_group_than_its_forward_names_both_groups(ckcheck, tmp_path):
    assert truth_differs(tmp_path, "wrong_group")
    r = run(ckcheck, "wrong_group")
    assert r.code == 1, r.out + r.err
    check = r.check("collectives")
    assert check["status"] == "fail" and {f["site"] for f in check["findings"]} == {"blocks.0", "blocks.1"}, r.out
    for f in check["findings"]:
        assert f["cause"] == "recompute-collective", f
        assert "on default_pg (2 ranks)" in f["details"]["forward"][0], f
        assert "(1 rank)" in f["details"]["recompute"][0], f
