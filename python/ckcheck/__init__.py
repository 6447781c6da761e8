"""ckcheck for eager PyTorch models: is gradient checkpointing correct for this model?

    import ckcheck
    report = ckcheck.run(model, (x,), checkpoint="torch")      # a ckcheck.Report
    print(report.verdict, report.findings)
    ckcheck.assert_checkpoint_equivalent(model, (x,))           # in a pytest test

The runner, the checks, the comparisons and the reports are ckcheck's C++ ones (ckcheck._core),
called with typed options: no command line, no file, no redirected output. The model is restored
to its state after the run.
"""

from __future__ import annotations

import inspect
import warnings

import torch  # noqa: F401  (LibTorch first: ckcheck._core links against it)

from ckcheck._built import TORCH_VERSION as _BUILT_AGAINST

if torch.__version__.split("+")[0] != _BUILT_AGAINST:
    raise ImportError(f"ckcheck was built against torch {_BUILT_AGAINST}, and this Python has torch "
                      f"{torch.__version__}: install torch=={_BUILT_AGAINST}, or rebuild ckcheck against this torch "
                      f"(pip install --no-build-isolation .)")

from ckcheck import _core  # noqa: E402  (after the check: a core built for another torch fails to load)
from ckcheck import _loops
from ckcheck._model import UsageError
from ckcheck._report import Cause, Check, Finding, Report, Status, Verdict

__all__ = ["run", "check_step", "selftest", "check_factory", "assert_checkpoint_equivalent", "validate_op", "main",
           "Report", "Check", "Finding", "Verdict", "Status", "Cause", "UsageError", "CheckpointMismatch"]


class CheckpointMismatch(AssertionError):
    """Checkpointing changes what the model computes; the message is ckcheck's console report."""

    def __init__(self, message: str, report: Report):
        super().__init__(message)
        self.report = report


def main(argv) -> int:
    """Runs `ckcheck ARGV...` in this process; returns the exit status."""
    return _core.cli_main([str(a) for a in argv])


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


def validate_op(op, *, shapes=None, dtype="float32", seed=0, cases=10, library=None, **options) -> Report:
    """Judges whether a custom op registered in this process (torch.library, or a TORCH_LIBRARY
    library already loaded or named by library=) is safe to recompute under a checkpoint, as
    `ckcheck validate-op` does; report.verdict is "pass" when it is.

    op: torch.ops.mylib.fused, torch.ops.mylib.fused.default, a torch.library.custom_op, or
        "mylib::fused". shapes: one shape per tensor argument, as "4x16,4x16" or [(4, 16), (4, 16)].
    options: more of validate-op's options by name (import_="mypkg.ops" is `--import`).
    """
    given = {"op": _op_name(op), "dtype": dtype, "seed": seed, "cases": cases, **options}
    if shapes:
        given["shapes"] = shapes if isinstance(shapes, str) else ",".join("x".join(str(int(d)) for d in s) for s in shapes)
    if library is not None:
        given["library"] = str(library)
    if "import_" in given:
        given["import"] = given.pop("import_")
    data, console = _core.validate_op(given)
    return Report(data, console)


