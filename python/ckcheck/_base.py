"""What every part of the Python side shares, importing no other part of it: the errors a user must
fix, how a failure is put in one line, and one seeded training step with its comparison."""

from __future__ import annotations

import os

import torch


class UsageError(Exception):
    """What the user must fix, in one line; the ckcheck command prints it and exits with status 2.
    field: the argument it is about (a keyword of ckcheck.run, as "sites"), or None."""

    field = None


class SetupError(UsageError):
    """A problem in what the factory handed ckcheck that shows only once a step runs (its loss
    raises): bad input, not a model that fails to train. The runner stops with it (exit 2)."""


def _apply_loss(loss, out):
    """loss(out), a SetupError naming the loss where it raises."""
    try:
        return loss(out)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        raise SetupError(_failure("the factory's loss raised", e, sep=" ") +
                         " (loss(output) takes what the model returns and gives the tensor(s) to differentiate)") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _failure(what: str, e: BaseException, sep: str = ": ") -> str:
    """'WHAT: Type: first line' -- and with --verbose (CKCHECK_VERBOSE) the traceback after it."""
    text = f"{what}{sep}{type(e).__name__}: {_first_line(e)}"
    if os.environ.get("CKCHECK_VERBOSE"):
        import traceback

        text += "\n" + "".join(traceback.format_exception(e)).rstrip()
    return text


def one_step(adapter, forward, inputs):
    """One training step from the model's current state: forward(args, kwargs), the loss, and a
    seeded upstream gradient for each output that carries a graph. Returns the float outputs and
    whether the step drew from the default generator."""
    torch.manual_seed(0)
    args, kwargs = adapter.arguments(inputs())
    rng = torch.get_rng_state()
    with torch.enable_grad():
        out = forward(args, kwargs)
        if adapter.loss is not None:
            out = adapter.loss(out)
    drew = not torch.equal(rng, torch.get_rng_state())
    outputs = adapter.float_outputs(out)
    graded = [t for t in outputs if t.requires_grad]
    if graded:
        torch.autograd.backward(graded, [_projection(t, i) for i, t in enumerate(graded)])
    return outputs, drew


def relative_difference(a, b):
    """The largest |a - b| relative to a's largest magnitude (absolute where a is all zeros)."""
    scale = a.abs().max().item() if a.numel() else 0.0
    diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    return diff / scale if scale > 0 else diff


def _projection(t, index):
    """A seeded random upstream gradient for an output (the same in every step that uses it)."""
    g = torch.Generator().manual_seed(1000 + index)
    return torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.device, t.dtype)
