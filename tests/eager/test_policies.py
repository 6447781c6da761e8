"""Op-level selective checkpointing (--checkpoint torch-sac) and activation offloading (--offload
cpu). Where a test says what PyTorch does, it runs the model with torch.utils.checkpoint and
saved-tensor hooks alone (no ckcheck code); every detection has its negative control.
"""

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from conftest import factory_result, fixture

MODELS = fixture("policies.py")
TWINS = fixture("twins.py")


def _grads(model, x, around=None, hooks=None):
    """One step of PyTorch alone: each block under `around` (a checkpoint) when given, the forward
    under `hooks` (saved-tensor hooks) when given; the parameter gradients."""
    model.zero_grad(set_to_none=True)
    for b in model.blocks:
        b.gen = torch.Generator().manual_seed(23) if b.gen is not None else None
    h = x
    with hooks() if hooks else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        for b in model.blocks:
            h = around(b, h) if around else b(h)
        out = model.head(h)
    out.sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def sac_changes_gradients(saved_ops):
    """PyTorch alone: noise_blocks plainly and with every block under a non-reentrant checkpoint
    whose op policy saves `saved_ops`; True when a gradient differs."""
    model, x = factory_result("policies.py", "noise_blocks")

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op.overloadpacket in saved_ops else CheckpointPolicy.PREFER_RECOMPUTE

    def around(block, h):
        return checkpoint(block, h, use_reentrant=False,
                          context_fn=lambda: create_selective_checkpoint_contexts(policy))

    plain, sac = _grads(model, x), _grads(model, x, around=around)
    return any(not torch.equal(a, b) for a, b in zip(plain, sac))


def offload_changes_gradients(name):
    """PyTorch alone: the factory's model plainly and under its own offload hooks."""
    result = factory_result("policies.py", name)
    model, x = result["model"], result["inputs"]
    plain, offloaded = _grads(model, x), _grads(model, x, hooks=result["offload"])
    return any(not torch.equal(a, b) for a, b in zip(plain, offloaded))


def findings(check, cause=None):
    return [f for f in check["findings"] if cause is None or f["cause"] == cause]


# ---- selective activation checkpointing ------------------------------------------------------------
def test_the_transformer_twin_under_sac_saving_matmuls_passes(ckcheck):
    r = ckcheck("run", "--model", f"{TWINS}:transformer", "--checkpoint", "torch-sac", "--sac-save", "aten.mm")
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["checkpoint"] == "torch-sac"
    assert r.report["config"]["sac_save"] == "aten.mm"
    assert r.check("gradients")["status"] == "pass"


def test_a_random_op_sac_recomputes_without_replay_fails_rng(ckcheck):
    assert sac_changes_gradients({torch.ops.aten.mm}), "PyTorch: recomputing the private noise changes the gradients"
    r = ckcheck("run", "--model", f"{MODELS}:noise_blocks", "--checkpoint", "torch-sac", "--sac-save", "aten.mm")
    assert r.code == 1, r.out + r.err
    rng = r.check("rng")
    assert rng["status"] == "fail", rng
    assert {f["site"] for f in findings(rng)} == {"blocks.1"}
    grads = r.check("gradients")
    assert grads["status"] == "fail"
    assert {(f["cause"], f["site"]) for f in findings(grads)} == {("rng", "blocks.1")}


def test_the_same_random_op_saved_by_the_policy_passes(ckcheck):
    # The negative control: saved, the noise is not drawn again.
    assert not sac_changes_gradients({torch.ops.aten.mm, torch.ops.aten.rand}), "PyTorch: saved, nothing changes"
    r = ckcheck("run", "--model", f"{MODELS}:noise_blocks", "--checkpoint", "torch-sac", "--sac-save",
                "aten.mm,aten.rand")
    assert r.code == 0, r.out + r.err
    assert r.check("rng")["status"] == "pass"


