"""ckcheck inside a Lightning run: the callback checks the LightningModule's training_step with the
Hugging Face backbone's switch as the module set it. Truth from PyTorch alone (test_trainer's
truth_differs on the same tiny Qwen2-MoE and first batch). The callback stops a run whose
checkpointed step differs before its first optimizer step, lets a correct one train exactly as
without it, and logs nothing of its own steps."""

import functools

import pytest
import torch

L = pytest.importorskip("lightning.pytorch")
pytest.importorskip("transformers")

import ckcheck  # noqa: E402
from ckcheck.lightning import CkcheckCallback  # noqa: E402
from test_trainer import Tokens, first_batch, moe_model, truth_differs  # noqa: E402


class LitMoE(L.LightningModule):
    """The backbone's switch turned on inside the module, as Lightning users write it."""

    def __init__(self, dropout=0.0, **ckpt_kwargs):
        super().__init__()
        self.model = moe_model(dropout)
        self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=ckpt_kwargs)
        self.logged = []

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        self.logged.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(module, callbacks, max_steps=2, precision="32-true"):
    torch.manual_seed(7)
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        precision=precision)
    trainer.fit(module, torch.utils.data.DataLoader(Tokens(), batch_size=2, shuffle=True))
    return trainer


def test_a_lightning_run_the_reentrant_switch_breaks_is_stopped_before_its_first_step():
    assert truth_differs(moe_model, first_batch(), use_reentrant=True)
    module = LitMoE(use_reentrant=True)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ckcheck.CheckpointMismatch) as stopped:
        fit(module, [CkcheckCallback()])
    report = stopped.value.report
    assert ckcheck.Cause.REENTRANT_NO_GRAD in {f.cause for f in report.findings}, report.console
    assert "found switched on" in report.model["checkpoint_reason"]
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_a_correct_lightning_run_trains_exactly_as_without_the_callback():
    assert not truth_differs(moe_model, first_batch(), use_reentrant=False)
    runs = []
    for callbacks in ([], [CkcheckCallback()]):
        module = LitMoE(use_reentrant=False)
        trainer = fit(module, callbacks)
        runs.append((module.logged[-2:], {k: v.clone() for k, v in module.state_dict().items()},
                     trainer.callback_metrics["train_loss"].item(), torch.random.get_rng_state()))
    (losses, params, logged, rng), (losses2, params2, logged2, rng2) = runs
    assert callbacks[0].report.passed
    assert losses == losses2 and logged == logged2 and torch.equal(rng, rng2)
    assert all(torch.equal(params[k], params2[k]) for k in params)


def test_dropout_without_its_rng_state_is_stopped_with_rng_and_with_it_trains():
    dropout = functools.partial(moe_model, dropout=0.2)
    assert truth_differs(dropout, first_batch(), use_reentrant=False, preserve_rng_state=False)
    with pytest.raises(ckcheck.CheckpointMismatch) as stopped:
        fit(LitMoE(dropout=0.2, use_reentrant=False, preserve_rng_state=False), [CkcheckCallback()])
    assert ckcheck.Cause.RNG in {f.cause for f in stopped.value.report.findings}, stopped.value.report.console
    assert not truth_differs(dropout, first_batch(), use_reentrant=False)
    callback = CkcheckCallback()
    fit(LitMoE(dropout=0.2, use_reentrant=False), [callback], max_steps=1)
    assert callback.report.passed


def test_the_trainers_mixed_precision_is_the_checks():
    """precision="bf16-mixed": the check's steps run under the CPU autocast the run trains under."""
    callback = CkcheckCallback()
    fit(LitMoE(use_reentrant=False), [callback], max_steps=1, precision="bf16-mixed")
    assert callback.report.passed and callback.report.config["amp"] == "bf16", callback.report.console
