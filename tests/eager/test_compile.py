"""Compiled training (--compile): the compiled plain step against the compiled checkpointed step,
the eager step against the compiled one, and what the compiled graphs show. Where a test says what
PyTorch does, it compiles the model with torch.compile alone (no ckcheck code) to show it; every
detection has its negative control.
"""

import functools

import pytest
import torch
import torch._functorch.config as functorch_config

from conftest import factory_result, fixture

MODELS = fixture("compiled.py")


def _factory(name):
    return factory_result("compiled.py", name)


def torch_gradients_differ(name, budget=None, switch=False):
    """PyTorch alone: one compiled training step plainly and one under the memory budget (or the
    model's own switch on), from the same weights and seed; True when a parameter gradient differs."""
    model, x = _factory(name)
    grads = []
    for variant in (False, True):
        torch._dynamo.reset()
        if switch:
            (model.gradient_checkpointing_enable if variant else model.gradient_checkpointing_disable)()
        compiled = torch.compile(model)
        with functorch_config.patch(activation_memory_budget=budget if (variant and budget is not None) else 1.0):
            torch.manual_seed(1)
            compiled(x).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    return any(not torch.equal(a, b) for a, b in zip(*grads))


def findings(check, cause=None):
    return [f for f in check["findings"] if cause is None or f["cause"] == cause]


# ---- the compiler's memory budget recomputes random ops with new numbers ------------------------
def test_random_ops_recomputed_under_a_zero_budget_fail_with_the_op_named(ckcheck):
    assert torch_gradients_differ("random_ops", budget=0.0), "PyTorch: budget 0 changes the gradients"
    r = ckcheck("run", "--model", f"{MODELS}:random_ops", "--compile", "--memory-budget", "0")
    assert r.code == 1, r.out + r.err
    assert r.report["config"]["checkpoint"] == "compiler"
    assert r.report["config"]["memory_budget"] == 0
    grads = r.check("gradients")
    assert grads["status"] == "fail"
    assert {f["cause"] for f in grads["findings"]} == {"rng"}
    rng = r.check("rng")
    assert rng["status"] == "fail"
    named = " ".join(f["tensor"] + " " + f["message"] for f in rng["findings"])
    assert "randn_like" in named and "drop" in named
    assert {f["site"] for f in rng["findings"]} >= {"blocks.0", "blocks.0.drop"}
    assert r.check("determinism")["status"] == "skip"
    assert r.check("compile")["details"]["random_ops_recomputed_fresh"] == len(rng["findings"])
    assert "--compile" in r.report["reproduce"] and "--memory-budget 0" in r.report["reproduce"]


def test_the_same_layers_without_random_ops_pass_under_a_zero_budget(ckcheck):
    assert not torch_gradients_differ("no_random_ops", budget=0.0), "PyTorch: budget 0 changes nothing here"
    r = ckcheck("run", "--model", f"{MODELS}:no_random_ops", "--compile", "--memory-budget", "0")
    assert r.code == 0, r.out + r.err
    assert r.check("gradients")["status"] == "pass"
    assert r.check("rng")["status"] == "pass"
    c = r.check("compile")
    assert c["status"] == "pass"
    # Without random ops the eager step is compared with the compiled one, within the tolerance.
    assert c["details"]["eager_compared"] is True
    assert c["details"]["eager_max_rel"] <= c["details"]["eager_tolerance"]


@pytest.mark.parametrize("mode", ["torch", "torch-reentrant"])
def test_torchs_checkpoint_inside_the_compiled_graph_replays_the_random_ops(ckcheck, mode):
    # The negative control of the budget: the same random model, checkpointed block by block
    # inside the compiled graph (both modes are the compiler's checkpoint there), recomputes its
    # random ops on the forward's seeds.
    r = ckcheck("run", "--model", f"{MODELS}:random_ops", "--compile", "--checkpoint", mode)
    assert r.code == 0, r.out + r.err
    assert r.check("gradients")["status"] == "pass"
    assert r.check("rng")["status"] == "pass"
    assert "replayed" in r.check("rng")["summary"]
    assert r.report["model"]["units"] == ["blocks.0", "blocks.1", "blocks.2"]
    assert r.check("compile")["status"] == "pass"  # no graph break: the control of the next test


def checkpoints_in_dynamos_graphs(name):
    """PyTorch alone: how many torch.utils.checkpoint calls Dynamo keeps in its graphs when every
    block of the model is checkpointed and the model compiled."""
    torch._dynamo.reset()
    model, x = _factory(name)
    for b in model.blocks:
        b.forward = functools.partial(torch.utils.checkpoint.checkpoint, b.forward, use_reentrant=False)
    kept = []

    def backend(gm, example_inputs):
        kept.extend(n for n in gm.graph.nodes if "checkpoint" in str(n.target))
        return gm.forward

    torch.compile(model, backend=backend)(x).sum().backward()
    torch._dynamo.reset()
    return len(kept)