def test_the_factorys_own_policy_is_the_one_checked(ckcheck):
    r = ckcheck("run", "--model", f"{MODELS}:noise_blocks_own_policy")
    assert r.report["config"]["checkpoint"] == "torch-sac", r.report["config"]
    assert "context_fn" in r.report["model"]["checkpoint_reason"]
    assert r.code == 1 and r.check("rng")["status"] == "fail", r.out + r.err
    clean = ckcheck("run", "--model", f"{MODELS}:clean_blocks", "--checkpoint", "torch-sac", "--sac-save", "aten.mm")
    assert clean.code == 0, clean.out + clean.err


@pytest.mark.parametrize("args, words", [
    (["--model", f"{MODELS}:clean_blocks", "--sac-save", "aten.mm"], "add --checkpoint torch-sac"),
    (["--model", f"{MODELS}:clean_blocks", "--checkpoint", "torch-sac"], "needs the op policy"),
    (["--model", f"{MODELS}:clean_blocks", "--checkpoint", "torch-sac", "--sac-save", "aten.nosuchop"], "no op aten.nosuchop"),
    (["--model", f"{MODELS}:clean_blocks", "--checkpoint", "torch-sac", "--sac-save", "mm"], "NAMESPACE.OP"),
    (["--model", f"{MODELS}:noise_blocks_own_policy", "--checkpoint", "torch-sac", "--sac-save", "aten.mm"], "give one"),
    (["--model", "mlp", "--checkpoint", "torch-sac"], "applies to Python models"),
    (["--model", "mlp", "--offload", "cpu"], "applies to Python models"),
    (["--model", f"{MODELS}:clean_blocks", "--offload", "gpu"], "--offload"),
    (["--model", f"{MODELS}:clean_blocks", "--checkpoint", "torch-sac", "--sac-save", "aten.mm", "--compile"], "torch-sac"),
    (["--model", "mlp", "--policy", "sac:aten.mm"], "applies to a Python model"),
    (["--model", f"{MODELS}:clean_blocks", "--checkpoint", "torch-reentrant", "--policy", "sac:aten.mm"], "torch or torch-sac"),
    (["--model", f"{MODELS}:clean_blocks", "--policy", "sac:mm"], "not an op"),
    (["--model", f"{MODELS}:clean_blocks", "--policy", "sac:aten.nosuchop"], "no op aten.nosuchop"),
])
def test_usage_errors_say_what_to_do(ckcheck, args, words):
    r = ckcheck("run", *args)
    assert r.code == 2, r.out + r.err
    assert words in r.err, r.err
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err


# ---- sac:OPS as a policy of its own ----------------------------------------------------------------
def test_sac_policies_beside_module_policies_in_one_bench(ckcheck):
    # The op policy that recomputes the random op fails its checks and is never ranked; the one that
    # saves it passes. Both are measured in the same interleaved rounds as none and every:1.
    r = ckcheck("bench", "--model", f"{MODELS}:noise_blocks", "--policies", "none,every:1,sac:aten.mm,sac:aten.mm+aten.rand",
                "--steps", "3", "--warmup", "1", "--time-budget", "0")
    assert r.code == 0, r.out + r.err
    rows = {p["policy"]: p for p in r.report["policies"]}
    assert set(rows) == {"none", "every:1", "sac:aten.mm", "sac:aten.mm+aten.rand"}
    assert rows["sac:aten.mm"]["checks"] == "fail" and not rows["sac:aten.mm"]["ranked"], rows["sac:aten.mm"]
    assert any("rng" in f for f in rows["sac:aten.mm"]["check_failures"]), rows["sac:aten.mm"]
    assert rows["sac:aten.mm+aten.rand"]["checks"] == "pass", rows["sac:aten.mm+aten.rand"]
    assert r.report["recommendation"] != "sac:aten.mm"


