"""ckcheck for eager PyTorch models: is gradient checkpointing correct for this model?

    import ckcheck
    report = ckcheck.run(model, (x,), checkpoint="torch")      # the JSON report, as a dict
    ckcheck.assert_checkpoint_equivalent(model, (x,))           # in a pytest test

The runner, the checks, the comparisons and the reports are ckcheck's C++ ones (ckcheck._core);
this package only hands them the model. The model is restored to its state after the run.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile

import torch  # noqa: F401  (LibTorch first: ckcheck._core links against it)

from ckcheck import _core, _registry
from ckcheck._model import UsageError

__all__ = ["run", "assert_checkpoint_equivalent", "validate_op", "main", "UsageError", "CheckpointMismatch"]


class CheckpointMismatch(AssertionError):
    """Checkpointing changes what the model computes; the message is ckcheck's console report."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def main(argv) -> int:
    """Runs `ckcheck ARGV...` in this process; returns the exit status."""
    return _core.cli_main([str(a) for a in argv])


def _captured(fn):
    """Runs fn() with file descriptors 1 and 2 going to a temporary file (the report goes to the
    caller as a dict, not to the terminal); returns (result, what was written)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            result = fn()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        tmp.seek(0)
        return result, tmp.read().decode(errors="replace")


def _factory(model, inputs, loss, enable, disable):
    def make():
        d = {"model": model}
        if inputs is not None:
            d["inputs"] = inputs
        for key, value in (("loss", loss), ("enable", enable), ("disable", disable)):
            if value is not None:
                d[key] = value
        return d
    return make


def _report_of(argv):
    """Runs `ckcheck ARGV` in this process and returns its JSON report, with the console text
    under "console"; raises UsageError with ckcheck's one-line error."""
    with tempfile.TemporaryDirectory(prefix="ckcheck-") as folder:
        json_path = os.path.join(folder, "report.json")
        text_path = os.path.join(folder, "report.txt")
        full = list(argv) + ["--report", f"json={json_path}", "--report", f"console={text_path}"]
        status, errors = _captured(lambda: main(full))
        if status == 2 or not os.path.exists(json_path):
            lines = [l for l in errors.splitlines() if l.startswith("ckcheck: error: ")]
            message = lines[-1] if lines else f"ckcheck exited with status {status}: {errors.strip()[-300:]}"
            raise UsageError(message.removeprefix("ckcheck: error: "))
        with open(json_path) as f:
            report = json.load(f)
        with open(text_path) as f:
            report["console"] = f.read()
    return report


def _op_name(op):
    """namespace::name[.overload] of an op given as a string, torch.ops.ns.name (a packet or an
    overload) or what torch.library.custom_op returned."""
    if isinstance(op, str):
        return op
    for attr in ("_qualname", "_qualified_op_name"):
        name = getattr(op, attr, None)
        if isinstance(name, str):
            return name
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    raise UsageError(f"validate_op: {op!r} is not a registered op; give torch.ops.NAMESPACE.NAME, what "
                     "torch.library.custom_op returned, or 'namespace::name'")


def validate_op(op, *, shapes=None, dtype="float32", seed=0, cases=10):
    """Judges whether a custom op registered in this process (torch.library, or a TORCH_LIBRARY
    library already loaded) is safe to recompute under a checkpoint, as `ckcheck validate-op` does,
    and returns the report as a dict ("verdict": "pass" when safe; "checks"; "console").

    op: torch.ops.mylib.fused, torch.ops.mylib.fused.default, a torch.library.custom_op, or
        "mylib::fused". shapes: one shape per tensor argument, as "4x16,4x16" or [(4, 16), (4, 16)].
    """
    argv = ["validate-op", "--op", _op_name(op), "--dtype", dtype, "--seed", str(seed), "--cases", str(cases)]
    if shapes:
        text = shapes if isinstance(shapes, str) else ",".join("x".join(str(int(d)) for d in s) for s in shapes)
        argv += ["--shapes", text]
    return _report_of(argv)


