"""ckcheck inside the training loops users run: the Hugging Face Trainer's callback and
ckcheck.check_step in an Accelerate loop. Truth from PyTorch alone: the same model's gradients on the
same first batch, with the switch on as the trainer sets it and off. The callback stops a run whose
checkpointed step differs before its first optimizer step, lets a correct one train, and leaves the
model, the optimizer, the data order and the random streams as it found them."""

import functools
import random
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

import ckcheck  # noqa: E402
from ckcheck.trainer import CkcheckCallback  # noqa: E402

VOCAB = 64


def moe_model(dropout=0.0):
    """A tiny Qwen2-MoE whose loss adds the router's load-balancing term (router logits on)."""
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, output_router_logits=True, use_cache=False,
        max_position_embeddings=64, attention_dropout=dropout)
    model = transformers.Qwen2MoeForCausalLM(config)
    model.train()
    return model


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def truth_differs(make, batch, **ckpt_kwargs):
    """PyTorch alone: does the step of the model `make()` builds with its switch on (these kwargs)
    give other gradients than the step with it off, from the same weights and random state?"""
    def grads(on):
        m = make()
        if on:
            m.activation_checkpointing_enable(activation_checkpointing_kwargs=ckpt_kwargs)
        else:
            m.activation_checkpointing_disable()
        torch.manual_seed(1)
        m(**batch).loss.backward()
        return [p.grad for p in m.parameters() if p.grad is not None], sum(p.grad is None for p in m.parameters())

    (plain, plain_none), (ckpt, ckpt_none) = grads(False), grads(True)
    return plain_none != ckpt_none or len(plain) != len(ckpt) or any(not torch.equal(a, b)
                                                                    for a, b in zip(plain, ckpt))


def trainer(model, tmp_path, callbacks, max_steps=2, bf16=False, **ckpt_kwargs):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=max_steps, use_cpu=True,
        report_to=[], activation_checkpointing=True, activation_checkpointing_kwargs=ckpt_kwargs,
        save_strategy="no", logging_steps=1, seed=3, disable_tqdm=True, bf16=bf16)
    return transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)


def first_batch():
    return {k: torch.stack([Tokens()[i][k] for i in range(2)]) for k in ("input_ids", "labels")}


def test_a_trainer_run_the_reentrant_switch_breaks_is_stopped_before_its_first_step(tmp_path):
    assert truth_differs(moe_model, first_batch(), use_reentrant=True), "PyTorch alone: the router loses its gradient"
    model = moe_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    callback = CkcheckCallback()
    t = trainer(model, tmp_path, [callback], use_reentrant=True)
    with pytest.raises(ckcheck.CheckpointMismatch) as stopped:
        t.train()
    report = stopped.value.report
    assert report.verdict is ckcheck.Verdict.FAIL
    assert ckcheck.Cause.REENTRANT_NO_GRAD in {f.cause for f in report.findings}, report.console
    assert t.state.global_step == 0 and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_correct_trainer_run_trains_exactly_as_without_the_callback(tmp_path):
    assert not truth_differs(moe_model, first_batch(), use_reentrant=False)
    runs = []
    for callbacks in ([], [CkcheckCallback()]):
        model = moe_model()
        t = trainer(model, tmp_path, callbacks, use_reentrant=False)
        seen = []
        t.add_callback(type("Seen", (transformers.TrainerCallback,), {
            "on_step_begin": lambda self, args, state, control, **kw: seen.append(torch.random.get_rng_state())}))
        random.seed(5)
        out = t.train()
        runs.append((out.training_loss, {k: v.clone() for k, v in model.state_dict().items()},
                     t.optimizer.state_dict()["state"], seen, torch.random.get_rng_state(), random.getstate()))
    (loss, params, opt, seen, rng, py), (loss2, params2, opt2, seen2, rng2, py2) = runs
    assert callbacks[0].report is not None and callbacks[0].report.passed
    assert loss == loss2 and all(torch.equal(params[k], params2[k]) for k in params)
    assert all(torch.equal(opt[i]["exp_avg"], opt2[i]["exp_avg"]) for i in opt)
    assert len(seen) == len(seen2) == 2 and all(torch.equal(a, b) for a, b in zip(seen, seen2))
    assert torch.equal(rng, rng2) and py == py2


