"""Eager PyTorch models through `ckcheck run --model FILE.py:factory` and the Python package:
ckcheck's own checkpoint, torch.utils.checkpoint (both modes) and the model's own switch, each
verdict with its negative control."""

import importlib.util

import pytest
import torch

import ckcheck
from conftest import fixture, fixture_module, twin

has_transformers = importlib.util.find_spec("transformers") is not None
has_peft = importlib.util.find_spec("peft") is not None
needs_transformers = pytest.mark.skipif(not has_transformers, reason="transformers is not installed")
needs_peft = pytest.mark.skipif(not (has_transformers and has_peft), reason="peft or transformers is not installed")


def causes(check):
    return {(f["cause"], f["site"]) for f in check["findings"]}


# ---- a Hugging Face causal LM: its own switch, and PyTorch's checkpoint without RNG replay -------
@needs_transformers
def test_tiny_gpt2_passes_with_its_own_checkpointing(ckcheck):
    r = ckcheck("run", "--model", fixture("tiny_gpt2.py:make_model"), "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
    assert r.report["verdict"] == "pass"
    assert r.check("rng")["status"] == "pass"
    assert "transformer.h.0" in r.out and "transformer.h.1" in r.out  # the layers it checkpoints


@needs_transformers
@pytest.mark.parametrize("preserve", [True, False])
def test_tiny_gpt2_under_torch_checkpoint_needs_rng_replay(ckcheck, preserve):
    args = ["run", "--model", fixture("tiny_gpt2.py:make_model"), "--checkpoint", "torch"]
    r = ckcheck(*args, *([] if preserve else ["--no-preserve-rng"]))
    if preserve:
        assert r.code == 0, r.out + r.err
        assert r.check("rng")["status"] == "pass"
    else:
        assert r.code == 1, r.out + r.err
        rng = r.check("rng")
        assert rng["status"] == "fail"
        assert {site for _, site in causes(rng)} >= {"transformer.h.0", "transformer.h.1"}


# ---- a site input changed in place after the forward: silent in PyTorch, found by ckcheck -------
def _inplace_module():
    return fixture_module("inplace_after_forward.py")


def test_pytorch_itself_is_silent_on_an_input_changed_after_the_forward():
    """torch.utils.checkpoint(use_reentrant=False), as a training script calls it: no error."""
    m = _inplace_module()
    torch.manual_seed(0)
    net, x = m.make_model()

    def grads(checkpointed):
        net.zero_grad()
        calls = [block.forward for block in net.blocks]
        if checkpointed:
            for block, forward in zip(net.blocks, calls):
                block.forward = lambda h, extra, f=forward: torch.utils.checkpoint.checkpoint(
                    f, h, extra, use_reentrant=False)
        try:
            net(x).sum().backward()  # no error raised
        finally:
            for block in net.blocks:
                block.__dict__.pop("forward", None)
        return [p.grad.clone() for p in net.parameters()]

    plain, ckpt = grads(False), grads(True)
    assert any(not torch.equal(a, b) for a, b in zip(plain, ckpt))


@pytest.mark.parametrize("factory,expect", [("make_model", 1), ("make_clean_model", 0)])
def test_input_changed_after_the_forward_is_in_place_under_torch(ckcheck, factory, expect):
    r = ckcheck("run", "--model", fixture(f"inplace_after_forward.py:{factory}"), "--checkpoint", "torch")
    assert r.code == expect, r.out + r.err
    if expect:
        # blocks 0 and 1 read the shift before the parent changed it; block 2 after
        found = causes(r.check("input-mutation")) | causes(r.check("gradients"))
        assert {site for cause, site in found if cause == "in-place"} == {"blocks.0", "blocks.1"}, found
    else:
        assert r.check("input-mutation")["status"] == "pass"


def _lora_grads(report):
    return [(t["name"], t["missing"] != "checkpointed") for t in report["tensors"]
            if t["kind"] == "param-grad" and "lora_" in t["name"]]


# ---- PEFT LoRA on a frozen base: the reentrant checkpoint's trap ------------------------------
@needs_peft
@pytest.mark.parametrize("mode,expect", [("torch-reentrant", 1), ("torch", 0), ("ckcheck", 0)])
def test_lora_gets_no_gradient_only_under_the_reentrant_checkpoint(ckcheck, mode, expect):
    r = ckcheck("run", "--model", fixture("lora_gpt2.py:make_model"), "--checkpoint", mode)
    assert r.code == expect, r.out + r.err
    grads = r.check("gradients")
    if expect:
        missing = [f for f in grads["findings"] if f["cause"] == "missing-grad"]
        assert missing, grads
        named = " ".join(f["message"] for f in missing)
        lora = [n for n, in_ckpt in _lora_grads(r.report) if not in_ckpt]
        assert len(lora) == 4 and all(n in named for n in lora), named  # A and B of both layers
    else:
        assert grads["status"] in ("pass", "warn"), grads


# ---- the Python package ------------------------------------------------------------------------
@pytest.mark.parametrize("checkpoint", ["ckcheck", "torch", "torch-reentrant"])
def test_assert_checkpoint_equivalent_passes_a_correct_model(checkpoint):
    model, x = twin("mlp")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = ckcheck.assert_checkpoint_equivalent(model, (x,), checkpoint=checkpoint)
    assert report["verdict"] == "pass"
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # left as it was


def test_assert_checkpoint_equivalent_fails_with_the_console_report():
    model, x = twin("faulty_stateful_counter")
    with pytest.raises(ckcheck.CheckpointMismatch) as caught:
        ckcheck.assert_checkpoint_equivalent(model, (x,), checkpoint="torch")
    text = str(caught.value)
    assert "FAIL" in text and "blocks.1" in text and "stateful" in text
    assert caught.value.report["verdict"] == "fail"


def test_run_returns_the_report_with_sites_and_keyword_inputs():
    model, ids = twin("transformer")
    report = ckcheck.run(model, {"ids": ids}, sites="blocks.*.attn", checkpoint="torch")
    assert report["verdict"] == "pass"
    assert report["model"]["checkpointed"] == ["blocks.0.attn", "blocks.1.attn"]


def test_a_reports_reproduce_line_is_the_call_that_reproduces_it():
    model, x = twin("faulty_stateful_counter")
    report = ckcheck.run(model, (x,), checkpoint="torch", sites=["blocks.*"], seed=3)
    call = report["reproduce"]
    assert call.startswith("ckcheck.run(model, inputs, ") and "_registry" not in call, call
    assert f"# model: {type(model).__module__}.{type(model).__qualname__}" in call
    assert "_registry" not in report["console"]
    again = eval(call.partition("  #")[0], {"ckcheck": ckcheck, "model": model, "inputs": (x,)})
    assert again["verdict"] == report["verdict"] == "fail"
    assert [c["status"] for c in again["checks"]] == [c["status"] for c in report["checks"]]
    assert again["config"]["seed"] == 3 and again["model"]["checkpointed"] == report["model"]["checkpointed"]


def test_run_refuses_what_cannot_be_checked_in_one_line():
    model, x = twin("mlp")
    with pytest.raises(ckcheck.UsageError, match="no site"):
        ckcheck.run(model, (x,), sites="nothing.here")
    with pytest.raises(ckcheck.UsageError, match="floating-point"):
        ckcheck.run(model, (x,), loss=lambda out: out.argmax(-1))


# ---- what cannot be checked: one line, exit 2 --------------------------------------------------
BAD_FACTORIES = {
    "raises": ("def make_model():\n    raise ValueError('no config')\n", "ValueError: no config"),
    "not_a_module": ("def make_model():\n    return 42\n", "must return an nn.Module"),
    "import_fails": ("import no_such_package_xyz\n", "importing"),
    "int_output": ("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x.long()\n"
                   "def make_model():\n    return M(), torch.ones(2, 3)\n", "floating-point"),
    "no_inputs": ("import torch\ndef make_model():\n    return torch.nn.Linear(2, 2)\n", "--input-shape"),
}


@pytest.mark.parametrize("case", sorted(BAD_FACTORIES))
def test_a_bad_factory_is_one_line_and_exit_2(ckcheck, tmp_path, case):
    source, words = BAD_FACTORIES[case]
    path = tmp_path / f"bad_{case}.py"
    path.write_text(source)
    r = ckcheck("run", "--model", f"{path}:make_model")
    assert r.code == 2, r.out + r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.err
    assert "Traceback" not in r.err


def test_missing_file_and_callable_are_one_line(ckcheck):
    for spec, words in (("no/such/file.py:make_model", "no Python file"),
                        (fixture("twins.py:no_such_factory"), "no callable")):
        r = ckcheck("run", "--model", spec)
        assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_a_site_never_called_is_refused(ckcheck):
    r = ckcheck("run", "--model", fixture("twins.py:mlp"), "--sites", "unused.*")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err


def test_checkpoint_modes_other_than_ckcheck_need_a_python_model(ckcheck):
    r = ckcheck("run", "--model", "mlp", "--checkpoint", "torch")
    assert r.code == 2 and "Python models" in r.err


# ---- diagnose and bench on Python models -------------------------------------------------------
@pytest.mark.parametrize("mode", ["ckcheck", "torch", "torch-reentrant"])
def test_diagnose_finds_the_first_divergent_op_of_a_python_model(ckcheck, mode):
    r = ckcheck("diagnose", "--model", fixture("twins.py:faulty_nondeterministic_op"), "--checkpoint", mode)
    assert r.code == 1, r.out + r.err
    assert "blocks.1  non-deterministic" in r.out
    assert "first divergent op: aten::add (op" in r.out and "of blocks.1): values differ" in r.out


def test_diagnose_of_a_correct_python_model_blames_no_site(ckcheck):
    r = ckcheck("diagnose", "--model", fixture("twins.py:mlp"), "--checkpoint", "torch")
    assert r.code == 0, r.out + r.err
    assert "first divergent op" not in r.out


def test_bench_measures_a_python_model_under_each_policy(ckcheck):
    r = ckcheck("bench", "--model", fixture("twins.py:transformer"), "--policies", "none,every:1",
                "--steps", "2", "--warmup", "1")
    assert r.code == 0, r.out + r.err
    peaks = {p["policy"]: p["peak_bytes"] for p in r.report["policies"]}
    assert set(peaks) == {"none", "every:1"}
    assert peaks["every:1"] < peaks["none"]  # checkpointing the blocks keeps less


def test_run_writes_nothing_to_the_terminal(capfd):
    model, x = twin("mlp")
    ckcheck.run(model, (x,))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


# ---- rounding from another summation order is a warning, not a wrong gradient -----------------
@needs_transformers
@pytest.mark.parametrize("mode,status", [("ckcheck", "warn"), ("torch-reentrant", "warn"), ("torch", "pass")])
def test_t5_shared_position_bias_differs_by_rounding_only_under_reentrant_checkpoints(ckcheck, mode, status):
    r = ckcheck("run", "--model", fixture("tiny_t5.py:make_model"), "--checkpoint", mode)
    assert r.code == 0, r.out + r.err
    grads = r.check("gradients")
    assert grads["status"] == status, grads
    if status == "warn":
        assert {c for c, _ in causes(grads)} == {"accumulation-order"}, grads
