"""The program checked is the program trained: inputs as given, the checkpoint users train with by
default, the model's own units, and PyTorch's own errors as causes. Where a test says what PyTorch
does, it runs PyTorch alone (no ckcheck code) to show it; every detection has its negative control.
"""

import importlib.util
import os

import pytest
import torch
import torch.utils.checkpoint as tc

from conftest import ROOT, fixture, fixture_module

has_transformers = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not has_transformers, reason="transformers is not installed")


def findings(check, cause=None):
    return [f for f in check["findings"] if cause is None or f["cause"] == cause]


def sites_of(check, cause):
    return {f["site"] for f in findings(check, cause)}


# ---- the checkpoint under test is the user's by default ---------------------------------------
def test_a_plain_module_is_checked_under_torchs_non_reentrant_checkpoint_by_default(ckcheck):
    r = ckcheck("run", "--model", fixture("fidelity.py:frozen_first_layer"))
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["checkpoint"] == "torch"
    assert "no checkpointing switch" in r.report["config"]["checkpoint_reason"]
    assert "checkpoint under test: torch" in r.out


def test_a_model_with_its_own_switch_is_checked_with_it_by_default(ckcheck):
    r = ckcheck("run", "--model", fixture("fidelity.py:layer_forward_jitter"))
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["checkpoint"] == "model"
    assert "gradient_checkpointing_enable()" in r.report["config"]["checkpoint_reason"]


@needs_transformers
def test_a_hugging_face_model_is_checked_with_its_own_switch_by_default(ckcheck):
    r = ckcheck("run", "--model", fixture("tiny_gpt2.py:make_model"))
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["checkpoint"] == "model"
    assert r.report["model"]["units"] == ["transformer.h.0", "transformer.h.1"]


def test_cpp_models_keep_ckchecks_own_checkpoint_by_default(ckcheck):
    r = ckcheck("run", "--model", "mlp")
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["checkpoint"] == "ckcheck"


# ---- inputs as given -------------------------------------------------------------------------
def test_pytorch_alone_the_reentrant_checkpoint_gives_blocks_behind_a_frozen_layer_no_gradient():
    m = fixture_module("fidelity.py")
    torch.manual_seed(0)
    net, x = m.frozen_first_layer()
    calls = [b.forward for b in net.blocks]
    for b, f in zip(net.blocks, calls):
        b.forward = lambda h, f=f: tc.checkpoint(f, h, use_reentrant=True)
    with pytest.warns(UserWarning):
        net(x).sum().backward()
    assert all(b.lin.weight.grad is None for b in net.blocks)
    # ... which a caller that made x require grad would never see:
    net.zero_grad(set_to_none=True)
    net(x.clone().requires_grad_()).sum().backward()
    assert all(b.lin.weight.grad is not None for b in net.blocks)


@pytest.mark.parametrize("mode,expect", [("torch-reentrant", 1), ("torch", 0)])
def test_a_frozen_first_layer_under_the_reentrant_checkpoint_is_missing_grad(ckcheck, mode, expect):
    r = ckcheck("run", "--model", fixture("fidelity.py:frozen_first_layer"), "--checkpoint", mode)
    assert r.code == expect, r.out + r.err
    assert r.report["model"]["inputs"][0]["requires_grad"] is False
    if expect:
        assert sites_of(r.check("gradients"), "missing-grad") == {"blocks.0", "blocks.1"}, r.out
    else:
        assert r.check("gradients")["status"] == "pass"


def test_input_requires_grad_on_request_compares_input_gradients(ckcheck):
    r = ckcheck("run", "--model", fixture("fidelity.py:frozen_first_layer"), "--checkpoint", "torch-reentrant",
                "--input-requires-grad")
    assert r.code == 0, r.out + r.err  # the input's graph reaches every block: what the user asked to check
    assert r.report["model"]["inputs"][0]["requires_grad"] is True
    assert r.report["config"]["input_requires_grad"] is True
    assert any(t["kind"] == "input-grad" for t in r.report["tensors"])


def test_a_model_that_sets_its_inputs_requires_grad_itself_runs_and_passes(ckcheck):
    r = ckcheck("run", "--model", fixture("fidelity.py:sets_its_input_grad"))
    assert r.code == 0, r.out + r.err
    # negative control: an input that already requires grad breaks the model (PyTorch alone)
    m = fixture_module("fidelity.py")
    net, x = m.sets_its_input_grad()
    with pytest.raises(RuntimeError, match="leaf"):
        net(x.requires_grad_())