def test_dropout_recomputed_without_its_rng_state_is_stopped_with_rng(tmp_path):
    dropout = functools.partial(moe_model, dropout=0.2)
    assert truth_differs(dropout, first_batch(), use_reentrant=False, preserve_rng_state=False)
    with pytest.raises(ckcheck.CheckpointMismatch) as stopped:
        trainer(dropout(), tmp_path, [CkcheckCallback()], use_reentrant=False, preserve_rng_state=False).train()
    assert ckcheck.Cause.RNG in {f.cause for f in stopped.value.report.findings}, stopped.value.report.console
    # the negative control: the same dropout with its RNG state replayed trains
    assert not truth_differs(dropout, first_batch(), use_reentrant=False)
    callback = CkcheckCallback()
    trainer(dropout(), tmp_path, [callback], max_steps=1, use_reentrant=False).train()
    assert callback.report.passed


def test_the_trainers_mixed_precision_is_the_checks(tmp_path):
    """bf16=True: the Trainer trains under CPU autocast, and so do the check's steps (said in the report)."""
    seen = []
    model = moe_model()
    model.model.register_forward_pre_hook(lambda m, a: seen.append(torch.is_autocast_enabled("cpu")))
    callback = CkcheckCallback()
    trainer(model, tmp_path, [callback], max_steps=1, bf16=True, use_reentrant=False).train()
    assert seen[-1], "the Trainer's own step (the last forward) runs under autocast"
    assert callback.report.passed and callback.report.config["amp"] == "bf16", callback.report.console
    callback = CkcheckCallback()
    trainer(moe_model(), tmp_path, [callback], max_steps=1, use_reentrant=False).train()
    assert callback.report.config["amp"] == "off"


def test_warn_mode_lets_training_go_on_with_the_report(tmp_path):
    callback = CkcheckCallback(on_failure="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(moe_model(), tmp_path, [callback], max_steps=1, use_reentrant=True).train()
    assert not callback.report.passed
    assert any("checkpointing changes this training step" in str(w.message) for w in caught)
    with pytest.raises(ckcheck.UsageError):
        CkcheckCallback(on_failure="ignore")


def test_check_step_in_an_accelerate_loop():
    acc = accelerate.Accelerator(cpu=True)
    for reentrant, passes in ((True, False), (False, True)):
        model = moe_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = torch.utils.data.DataLoader(Tokens(), batch_size=2)
        model, optimizer, loader = acc.prepare(model, optimizer, loader)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
        batch = next(iter(loader))
        assert truth_differs(moe_model, batch, use_reentrant=reentrant) is not passes
        rng = torch.random.get_rng_state()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        if passes:
            report = ckcheck.check_step(model, batch, loss=lambda out: out.loss)
            assert report.passed and report.config["checkpoint"] == "model"
        else:
            with pytest.raises(ckcheck.CheckpointMismatch):
                ckcheck.check_step(model, batch, loss=lambda out: out.loss)
        assert torch.equal(rng, torch.random.get_rng_state())
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert model.is_activation_checkpointing and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("example", ["trainer_callback.py", "accelerate_loop.py", "lightning_callback.py"])
def test_the_documented_examples_run_as_the_docs_say(example):
    import os
    import subprocess
    import sys

    if example.startswith("lightning"):
        pytest.importorskip("lightning.pytorch")
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "examples", example)
    for flag, status, says in (([], 0, "trained"), (["--reentrant"], 1, "reentrant-no-grad")):
        proc = subprocess.run([sys.executable, path, *flag], capture_output=True, text=True, timeout=600)
        assert proc.returncode == status and says in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_check_step_in_an_accelerate_loop_finds_dropout_without_its_rng_state():
    acc = accelerate.Accelerator(cpu=True)
    dropout = functools.partial(moe_model, dropout=0.2)
    for kwargs, passes in (({"use_reentrant": False, "preserve_rng_state": False}, False),
                           ({"use_reentrant": False}, True)):
        model, loader = acc.prepare(dropout(), torch.utils.data.DataLoader(Tokens(), batch_size=2))
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        batch = next(iter(loader))
        assert truth_differs(dropout, batch, **kwargs) is not passes
        report = ckcheck.check_step(model, batch, loss=lambda out: out.loss, on_failure="warn")
        assert report.passed is passes, report.console
        if not passes:
            assert ckcheck.Cause.RNG in {f.cause for f in report.findings}, report.console
