"""`ckcheck diagnose --world-size N` (with --parallel ddp|fsdp for a Python model): every rank runs the
diagnosis's steps in lockstep, agreeing on each step's outcome, and rank 0 reports. What PyTorch does
comes from ddp_truth.py and fsdp_truth.py (PyTorch alone on two processes); every detection has its
negative control. Gloo on 127.0.0.1 only.
"""

import sys

import pytest

from conftest import FIXTURES, fixture
from test_fsdp import pytorch_fsdp
from test_parallel import pytorch_ddp

sys.path.insert(0, FIXTURES)

MODELS = fixture("parallel.py")


def diagnose(ckcheck, factory, *extra):
    return ckcheck("diagnose", "--model", f"{MODELS}:{factory}", "--world-size", 2, "--timeout", 300, *extra)


def _differs(a, b):
    return any(a[name] != b[name] for name in a)


def test_ddp_dropout_without_rng_replay_is_traced_to_its_blocks_and_their_random_op(ckcheck, tmp_path):
    # PyTorch: under DDP, checkpointed blocks with dropout give the plain gradients when the
    # recompute replays the RNG state, and other ones when it does not.
    plain = pytorch_ddp(tmp_path, "transformer_dropout", "none")
    replayed = pytorch_ddp(tmp_path, "transformer_dropout", "torch")
    fresh = pytorch_ddp(tmp_path, "transformer_dropout", "torch-no-rng")
    for rank in range(2):
        assert not _differs(plain[rank]["grads"], replayed[rank]["grads"])
        assert _differs(plain[rank]["grads"], fresh[rank]["grads"])
    import torch
    from conftest import factory_result

    model, _ = factory_result("parallel.py", "transformer_dropout")
    with_dropout = {f"blocks.{i}" for i, b in enumerate(model.blocks)
                    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in b.modules())}
    assert with_dropout

    r = diagnose(ckcheck, "transformer_dropout", "--checkpoint", "torch", "--parallel", "ddp", "--no-preserve-rng")
    assert r.code == 1, r.out + r.err
    d = r.report["diagnosis"]
    assert {s["site"] for s in d["sites"]} <= with_dropout and d["sites"], d
    assert {s["cause"] for s in d["sites"]} == {"rng"}, d
    op = d["first_divergent_op"]
    assert op["what"] == "values" and "bernoulli" in op["innermost"] + op["forward"]["name"], op
    assert r.report["command"] == "diagnose" and "--world-size 2" in r.report["reproduce"]
    assert r.report["config"]["world_size"] == 2
    # The negative control: the RNG state replayed, nothing diverges.
    ok = diagnose(ckcheck, "transformer_dropout", "--checkpoint", "torch", "--parallel", "ddp")
    assert ok.code == 0, ok.out + ok.err
    assert not ok.report["diagnosis"]["sites"] and "nothing diverges" in ok.report["diagnosis"]["summary"]


def test_fsdp2_recompute_in_another_dtype_is_traced_to_its_first_op(ckcheck, tmp_path):
    # PyTorch: FSDP2 in bf16 stops on the planted blocks' recompute (the saved tensors' dtypes
    # differ); the same blocks recomputing in their forward's dtype train fine.
    assert "CheckpointError" in pytorch_fsdp(tmp_path, "upcast_in_recompute", "torch", "bf16")[0]["error"]
    assert not pytorch_fsdp(tmp_path, "same_dtype_in_recompute", "torch", "bf16")[0]["error"]

    r = diagnose(ckcheck, "upcast_in_recompute", "--checkpoint", "torch", "--parallel", "fsdp",
                 "--mixed-precision", "bf16")
    assert r.code == 1, r.out + r.err
    d = r.report["diagnosis"]
    assert d["sites"] and {s["cause"] for s in d["sites"]} == {"recompute-dtype"}, d
    op = d["first_divergent_op"]
    assert op["site"] == d["sites"][0]["site"]
    assert "BFloat16" in op["forward"]["dtypes"] and "Float" in op["recompute"]["dtypes"], op
    # The negative control: the recompute in its forward's dtype.
    ok = diagnose(ckcheck, "same_dtype_in_recompute", "--checkpoint", "torch", "--parallel", "fsdp",
                  "--mixed-precision", "bf16")
    assert ok.code == 0, ok.out + ok.err
    assert not ok.report["diagnosis"]["sites"]


@pytest.mark.parametrize("flag", [[], ["--no-preserve-rng"]])
def test_a_cpp_model_on_two_ranks_gets_the_diagnosis_of_one_process(ckcheck, flag):
    # ckcheck's own data parallelism on a built-in model: the ranks agree on every bisection step,
    # so the sites and the first divergent op are those one process finds (the gradients are
    # averaged over the ranks, each rank draws its own masks).
    one = ckcheck("diagnose", "--model", "transformer", "--layers", 3, *flag)
    two = ckcheck("diagnose", "--model", "transformer", "--layers", 3, "--world-size", 2, "--timeout", 300, *flag)
    assert two.code == one.code, two.out + two.err
    a, b = one.report["diagnosis"], two.report["diagnosis"]
    assert [(s["site"], s["cause"]) for s in a["sites"]] == [(s["site"], s["cause"]) for s in b["sites"]]
    if flag:
        assert b["sites"] and a["first_divergent_op"]["forward"]["name"] == b["first_divergent_op"]["forward"]["name"]


def test_run_diagnose_on_ranks_adds_the_diagnosis_to_a_failing_run(ckcheck):
    r = ckcheck("run", "--model", f"{MODELS}:transformer_dropout", "--checkpoint", "torch", "--parallel", "ddp",
                "--world-size", 2, "--timeout", 300, "--no-preserve-rng", "--diagnose")
    assert r.code == 1 and r.report["command"] == "run", r.out + r.err
    assert {s["cause"] for s in r.report["diagnosis"]["sites"]} == {"rng"}
    ok = ckcheck("run", "--model", f"{MODELS}:transformer_dropout", "--checkpoint", "torch", "--parallel", "ddp",
                 "--world-size", 2, "--timeout", 300, "--diagnose")
    assert ok.code == 0 and "diagnosis" not in ok.report, ok.out + ok.err