def test_a_graph_break_inside_a_checkpointed_block_is_reported(ckcheck):
    # PyTorch alone: Dynamo cannot keep the checkpoint of a block that breaks the graph in its
    # graphs (it keeps all three without the break), so that checkpoint runs outside them.
    assert checkpoints_in_dynamos_graphs("no_random_ops") == 3
    assert checkpoints_in_dynamos_graphs("graph_break_in_a_block") < 3
    r = ckcheck("run", "--model", f"{MODELS}:graph_break_in_a_block", "--compile", "--checkpoint", "torch")
    assert r.code == 0, r.out + r.err  # warnings
    c = r.check("compile")
    assert c["status"] == "warn"
    [finding] = findings(c, "graph-break")
    assert "skipped" in finding["message"]
    # The checkpoint outside the graph sums the gradients in other kernels: rounding, said as such.
    g = r.check("gradients")
    assert g["status"] in ("pass", "warn")
    assert {f["cause"] for f in g["findings"]} <= {"accumulation-order"}


def test_a_model_that_checkpoints_its_own_blocks_passes_compiled_whole(ckcheck):
    assert not torch_gradients_differ("self_checkpointing", switch=True), "PyTorch: its switch changes nothing"
    r = ckcheck("run", "--model", f"{MODELS}:self_checkpointing", "--compile", "--checkpoint", "model")
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["checkpoint"] == "model"
    assert r.check("gradients")["status"] == "pass"
    assert r.check("compile")["details"]["checkpointed_graphs"] == 1


def test_a_module_the_factory_compiled_is_checked_compiled(ckcheck):
    # Without --compile the program checked would not be the one trained: refused, saying what to add.
    r = ckcheck("run", "--model", f"{MODELS}:compiled_by_the_factory")
    assert r.code == 2 and "add --compile" in r.err, r.out + r.err
    r = ckcheck("run", "--model", f"{MODELS}:compiled_by_the_factory", "--compile", "--compile-mode", "reduce-overhead")
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["compile_mode"] == "reduce-overhead"
    assert r.check("compile")["details"]["mode"] == "reduce-overhead"
    assert r.report["model"]["units"] == ["blocks.0", "blocks.1", "blocks.2"]


# ---- diagnose names the site -------------------------------------------------------------------
def test_diagnose_names_the_block_whose_random_op_the_compiler_recomputes(ckcheck):
    r = ckcheck("diagnose", "--model", f"{MODELS}:random_in_one_block", "--compile", "--memory-budget", "0")
    assert r.code == 1, r.out + r.err
    sites = r.report["diagnosis"]["sites"]
    assert [s["site"] for s in sites] == ["blocks.1"]
    assert sites[0]["cause"] == "rng"
    assert "blocks.1" in r.out


# ---- bench ---------------------------------------------------------------------------------------
def test_bench_measures_the_compilers_budgets_beside_its_own_estimate(ckcheck):
    r = ckcheck("bench", "--model", f"{MODELS}:no_random_ops", "--compile", "--policies", "every:1,budget:0,budget:1",
                "--steps", "3", "--warmup", "1", "--time-budget", "5")
    assert r.code == 0, r.out + r.err
    policies = {p["policy"]: p for p in r.report["policies"]}
    assert set(policies) == {"none", "every:1", "budget:0", "budget:1"}
    assert all(p["peak_bytes"] >= 0 and p["time_median_s"] > 0 for p in policies.values())
    # The estimate is the compiler's: what its graphs save. Budget 0 recomputes what it can, so it
    # saves less than budget 1, which saves what the plain compiled step saves.
    estimate = {name: p["analytic_bytes"] for name, p in policies.items()}
    assert estimate["budget:0"] < estimate["budget:1"] == estimate["none"]
    assert "compiler's own graphs" in r.report["analytic_formula"]


def test_a_budget_policy_without_compile_is_refused(ckcheck):
    r = ckcheck("run", "--model", f"{MODELS}:no_random_ops", "--policy", "budget:0.5")
    assert r.code == 2
    assert "--compile" in r.err and len(r.err.strip().splitlines()) == 1


# ---- usage ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--memory-budget", "0"], "add --compile"),
    (["--compile-mode", "max-autotune-no-cudagraphs"], "add --compile"),
    (["--compile", "--checkpoint", "ckcheck"], "cannot run inside a compiled graph"),
    (["--compile", "--memory-budget", "2"], "--memory-budget"),
])
def test_compile_options_that_cannot_apply_are_refused_in_one_line(ckcheck, args, words):
    r = ckcheck("run", "--model", f"{MODELS}:no_random_ops", *args)
    assert r.code == 2, r.out + r.err
    assert words in r.err
    assert len(r.err.strip().splitlines()) == 1
    assert "Traceback" not in r.err


def test_compile_is_refused_for_a_cpp_model(ckcheck):
    r = ckcheck("run", "--model", "mlp", "--compile")
    assert r.code == 2
    assert "applies to Python models" in r.err


def test_the_python_binding_takes_the_compile_options():
    import ckcheck

    model, x = _factory("random_ops")
    caches = (torch._inductor.config.fx_graph_cache, functorch_config.enable_autograd_cache)
    report = ckcheck.run(model, (x,), compile=True, memory_budget=0.0)
    assert report.verdict == "fail"
    assert "rng" in {f.cause for f in report.findings}
    assert "compile=True" in report.reproduce and "memory_budget=0.0" in report.reproduce
    # The model gets its own forwards back, and the process its compiler's settings.
    assert all("forward" not in vars(m) for m in model.modules())
    assert (torch._inductor.config.fx_graph_cache, functorch_config.enable_autograd_cache) == caches
