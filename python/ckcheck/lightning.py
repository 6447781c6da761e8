"""ckcheck inside a Lightning run:

    from ckcheck.lightning import CkcheckCallback
    trainer = lightning.Trainer(..., callbacks=[CkcheckCallback()])

When training starts (before the first optimizer step), the callback checks one training step of
the LightningModule on the first batch of the Trainer's train data loader -- its training_step's
loss, with the model's own checkpointing switch as the module set it (a Hugging Face backbone's,
found switched on inside the module) against the same step with the switch off, as
`ckcheck.check_step` does -- under autocast where the Trainer's precision is "bf16-mixed" or "16-mixed". A step that checkpointing changes stops the run (CheckpointMismatch,
with ckcheck's report) or, with on_failure="warn", is a RuntimeWarning. Nothing is logged by the
check's steps; the module, the optimizer, the data order and every random stream are left as they
were. Sites are named from the check's wrapper of the module: `module.` and the module's own path.
Tested with lightning 2.6.6 (see docs/loops.md)."""

from __future__ import annotations

from collections.abc import Mapping

import lightning.pytorch as pl
import torch

import ckcheck
from ckcheck import _loops


class _TrainingStep(torch.nn.Module):
    """The LightningModule's training_step as a module: forward(batch) is the loss it returns."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, batch):
        out = self.module.training_step(batch, 0)
        return out["loss"] if isinstance(out, Mapping) else out


class CkcheckCallback(_loops.LoopCheck, pl.Callback):
    """Checks the LightningModule's checkpointed training step once, when training starts.

    on_failure: "stop" (raise CheckpointMismatch: no optimizer step is taken) or "warn".
    options: ckcheck.run's options (checkpoint=, enable=, disable=, tolerance=, ...).
    After training starts, .report is ckcheck's report."""

    def on_train_start(self, trainer, pl_module):
        if not pl_module.automatic_optimization:
            raise ckcheck.UsageError("ckcheck's Lightning callback checks a training_step that returns its loss "
                                     "(automatic optimization); with manual optimization call ckcheck.check_step "
                                     "on the module's forward and loss instead")
        batch = _loops.first_batch(trainer.train_dataloader, pl_module.device)
        pl_module.log = pl_module.log_dict = _not_logged  # the check's steps log nothing
        try:
            amp = _AUTOCAST.get(str(trainer.precision))
            self.report = ckcheck.check_step(_TrainingStep(pl_module), (batch,),
                                             on_failure=self.check_step_failure,
                                             **_loops.with_autocast(self.options, amp))
        finally:
            del pl_module.log, pl_module.log_dict


# Lightning's mixed-precision settings, as ckcheck's --amp ("bf16-true" casts the weights: no autocast).
_AUTOCAST = {"bf16-mixed": "bf16", "16-mixed": "fp16"}


def _not_logged(*args, **kwargs):
    return None