def run(model, inputs=None, *, sites=None, policy="every:1", checkpoint="auto", seed=0,
        steps=1, checks=None, tolerance="bitwise", loss=None, enable=None, disable=None,
        preserve_rng_state=True, args=()):
    """Checks `model` (an nn.Module) on `inputs` and returns ckcheck's report as a dict.

    inputs: a tensor, a tuple/list of positional arguments or a dict of keyword arguments.
    sites: globs over named_modules() paths (default: the model's blocks).
    policy: none, every:K, segments[:N] or sites:GLOB.
    checkpoint: "auto" (the model's own switch when it has one, else "torch"), "ckcheck",
        "torch" (torch.utils.checkpoint, use_reentrant=False), "torch-reentrant" or "model"
        (the model's own gradient_checkpointing_enable() or set_grad_checkpointing()).
    inputs keep their requires_grad; pass args=["--input-requires-grad"] to compare input gradients.
    loss: loss(output) -> tensor(s) to differentiate (default: every floating-point output).
    enable/disable: the model's own checkpointing switch, for checkpoint="model".
    args: more `ckcheck run` arguments, as on the command line.
    The report has "verdict" ("pass", "fail" or "error"), "checks" (id, status, summary,
    findings with site, cause and hint), "tensors" and "console" (the console report's text).
    Raises UsageError (one line) for what cannot be checked.
    """
    spec = _registry.add(_factory(model, inputs, loss, enable, disable))
    argv = ["run", "--model", spec, "--policy", policy, "--seed", str(seed), "--steps", str(steps),
            "--checkpoint", checkpoint, "--tolerance", tolerance]
    if sites:
        argv += ["--sites", ",".join([sites] if isinstance(sites, str) else sites)]
    if checks:
        argv += ["--checks", ",".join([checks] if isinstance(checks, str) else checks)]
    if not preserve_rng_state:
        argv.append("--no-preserve-rng")
    argv += [str(a) for a in args]
    try:
        report = _report_of(argv)
    finally:
        _registry.remove(spec)
    # The command line names a factory that lived only during this call: reproduce with the call.
    given = dict(sites=sites, policy=policy, checkpoint=report.get("config", {}).get("checkpoint", checkpoint),
                 seed=seed, steps=steps, checks=checks, tolerance=tolerance, loss=loss, enable=enable,
                 disable=disable, preserve_rng_state=preserve_rng_state, args=tuple(args))
    call = _python_call(model, inputs, given)
    command = report.get("reproduce", "")
    report["reproduce"] = call
    if command:
        report["console"] = report["console"].replace(f"reproduce: {command}", f"reproduce: {call}")
    # ... and the model by its class, not by that factory's name.
    cls = type(model)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if report.get("model", {}).get("name") == spec:
        report["model"]["name"] = name
    report["console"] = report["console"].replace(f"model {spec},", f"model {name},")
    return report


def _python_call(model, inputs, given) -> str:
    """The ckcheck.run call that reproduces a report, with the model's class named."""
    parts = ["model"] + ([] if inputs is None else ["inputs"])
    defaults = {name: p.default for name, p in inspect.signature(run).parameters.items()}
    for key, value in given.items():
        if value == defaults[key] and key not in ("checkpoint", "policy", "seed"):
            continue
        if callable(value):
            value = getattr(value, "__qualname__", type(value).__name__)
            parts.append(f"{key}={value}")
        else:
            parts.append(f"{key}={value!r}")
    cls = type(model)
    return f"ckcheck.run({', '.join(parts)})  # model: {cls.__module__}.{cls.__qualname__}"


def assert_checkpoint_equivalent(model, inputs=None, **kwargs):
    """Fails (CheckpointMismatch, an AssertionError) unless checkpointing `model` changes nothing:
    gradients, outputs, state and every hazard check, as `ckcheck.run` with the same arguments.
    Warnings do not fail. Returns the report."""
    report = run(model, inputs, **kwargs)
    if report.get("verdict") != "pass":
        raise CheckpointMismatch(report["console"], report)
    return report
