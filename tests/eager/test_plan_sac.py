"""`ckcheck plan` weighs selective plans (sac:OPS): it profiles the op classes the candidate sites
run, solves over them beside the module plans, and verifies what it proposes. The truth for the
profile is PyTorch's own dispatcher (a TorchDispatchMode sees the ops an op-level checkpoint policy
sees); the truth for a plan is its measurement and its checks."""

import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from conftest import factory_result, fixture

TWINS = fixture("twins.py")
MODELS = fixture("policies.py")
MIB = 1 << 20


def _plan(ckcheck, tmp_path, model, budget, *extra):
    path = tmp_path / "plan.json"
    r = ckcheck("plan", "--model", model, "--memory-budget", budget if isinstance(budget, str) else f"{budget}B", "--checkpoint", "torch",
                "--report", f"json={path}", *extra)
    return r, (json.loads(path.read_text()) if path.exists() else None)


def _pytorch_op_bytes(model, x, site_modules):
    """PyTorch alone: per op packet ("aten.mm"), the bytes of the non-view outputs of the ops the
    dispatcher runs below autograd (what an op-level policy sees) inside `site_modules`' forwards,
    in-place ops and ops that make a tensor from no activation (by their schema: no tensor argument,
    *_like, new_*) left out."""

    def creation(func):
        name = func.overloadpacket.__name__
        reads = any(isinstance(a.type, torch.TensorType) for a in func._schema.arguments)
        return not reads or name.endswith("_like") or name.startswith("new_") or name == "lift_fresh_copy"

    depth = [0]
    totals = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = f"{func.namespace}.{func.overloadpacket.__name__}"
            if depth[0] and not func.overloadpacket.__name__.endswith("_") and not creation(func):
                outs = out if isinstance(out, (tuple, list)) else (out,)
                # Below autograd no output is a view yet: the schema says which alias an input.
                b = 0 if func.is_view else sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))
                if b:
                    totals[name] = totals.get(name, 0) + b
            return out

    handles = []
    for m in site_modules:
        handles.append(m.register_forward_pre_hook(lambda *a: depth.__setitem__(0, depth[0] + 1)))
        handles.append(m.register_forward_hook(lambda *a: depth.__setitem__(0, depth[0] - 1)))
    with Count():
        model(x)
    for h in handles:
        h.remove()
    return totals


def test_the_op_class_profile_is_what_pytorchs_dispatcher_runs_inside_the_sites(ckcheck, tmp_path):
    r, report = _plan(ckcheck, tmp_path, f"{TWINS}:transformer", "1GiB")
    assert r.code == 0, r.out + r.err
    profile = report["plan"]["profile"]
    ours = {c["op"]: c["bytes"] for c in profile["op_classes"]}
    model, x = factory_result("twins.py", "transformer")
    truth = _pytorch_op_bytes(model, x, list(model.blocks))
    assert truth, "PyTorch ran no op inside the blocks"
    assert ours == truth
    # Per site: identical blocks run the same ops.
    mm = next(c for c in profile["op_classes"] if c["op"] == "aten.addmm")
    assert len(set(mm["site_bytes"])) == 1 and len(mm["site_bytes"]) == len(model.blocks)
    assert all(c["seconds"] >= 0 for c in profile["op_classes"])


def test_a_c_model_gets_no_selective_plan_and_is_told_why(ckcheck, tmp_path):
    path = tmp_path / "plan.json"
    r = ckcheck("plan", "--model", "transformer", "--layers", "2", "--memory-budget", "1GiB", "--report", f"json={path}")
    assert r.code == 0, r.out + r.err
    profile = json.loads(path.read_text())["plan"]["profile"]
    assert profile["op_classes"] == []
    assert "sac:OPS" in profile["op_classes_note"]


