"""ckcheck inside the Hugging Face Trainer (and the trainers that derive from it, TRL's among them):

    from ckcheck.trainer import CkcheckCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[CkcheckCallback()])

When training starts -- after the Trainer switched the model's activation checkpointing on with
its `activation_checkpointing_kwargs`, before the first optimizer step -- the callback checks one
training step of the Trainer's own model on the first batch of its own data loader, checkpointed
through the model's switch with those kwargs against the same step without checkpointing, as
`ckcheck.check_step` does -- under the Trainer's autocast where it trains with bf16=True or
fp16=True. A step that checkpointing changes stops training (CheckpointMismatch,
with ckcheck's report) or, with on_failure="warn", is a RuntimeWarning. The model, the optimizer,
the data loader's order and every random stream are left as they were. Tested with transformers
5.24 (see the README)."""

from __future__ import annotations

from transformers import TrainerCallback

import ckcheck
from ckcheck import _loops


def _model_loss(out):
    """The loss the Trainer trains on when the model computes it (labels in the batch)."""
    return out["loss"] if isinstance(out, dict) else out[0]


class CkcheckCallback(_loops.LoopCheck, TrainerCallback):
    """Checks the Trainer's checkpointed step once, at the start of training.

    on_failure: "stop" (raise CheckpointMismatch: no optimizer step is taken) or "warn".
    options: ckcheck.run's options (tolerance="auto", sites=..., seed=...).
    After training starts, .report is ckcheck's report (None where nothing is checkpointed)."""

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if not getattr(args, "activation_checkpointing", False) or model is None or train_dataloader is None:
            return  # nothing is checkpointed: nothing to check
        enable, disable = _switch_as_trainer_sets_it(model, args)
        device = next(model.parameters()).device
        batch = _loops.first_batch(train_dataloader, device)
        labelled = isinstance(batch, dict) and "labels" in batch
        amp = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else None
        self.report = ckcheck.check_step(model, batch, loss=_model_loss if labelled else None, checkpoint="model",
                                         enable=enable, disable=disable, on_failure=self.check_step_failure,
                                         **_loops.with_autocast(self.options, amp))


def _switch_as_trainer_sets_it(model, args):
    """(enable, disable): the model's activation checkpointing switch turned on as the Trainer turns
    it on (its kwargs; every_n_layers and offload taken out of them, as the Trainer does)."""
    if not hasattr(model, "activation_checkpointing_enable"):
        raise ckcheck.UsageError(f"{type(model).__name__} has no activation_checkpointing_enable(): CkcheckCallback "
                                 "checks the switch of transformers 5's models; call ckcheck.check_step with the "
                                 "model's enable/disable instead")
    kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None) or {})
    every_n_layers = kwargs.pop("every_n_layers", 1)
    offload = kwargs.pop("offload", False)

    def enable():
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None,
                                              every_n_layers=every_n_layers, offload=offload)

    return enable, model.activation_checkpointing_disable