def run(model, inputs=None, *, sites=None, policy="every:1", checkpoint="auto", seed=0,
        steps=1, checks=None, tolerance="bitwise", loss=None, enable=None, disable=None,
        preserve_rng_state=True, **options) -> Report:
    """Checks `model` (an nn.Module) on `inputs` and returns ckcheck's Report.

    inputs: a tensor, a tuple/list of positional arguments or a dict of keyword arguments.
    sites: globs over named_modules() paths (default: the model's blocks).
    policy: none, every:K, segments[:N] or sites:GLOB.
    checkpoint: "auto" (the model's own switch when it has one, else "torch"), "ckcheck",
        "torch" (torch.utils.checkpoint, use_reentrant=False), "torch-reentrant", "torch-sac"
        (non-reentrant with the op policy sac_save="aten.mm,aten.bmm") or "model" (the model's own
        gradient_checkpointing_enable() or set_grad_checkpointing()).
    loss: loss(output) -> tensor(s) to differentiate (default: every floating-point output).
    enable/disable: the model's own checkpointing switch, for checkpoint="model".
    options: any other `ckcheck run` option by its name with '_' for '-', with a value of its
        type: input_requires_grad=True (inputs keep their requires_grad unless it is given),
        accumulate=2, diagnose=True, bench=True, restore_buffers=True, lr=0.1, compile=True with
        memory_budget=0.0 and compile_mode="default" (compiled training), offload="cpu" (the
        checkpointed step's saved activations offloaded), a check's knob
        (amp_error_factor=4), ...
    report.verdict is "pass", "fail" or "error"; report.checks and report.findings say what and
    where, each finding with its cause and hint; str(report) is the console report.
    Raises UsageError (one line; .field names the argument) for what cannot be checked.
    """
    if not isinstance(preserve_rng_state, bool):
        error = UsageError(f"preserve_rng_state takes True or False, not {type(preserve_rng_state).__name__} "
                           f"{preserve_rng_state!r}")
        error.field = "preserve_rng_state"
        raise error
    given = dict(sites=sites, policy=policy, checkpoint=checkpoint, seed=seed, steps=steps, checks=checks,
                 tolerance=tolerance, no_preserve_rng=not preserve_rng_state)
    given.update(options)  # the command line's own spelling (no_preserve_rng=True) wins
    cls = type(model)
    name = f"{cls.__module__}.{cls.__qualname__}"
    data, console = _core.run(_factory(model, inputs, loss, enable, disable), name,
                              {k: v for k, v in given.items() if v is not None})
    report = data
    # The command line names a factory that lives only during this call: reproduce with the call
    # (with the checkpoint "auto" chose; the compiler's budget alone is chosen by memory_budget).
    chosen = _core.CheckpointKind.parse(report.get("config", {}).get("checkpoint", checkpoint))
    call = _python_call(model, inputs, dict(sites=sites, policy=policy,
                                            checkpoint=checkpoint if chosen == _core.CheckpointKind.compiler
                                            else chosen.text,
                                            seed=seed, steps=steps, checks=checks, tolerance=tolerance, loss=loss,
                                            enable=enable, disable=disable, preserve_rng_state=preserve_rng_state),
                        options)
    command = report.get("reproduce", "")
    report["reproduce"] = call
    if command:
        console = console.replace(f"reproduce: {command}", f"reproduce: {call}")
    return Report(report, console)


def selftest(model, inputs=None, *, plants=None, every_site=False, sites=None, policy="every:1", checkpoint="auto",
             seed=0, loss=None, enable=None, disable=None, **options) -> Report:
    """Plants each class of bug ckcheck claims to catch into `model` under this configuration, one at
    a time, and checks each as ckcheck.run does, as `ckcheck selftest` does: report.selftest holds
    the detection matrix (each cell caught with the right cause, with another, missed, or dormant
    where the configuration is immune), and report.verdict is "pass" when the unplanted model
    passes and every live plant is caught.

    plants: classes to plant (default: every one the configuration supports), e.g.
        ["rng-not-replayed", "lost-gradient"]. every_site: plant each class at every checkpointed
        unit (default: class k at unit k). The other arguments are ckcheck.run's.
    Raises UsageError (one line; .field names the argument) for what cannot be checked.
    """
    given = dict(sites=sites, policy=policy, checkpoint=checkpoint, seed=seed, plants=plants, every_site=every_site)
    given.update(options)
    cls = type(model)
    data, console = _core.selftest(_factory(model, inputs, loss, enable, disable), f"{cls.__module__}.{cls.__qualname__}",
                                   {k: v for k, v in given.items() if v is not None})
    report = data
    call = f"ckcheck.selftest(model{'' if inputs is None else ', inputs'}" + "".join(
        f", {k}={v!r}" for k, v in given.items() if v not in (None, False) and k not in ("policy", "seed")) + \
        f")  # model: {cls.__module__}.{cls.__qualname__}"
    command = report.get("reproduce", "")
    report["reproduce"] = call
    if command:
        console = console.replace(f"reproduce: {command}", f"reproduce: {call}")
    return Report(report, console)