def _pytorch_changes_gradients(name, sites, saved_ops):
    """PyTorch alone: the factory's model plainly and with `sites` under torch.utils.checkpoint
    (non-reentrant), whose op policy saves the ops `saved_ops` names ("aten.rand") when there are
    any; True when a parameter gradient differs."""
    model, x = factory_result("policies.py", name)
    saved = {getattr(torch.ops.aten, op.split(".", 1)[1]) for op in saved_ops}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op.overloadpacket in saved else CheckpointPolicy.PREFER_RECOMPUTE

    def grads(checkpointed):
        model.zero_grad(set_to_none=True)
        for b in model.blocks:
            b.gen = torch.Generator().manual_seed(23) if b.gen is not None else None
        h = x
        for i, b in enumerate(model.blocks):
            if f"blocks.{i}" not in checkpointed:
                h = b(h)
            elif saved:
                h = checkpoint(b, h, use_reentrant=False, context_fn=lambda: create_selective_checkpoint_contexts(policy))
            else:
                h = checkpoint(b, h, use_reentrant=False)
        model.head(h).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    return any(not torch.equal(a, b) for a, b in zip(grads(()), grads(set(sites))))


def test_a_tight_budget_gets_a_selective_plan_verified_and_measured_beside_the_module_plan(ckcheck, tmp_path):
    r, report = _plan(ckcheck, tmp_path, f"{TWINS}:transformer", "1GiB")
    assert r.code == 0, r.out + r.err
    plan = report["plan"]
    # One byte under the plain step: something must be checkpointed, with room to save ops.
    budget = plan["baseline_bytes"] + plan["profile"]["peak_bytes"] - 1
    r, report = _plan(ckcheck, tmp_path, f"{TWINS}:transformer", budget)
    assert r.code == 0, r.out + r.err
    plan = report["plan"]
    selective = [a for a in plan["attempts"] if a["saved_ops"]]
    assert selective, plan["attempts"]
    for a in selective:
        assert a["policy"].startswith("sac:") and a["checks"] == "pass", a
        assert a["predicted_total_bytes"] <= budget
    # The module plan it was preferred to is measured beside it, and the faster of the two that
    # fit is recommended.
    assert any(not a["saved_ops"] and a["sites"] for a in plan["attempts"]), plan["attempts"]
    # A plan that passes its checks and measures within the budget is never lost: where the
    # selective plan measures over the budget, the module plan measured beside it is the plan.
    fitting = [a for a in plan["attempts"] if a["checks"] == "pass" and a.get("measured_total_bytes") is not None
               and a["measured_total_bytes"] <= budget]
    assert fitting and plan["recommendation"] in [a["policy"] for a in fitting], plan["attempts"]
    chosen = next(a for a in plan["attempts"] if a["policy"] == plan["recommendation"])
    assert chosen["checks"] == "pass" and chosen["measured_total_bytes"] <= budget
    # The policy a selective plan writes is one run accepts, and the twin passes under it.
    r = ckcheck("run", "--model", f"{TWINS}:transformer", "--checkpoint", "torch", "--policy", selective[-1]["policy"])
    assert r.code == 0, r.out + r.err
    assert r.check("gradients")["status"] == "pass"


def test_every_plan_verified_on_a_random_op_gets_pytorchs_verdict_and_a_failing_one_is_never_recommended(ckcheck, tmp_path):
    # noise_blocks_wide's blocks.0 draws from its own generator: a checkpoint there that recomputes
    # the draw changes the gradients; one whose op policy saves aten.rand does not.
    name = "noise_blocks_wide"
    r, report = _plan(ckcheck, tmp_path, f"{MODELS}:{name}", "1GiB")
    assert r.code == 0, r.out + r.err
    plan = report["plan"]
    rand = next(c["bytes"] for c in plan["profile"]["op_classes"] if c["op"] == "aten.rand")
    attempts = []
    for extra in (rand // 4, rand):
        budget = plan["baseline_bytes"] + plan["profile"]["every_site_peak_bytes"] + extra
        r, report = _plan(ckcheck, tmp_path, f"{MODELS}:{name}", budget)
        assert r.code in (0, 1), r.out + r.err
        for a in report["plan"]["attempts"]:
            if a["sites"]:
                assert (a["checks"] == "fail") == _pytorch_changes_gradients(name, a["sites"], a["saved_ops"]), a
                if a["checks"] != "pass":
                    assert a["policy"] != report["plan"]["recommendation"]
            attempts.append(a)
    assert any(a["checks"] == "fail" for a in attempts), attempts
    assert any(a["saved_ops"] and a["checks"] == "pass" for a in attempts), attempts