def test_run_takes_a_sac_policy_as_bench_prints_it(ckcheck):
    clean = ckcheck("run", "--model", f"{TWINS}:transformer", "--policy", "sac:aten.mm")
    assert clean.code == 0, clean.out + clean.err
    noisy = ckcheck("run", "--model", f"{MODELS}:noise_blocks", "--policy", "sac:aten.mm")
    assert noisy.code == 1 and noisy.statuses()["rng"] == "fail", noisy.out + noisy.err


# ---- activation offloading -----------------------------------------------------------------------
def test_bench_measures_offloaded_policies_and_says_what_the_figure_means(ckcheck):
    r = ckcheck("bench", "--model", f"{TWINS}:mlp", "--offload", "cpu", "--policies", "none,every:1", "--steps", "3",
                "--warmup", "1", "--time-budget", "0")
    assert r.code == 0, r.out + r.err
    assert r.report["offload"] == "cpu" and "on the CPU" in r.report["offload_note"], r.report.get("offload_note")
    assert {p["policy"]: p["checks"] for p in r.report["policies"]}["every:1"] == "pass"
    # An offload that reuses its buffers changes the gradients: the policy is measured, never ranked.
    bad = ckcheck("bench", "--model", f"{MODELS}:offload_reuses_buffers", "--offload", "cpu", "--policies", "none,every:1",
                  "--steps", "3", "--warmup", "1", "--time-budget", "0")
    assert bad.code == 0, bad.out + bad.err
    row = {p["policy"]: p for p in bad.report["policies"]}["every:1"]
    assert row["checks"] == "fail" and not row["ranked"], row
    # Without --offload nothing says offload.
    plain = ckcheck("bench", "--model", f"{TWINS}:mlp", "--policies", "none,every:1", "--steps", "2", "--warmup", "1",
                    "--time-budget", "0")
    assert "offload" not in plain.report



def test_offloading_a_clean_model_passes(ckcheck):
    r = ckcheck("run", "--model", f"{TWINS}:mlp", "--offload", "cpu")
    assert r.code == 0, r.out + r.err
    offload = r.check("offload")
    assert offload["status"] == "pass", offload
    assert offload["details"]["packed_tensors"] > 0
    assert offload["details"]["hooks"] == "ckcheck's copy to the CPU"
    assert r.report["config"]["offload"] == "cpu"


def test_an_offload_that_reuses_its_buffers_fails_with_the_cause(ckcheck):
    assert offload_changes_gradients("offload_reuses_buffers"), "PyTorch: the pooled offload changes the gradients"
    r = ckcheck("run", "--model", f"{MODELS}:offload_reuses_buffers", "--offload", "cpu")
    assert r.code == 1, r.out + r.err
    offload = r.check("offload")
    assert offload["status"] == "fail"
    assert [f["cause"] for f in offload["findings"]] == ["offload"]
    assert offload["details"]["hooks"] == "the factory's offload"
    assert offload["findings"][0]["hint"]


def test_pytorchs_save_on_cpu_as_the_factorys_offload_passes(ckcheck):
    # The negative control: the same model, offloaded by PyTorch's own hooks.
    assert not offload_changes_gradients("offload_save_on_cpu")
    r = ckcheck("run", "--model", f"{MODELS}:offload_save_on_cpu", "--offload", "cpu")
    assert r.code == 0, r.out + r.err
    assert r.check("offload")["status"] == "pass"


def test_without_offload_nothing_is_offloaded(ckcheck):
    r = ckcheck("run", "--model", f"{MODELS}:offload_reuses_buffers")
    assert r.code == 0, r.out + r.err
    assert "offload" not in r.statuses()


def test_plan_refuses_a_models_own_switch_in_one_line(ckcheck):
    # The switch checkpoints every block at once: a plan of some of them cannot be applied through it.
    r = ckcheck("plan", "--model", f"{fixture('vision.py')}:timm_vit", "--memory-budget", "1GiB")
    assert r.code == 2, r.out + r.err
    assert "--checkpoint torch" in r.err and len(r.err.strip().splitlines()) == 1, r.err