def check_factory(factory, *, checkpoint="auto", **options) -> Report:
    """Checks the model a factory makes, as `ckcheck run --model FACTORY` does, and returns the
    Report. factory: a callable returning an nn.Module, (module, inputs[, loss]) or a dict with
    model and any of inputs, args, kwargs, loss, enable, disable; or its name,
    "package.module:callable" or "FILE.py[:callable]" (then the report's reproduce line is the
    ckcheck command). options: ckcheck.run's keywords (sites, policy, seed, ...)."""
    if not (callable(factory) or isinstance(factory, str)):
        raise UsageError(f"check_factory: {factory!r} is neither a callable nor 'package.module:callable'")
    module = getattr(factory, "__module__", None) or ""
    qualname = getattr(factory, "__qualname__", type(factory).__name__)
    # An importable factory is named as --model names it, and the reproduce line is the command.
    importable = module not in ("", "__main__") and "<" not in qualname and "." not in qualname
    name = factory if isinstance(factory, str) else f"{module}:{qualname}" if importable else f"{module}.{qualname}"
    data, console = _core.run(factory, name, {"checkpoint": checkpoint,
                                              **{k: v for k, v in options.items() if v is not None}})
    report = data
    if not (isinstance(factory, str) or importable):
        call = f"ckcheck.check_factory(factory, checkpoint={report['config']['checkpoint']!r}" + \
            "".join(f", {k}={v!r}" for k, v in options.items()) + f")  # factory: {name}"
        console = console.replace(f"reproduce: {report['reproduce']}", f"reproduce: {call}")
        report["reproduce"] = call
    return Report(report, console)


def _python_call(model, inputs, given, options) -> str:
    """The ckcheck.run call that reproduces a report, with the model's class named."""
    parts = ["model"] + ([] if inputs is None else ["inputs"])
    defaults = {name: p.default for name, p in inspect.signature(run).parameters.items()}
    for key, value in [*given.items(), *options.items()]:
        if key in defaults and value == defaults[key] and key not in ("checkpoint", "policy", "seed"):
            continue
        if callable(value):
            value = getattr(value, "__qualname__", type(value).__name__)
            parts.append(f"{key}={value}")
        else:
            parts.append(f"{key}={value!r}")
    cls = type(model)
    return f"ckcheck.run({', '.join(parts)})  # model: {cls.__module__}.{cls.__qualname__}"


def assert_checkpoint_equivalent(model, inputs=None, **kwargs) -> Report:
    """Fails (CheckpointMismatch, an AssertionError) unless checkpointing `model` changes nothing:
    gradients, outputs, state and every hazard check, as `ckcheck.run` with the same arguments.
    Warnings do not fail. Returns the report."""
    report = run(model, inputs, **kwargs)
    if not report.passed:
        raise CheckpointMismatch(report.console, report)
    return report


def check_step(model, batch, *, loss=None, checkpoint="auto", on_failure="raise", **options) -> Report:
    """Checks the training step your own loop (hand-written, Accelerate's) is about to take: `model`
    as it is now, with its own checkpointing switch as you set it (checkpoint="auto" takes it, when
    it has one), on `batch` (a tensor, a tuple of positional or a dict of keyword arguments), with
    `loss(output)` (for a Hugging Face model with labels in the batch: lambda out: out.loss). Call
    it once, before the first optimizer step. The model's parameters, buffers and gradients, its
    switch, and the random streams of torch, Python and NumPy are left as they were.
    on_failure: "raise" (CheckpointMismatch, with the report) or "warn" (a RuntimeWarning with the
    console report). Other options: those of ckcheck.run. Returns the report."""
    if on_failure not in ("raise", "warn"):
        error = UsageError(f"on_failure takes 'raise' or 'warn', not {on_failure!r}")
        error.field = "on_failure"
        raise error
    with _loops.kept_random_state(), _loops.kept_gradients(model):
        report = run(model, batch, loss=loss, checkpoint=checkpoint, **options)
    if not report.passed:
        if on_failure == "raise":
            raise CheckpointMismatch(report.console, report)
        warnings.warn("ckcheck: checkpointing changes this training step\n" + report.console, RuntimeWarning,
                      stacklevel=2)
    return report
