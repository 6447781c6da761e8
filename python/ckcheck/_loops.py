"""What a check inside the user's own training loop needs: the process's random state and the
model's gradients kept as the loop left them, and the loop's first batch taken without moving its
data loader on."""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Mapping

import torch

from ckcheck._base import UsageError


@contextlib.contextmanager
def kept_random_state():
    """Puts back, on the way out, every random stream a training loop draws from: torch's CPU and
    CUDA generators, Python's and NumPy's global ones."""
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(python)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)


@contextlib.contextmanager
def kept_gradients(model):
    """Puts back each parameter's .grad (None included) as it was: a loop may check in the middle of
    an accumulation."""
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
    try:
        yield
    finally:
        for p, g in grads:
            p.grad = g


def first_batch(loader, device):
    """The first batch of `loader`, on `device`, from a fresh iterator of the plain DataLoader under
    it (Accelerate's wrapper keeps a position and a state of its own, which this leaves alone), the
    random streams its sampler draws from put back."""
    base = getattr(loader, "base_dataloader", loader)
    with kept_random_state():
        iterator = iter(base)
        try:
            batch = next(iterator)
        finally:
            del iterator
    return to_device(batch, device)


def to_device(batch, device):
    """`batch` with every tensor in it (nested in dicts, lists and tuples) on `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):  # a dict, or a tokenizer's BatchEncoding
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def with_autocast(options, amp):
    """ckcheck.run's options with the autocast the loop trains under ("bf16", "fp16"; None: none),
    so the check's steps run as the loop's do; an amp= the user gave wins."""
    return {"amp": amp, **options} if amp else dict(options)


class LoopCheck:
    """What the loop callbacks share: what a failure does (on_failure "stop": CheckpointMismatch,
    no optimizer step taken; "warn": a RuntimeWarning and training goes on), ckcheck.run's options,
    and the report once the check ran (.report)."""

    def __init__(self, on_failure: str = "stop", **options):
        if on_failure not in ("stop", "warn"):
            error = UsageError(f"on_failure takes 'stop' or 'warn', not {on_failure!r}")
            error.field = "on_failure"
            raise error
        self.on_failure = on_failure
        self.options = options
        self.report = None

    @property
    def check_step_failure(self) -> str:
        """check_step's on_failure for this callback's."""
        return "raise" if self.on_failure == "stop" else "warn"