def test_a_cpp_fixtures_report_says_whether_inputs_require_grad(ckcheck):
    plain = ckcheck("run", "--model", "mlp")
    asked = ckcheck("run", "--model", "mlp", "--input-requires-grad")
    assert plain.code == 0 and asked.code == 0, plain.err + asked.err
    assert [i["requires_grad"] for i in plain.report["model"]["inputs"]] == [False]
    assert [i["requires_grad"] for i in asked.report["model"]["inputs"]] == [True]
    assert not any(t["kind"] == "input-grad" for t in plain.report["tensors"])
    assert any(t["kind"] == "input-grad" for t in asked.report["tensors"])


# ---- the model's own units -------------------------------------------------------------------
def test_a_layer_that_checkpoints_its_own_forward_is_the_unit_and_jitter_inside_is_no_mutation(ckcheck):
    r = ckcheck("run", "--model", fixture("fidelity.py:layer_forward_jitter"), "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
    assert r.report["model"]["units"] == ["layers.0", "layers.1"]
    assert r.check("input-mutation")["status"] == "pass"


def test_the_blocks_are_the_children_with_parameters_most_of_a_sequential_share(ckcheck):
    # the stem and the last layer are not of the blocks' class; the head's in-place activation and
    # dropout are no blocks (checkpointed alone, the activation changes the checkpoint's input)
    r = ckcheck("run", "--model", fixture("fidelity.py:stem_blocks_and_head"), "--checkpoint", "torch")
    assert r.code == 0, r.out + r.err
    assert r.report["model"]["units"] == ["features.1", "features.2", "features.3", "classifier.0", "classifier.3"]
    named = ckcheck("run", "--model", fixture("fidelity.py:named_blocks"), "--checkpoint", "torch")
    assert named.code == 0, named.out + named.err
    assert named.report["model"]["units"] == ["blocks.block0", "blocks.block1", "blocks.block2"]


def _plain_calls(model, inputs):
    """PyTorch alone: the modules a forward with the switch off calls, in the order it first calls them."""
    order = []

    def seen(path):
        return lambda *_: None if path in order else order.append(path)

    handles = [m.register_forward_pre_hook(seen(p)) for p, m in model.named_modules() if p]
    model(**inputs) if isinstance(inputs, dict) else model(inputs)
    for h in handles:
        h.remove()
    return order


@pytest.mark.parametrize("file,factory", [
    ("fidelity", "layer_forward_jitter"), ("fidelity", "closure_over_two_modules"), ("fidelity", "hand_checkpoint"),
    pytest.param("tiny_gpt2", "make_model", marks=needs_transformers),
])
def test_under_its_own_switch_the_sites_are_the_modules_the_plain_forward_calls(ckcheck, file, factory):
    # one forward with the switch on finds the sites and the units: the same modules, in the same order
    made = getattr(fixture_module(file + ".py"), factory)()
    model, inputs = (made["model"], made["inputs"]) if isinstance(made, dict) else made
    calls = _plain_calls(model, inputs)
    r = ckcheck("run", "--model", fixture(f"{file}.py:{factory}"), "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
    sites, units = r.report["model"]["sites"], r.report["model"]["units"]
    assert sites[:len(calls)] == calls
    assert set(sites[len(calls):]) <= set(units)


@pytest.mark.parametrize("factory,plain_runs,message", [
    ("fails_checkpointed", True, "the model fails with its own checkpointing on: TypeError"),
    ("fails_plain_and_checkpointed", False, "the model fails without checkpointing: TypeError"),
])
def test_a_model_that_raises_is_named_by_the_forward_that_raises(ckcheck, factory, plain_runs, message):
    model, x = getattr(fixture_module("fidelity.py"), factory)()
    try:  # PyTorch alone: the plain forward, then the one with the switch on
        model(x)
        ran = True
    except TypeError:
        ran = False
    assert ran == plain_runs
    model.gradient_checkpointing_enable()
    with pytest.raises(TypeError):
        model(x)
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"), "--checkpoint", "model")
    assert r.code == 2 and message in r.err and "Traceback" not in r.err, r.err


# A checkpoint over a closure of two modules has their parent as unit; a checkpoint written by hand
# (see below) has the modules its backward runs again.
@pytest.mark.parametrize("good, bad, units", [
    ("closure_over_two_modules", "closure_without_rng_replay", ["pairs.0", "pairs.1"]),
    ("hand_checkpoint", "hand_checkpoint_with_dropout", ["blocks.0", "blocks.1"]),
])
def test_the_units_of_the_models_own_checkpoint_are_the_modules_it_recomputes(ckcheck, good, bad, units):
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{good}"), "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
    assert r.report["model"]["units"] == units
    # negative control: without RNG replay (the closure) or with dropout the hand checkpoint does not
    # replay, the recompute draws other masks at each unit
    failing = ckcheck("run", "--model", fixture(f"fidelity.py:{bad}"), "--checkpoint", "model")
    assert failing.code == 1, failing.out + failing.err
    assert failing.report["model"]["units"] == units
    assert sites_of(failing.check("rng"), "rng") == set(units), failing.out


@needs_transformers
def test_gpt2_with_its_layers_named_as_sites_passes(ckcheck):
    r = ckcheck("run", "--model", fixture("tiny_gpt2.py:make_model"), "--checkpoint", "model",
                "--sites", "transformer.h.*")
    assert r.code == 0, r.out + r.err
    assert r.report["model"]["units"] == ["transformer.h.0", "transformer.h.1"]


@needs_transformers
def test_mixtral_with_router_jitter_under_its_own_switch_passes(ckcheck):
    r = ckcheck("run", "--model", fixture("tiny_moe.py:mixtral_with_jitter"), "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
    assert r.report["model"]["units"] == ["model.layers.0", "model.layers.1"]
    assert r.check("input-mutation")["status"] == "pass"


# ---- PyTorch's errors mapped to causes (each row of docs/python.md's table, triggered for real) ----
ERROR_ROWS = [
    # (factory, --checkpoint, PyTorch's message, cause, site)
    ("changes_a_block_input", "torch-reentrant", "modified by an inplace operation", "in-place", "blocks.0"),
    ("penalty_in_forward", "torch-reentrant", "does not require grad and does not have a grad_fn", "missing-grad",
     "blocks.0"),
    ("growing_cache", "torch", "different metadata than during the forward pass", "stateful", "blocks.1"),
    ("toggling_path", "torch", "trying to save more tensors during recomputation", "stateful", "blocks.1"),
    ("toggling_path_fewer", "torch", "A different number of tensors was saved", "stateful", "blocks.1"),
    # the backward of .grad() reaches the last block first, and PyTorch refuses there
    ("input_gradient_penalty", "torch-reentrant", "incompatible with .grad()", "grad-api", "blocks.1"),
]


@pytest.mark.parametrize("factory,mode,message,cause,site", ERROR_ROWS, ids=[r[0] for r in ERROR_ROWS])
def test_pytorch_error_in_the_checkpointed_step_is_its_cause(ckcheck, factory, mode, message, cause, site):
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"), "--checkpoint", mode)
    assert r.code == 1, r.out + r.err
    grads = r.check("gradients")
    assert grads["status"] == "fail", grads
    (f,) = grads["findings"]
    assert message in f["message"] and f["cause"] == cause and f["site"] == site, f


@pytest.mark.parametrize("factory,mode", [("changes_a_block_input", "torch"), ("penalty_in_forward", "torch"),
                                          ("penalty_in_forward", "ckcheck"), ("input_gradient_penalty", "torch"),
                                          ("input_gradient_penalty", "ckcheck")])
def test_the_same_models_under_the_non_reentrant_checkpoint_raise_nothing(ckcheck, factory, mode):
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"), "--checkpoint", mode)
    assert r.check("gradients")["status"] != "error", r.out + r.err
    assert "error" not in {c["status"] for c in r.report["checks"]}, r.out
    if "penalty" in factory:  # nothing changed in place: the double backward gives plain's gradients,
        # bitwise under torch's; under ckcheck's up to the order the first- and second-order
        # contributions reach each .grad (a warning that names that cause, never a failure)
        grads = r.check("gradients")
        if mode == "torch":
            assert grads["status"] == "pass", r.out
        else:
            assert grads["status"] in ("pass", "warn"), r.out
            assert {f["cause"] for f in grads["findings"]} <= {"accumulation-order"}, r.out


@pytest.mark.parametrize("factory", ["growing_cache", "toggling_path", "toggling_path_fewer"])
def test_state_that_changes_per_call_is_fine_without_checkpoints(ckcheck, factory):
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"), "--checkpoint", "torch", "--policy", "none")
    assert r.code == 0, r.out + r.err


@pytest.mark.parametrize("mode,expect", [("torch-reentrant", 1), ("torch", 0)])
def test_features_captured_inside_a_reentrant_checkpoint_are_reentrant_no_grad(ckcheck, mode, expect):
    r = ckcheck("run", "--model", fixture("fidelity.py:captures_features"), "--checkpoint", mode)
    assert r.code == expect, r.out + r.err
    if expect:
        assert "reentrant-no-grad" in {f["cause"] for f in r.check("gradients")["findings"]}, r.out


# ---- shared modules --------------------------------------------------------------------------
def _plain_and_checkpointed_grads(model, x):
    """PyTorch alone: one step plainly and one with every block under torch's non-reentrant
    checkpoint, each from a copy of the same start."""
    import copy

    out = []
    for checkpointed in (False, True):
        m = copy.deepcopy(model)
        if checkpointed:
            for b in m.blocks:
                b.forward = lambda h, f=b.forward: tc.checkpoint(f, h, use_reentrant=False)
        m(x).square().sum().backward()
        out.append({n: p.grad.clone() for n, p in m.named_parameters()})
    return out


@pytest.mark.parametrize("factory,differ", [("shared_module_updated", True), ("shared_module_kept", False)])
def test_pytorch_alone_a_shared_buffer_moved_after_the_blocks_changes_checkpointed_gradients(factory, differ):
    model, x = getattr(fixture_module("fidelity.py"), factory)()
    plain, checkpointed = _plain_and_checkpointed_grads(model, x)
    assert any(not torch.equal(plain[n], checkpointed[n]) for n in plain) == differ


@pytest.mark.parametrize("factory,expect", [("shared_module_updated", 1), ("shared_module_kept", 0)])
def test_the_state_of_a_shared_module_is_watched_under_every_path(ckcheck, factory, expect):
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"), "--checkpoint", "torch")
    assert r.code == expect, r.out + r.err
    assert r.report["model"]["units"] == ["blocks.0", "blocks.1"]
    if expect:
        assert {f["cause"] for f in r.check("gradients")["findings"]} == {"in-place"}, r.out
        found = findings(r.check("input-mutation"), "in-place")
        assert {(f["site"], f["tensor"]) for f in found} == {("blocks.0", "offset.shift"), ("blocks.1", "offset.shift")}, r.out
        assert all("offset.shift (shared by 3 sites)" in f["message"] for f in found), found


# ---- a recompute that computes something else without changing the step -------------------------
@pytest.mark.parametrize("factory,differ", [("keeps_last_input_added", False), ("keeps_last_input_multiplied", True)])
def test_pytorch_alone_a_kept_member_changes_checkpointed_gradients_only_where_saved(factory, differ):
    model, x = getattr(fixture_module("fidelity.py"), factory)()
    plain, checkpointed = _plain_and_checkpointed_grads(model, x)
    assert any(not torch.equal(plain[n], checkpointed[n]) for n in plain) == differ


@pytest.mark.parametrize("factory,expect", [("keeps_last_input_added", 0), ("keeps_last_input_multiplied", 1)])
def test_a_stateful_recompute_fails_only_where_the_step_shows_it(ckcheck, factory, expect):
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"), "--checkpoint", "torch")
    assert r.code == expect, r.out + r.err
    det = r.check("determinism")
    assert det["status"] == ("fail" if expect else "warn"), r.out
    assert {(f["site"], f["cause"], f["tensor"]) for f in det["findings"]} == {
        ("blocks.0", "stateful", "blocks.0.last"), ("blocks.1", "stateful", "blocks.1.last")}, det
    assert r.check("gradients")["status"] == ("fail" if expect else "pass"), r.out


# ---- output structure ------------------------------------------------------------------------
@needs_transformers
def test_pytorch_alone_gpt2_returns_no_cache_while_its_checkpointing_trains():
    spec = fixture_module("tiny_gpt2.py").with_cache()
    model, inputs = spec["model"], spec["inputs"]
    assert model(**inputs).past_key_values is not None
    model.gradient_checkpointing_enable()
    assert model(**inputs).past_key_values is None


@needs_transformers
def test_gpt2_that_drops_its_cache_under_its_checkpointing_warns_output_structure(ckcheck):
    r = ckcheck("run", "--model", fixture("tiny_gpt2.py:with_cache"))
    assert r.code == 0, r.out + r.err
    grads = r.check("gradients")
    assert grads["status"] == "warn", grads
    (f,) = findings(grads, "output-structure")
    assert "DynamicCache" in f["details"]["plain"] and "DynamicCache" not in f["details"]["checkpointed"], f


@pytest.mark.parametrize("factory,status", [("drops_cache", "warn"), ("keeps_cache", "pass")])
def test_an_output_the_checkpoint_drops_is_a_warning_with_its_cause(ckcheck, factory, status):
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"))
    assert r.code == 0, r.out + r.err
    grads = r.check("gradients")
    assert grads["status"] == status, grads
    assert bool(findings(grads, "output-structure")) == (status == "warn"), grads


# ---- Python's and NumPy's generators ------------------------------------------------------------
HOST_DRAWS = [("numpy_mask_before_blocks", None), ("numpy_mask_inside_a_block", "numpy.random"),
              ("python_random_inside_a_block", "random"), ("kept_generator_inside_a_block", "noise")]


@pytest.mark.parametrize("factory,generator", HOST_DRAWS)
def test_pytorch_alone_a_host_generator_drawn_inside_a_block_changes_checkpointed_gradients(factory, generator):
    import random

    import numpy

    grads = []
    for checkpointed in (False, True):  # each from the same generators' state, as ckcheck's runs are
        random.seed(0)
        numpy.random.seed(0)
        torch.manual_seed(0)
        model, x = getattr(fixture_module("fidelity.py"), factory)()
        if checkpointed:
            for b in model.blocks:
                b.forward = lambda h, f=b.forward: tc.checkpoint(f, h, use_reentrant=False)
        model(x).square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    plain, checkpointed = grads
    assert any(not torch.equal(plain[n], checkpointed[n]) for n in plain) == (generator is not None)


@pytest.mark.parametrize("factory,generator", HOST_DRAWS)
def test_a_draw_from_a_generator_outside_torch_inside_a_block_is_rng(ckcheck, factory, generator):
    # before the blocks: the plain step repeats and the checkpointed one equals it; inside a block
    # the recompute draws another mask, which no checkpoint replays: the rng check names the generator
    r = ckcheck("run", "--model", fixture(f"fidelity.py:{factory}"), "--checkpoint", "torch")
    assert r.code == (1 if generator else 0), r.out + r.err
    assert r.check("gradients")["status"] == ("fail" if generator else "pass"), r.out
    assert {f["cause"] for f in r.check("gradients")["findings"]} == ({"rng"} if generator else set()), r.out
    rng = r.check("rng")
    assert {(f["site"], f["cause"], f["tensor"]) for f in rng["findings"]} == (
        {("blocks.1", "rng", generator)} if generator else set()), rng
    assert not r.check("determinism")["findings"], r.out  # no stateful finding beside it


# ---- one-line errors -------------------------------------------------------------------------
def test_an_error_line_has_no_traceback_and_no_path_the_user_did_not_give(ckcheck, tmp_path):
    model = tmp_path / "broken.py"
    model.write_text("import torch\n\ndef make_model():\n    return torch.nn.Linear(2, 2), torch.randn(3, 5)\n")
    r = ckcheck("run", "--model", f"{model}:make_model")
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckcheck: error: "), r.err
    assert "Traceback" not in r.err and "At:" not in r.err
    assert "site-packages" not in r.err and ROOT not in r.err.replace(str(model), "")
    verbose = ckcheck("run", "--model", f"{model}:make_model", "--verbose")
    assert verbose.code == 2 and len(verbose.err.strip().splitlines()) > 1, verbose.err


# ---- checkpoints inside checkpoints (timm's MetaFormer: the root checkpoints each stage through a
# closure, each stage its blocks), and a checkpoint written by hand (Megatron-LM's and DeepSpeed's
# kind: no torch.utils.checkpoint call for the tap to see; its units are the modules the backward
# runs again) ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("factory, equal", [("nested_checkpoints", True),
                                            ("nested_checkpoints_without_rng_replay", False),
                                            ("hand_checkpoint", True), ("hand_checkpoint_with_dropout", False)])
def test_pytorch_alone_own_checkpoints_change_gradients_only_without_rng_replay(factory, equal):
    model, x = getattr(fixture_module("fidelity.py"), factory)()
    model.train()

    def step(on):
        torch.manual_seed(0)
        model.zero_grad()
        model.gradient_checkpointing = on
        model(x).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain, checkpointed = step(False), step(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed)) == equal


def test_nested_own_checkpoints_are_checked_as_the_outer_unit_without_false_findings(ckcheck):
    r = ckcheck("run", "--model", fixture("fidelity.py:nested_checkpoints"), "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
    assert r.report["model"]["units"] == ["(root)"]
    for check in ("gradients", "input-mutation", "rng", "hooks"):
        assert r.check(check)["status"] == "pass", r.out
    # negative control: the same nesting without RNG replay fails at the outer unit
    bad = ckcheck("run", "--model", fixture("fidelity.py:nested_checkpoints_without_rng_replay"),
                  "--checkpoint", "model")
    assert bad.code == 1, bad.out + bad.err
    assert sites_of(bad.check("rng"), "rng") == {"(root)"}, bad.out
    assert bad.check("input-mutation")["status"] == "pass", bad.out
