"""An eager PyTorch model as ckcheck's C++ runner sees it (ckcheck._core.PythonModel calls this).

The factory named by --model returns one of:
  - an nn.Module (inputs then come from --input-shape/--input-dtype/--input-range or --input);
  - a tuple (module, inputs) or (module, inputs, loss);
  - a dict with "model" and any of "inputs", "args", "kwargs", "loss", "enable", "disable".
`inputs` is a tensor, a tuple or list of positional arguments, or a dict of keyword arguments;
"args"/"kwargs" give both kinds at once. `loss(output)` returns the tensor(s) to differentiate
(default: every floating-point tensor of the output, through a seeded random projection).
"enable"/"disable" switch the model's own checkpointing for --checkpoint model (default: its
gradient_checkpointing_enable()/gradient_checkpointing_disable()).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import itertools
import importlib
import importlib.util
import inspect
import os
import random
import sys

import torch
from torch.utils import _pytree as pytree

from ckcheck import _float64, _parallel
from ckcheck._globals import ModuleVariables, own_namespaces
from ckcheck._core import CheckpointKind as Kind, ParallelKind as Parallel
from ckcheck._state import (_SCALARS, _GeneratorState, _container_contents, _copy_value, _fingerprint,
                            _flatten_attr, _flatten_closure, _generator_state, _put_back_into, _held_digest, _host_generator,
                            _is_state_value, _kept_in, _plain_scalar, _put_back_contents, _scalar_tensor,
                            _state_digest)
from ckcheck._base import (SetupError, UsageError, _apply_loss, _failure, _first_line,  # noqa: F401
                           _projection, one_step, relative_difference)

_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()).keys()) | {"forward"}
_ABSENT = object()  # an attribute a module did not have
_GIVEN_SWITCH = "the factory's enable/disable"  # own_switch's word for a switch the caller handed over
# A module's hook tables a checkpointing switch may add to or take from (keyed by handle id).
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs")


# ---------------------------------------------------------------------------------------------
# The model's own checkpoint calls
#
# Under --checkpoint model the unit of checkpointing is what the model hands to
# torch.utils.checkpoint.checkpoint: a module, a module's forward (Hugging Face's layers pass
# partial(forward, self)), or a closure over several modules (its unit: the module whose forward
# made the call). ckcheck sees those calls through a pass-through around the checkpoint function,
# installed when ckcheck is imported (so that `from torch.utils.checkpoint import checkpoint` in the
# user's code and in libraries imported after it binds it) and on the checkpoint functions the
# model's switch stores. It calls the original with the same arguments; only while ckcheck runs a
# step with the model's switch on does it wrap the function, to watch the unit's forward and
# recompute. It changes nothing the model computes.

_ORIGINAL_CHECKPOINT = torch.utils.checkpoint.checkpoint
_ACTIVE = []  # the ModelAdapter whose step is running under the model's own switch


def _unit_module(fn):
    """The module a callable handed to the checkpoint stands for, or None (a closure)."""
    for _ in range(8):
        if isinstance(fn, torch.nn.Module):
            return fn
        if isinstance(fn, functools.partial):
            if fn.args and isinstance(fn.args[0], torch.nn.Module):
                return fn.args[0]
            fn = fn.func
            continue
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            return owner
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            return None
        fn = inner
    return None


@functools.wraps(_ORIGINAL_CHECKPOINT)
def _tapped_checkpoint(function, *args, **kwargs):
    adapter = _ACTIVE[-1] if _ACTIVE else None
    if adapter is None:
        return _ORIGINAL_CHECKPOINT(function, *args, **kwargs)
    return _ORIGINAL_CHECKPOINT(adapter.unit_function(function), *args, **kwargs)


_tapped_checkpoint._ckcheck_tap = True
torch.utils.checkpoint.checkpoint = _tapped_checkpoint


def _tap_stored_checkpoints(module):
    """Hugging Face stores partial(checkpoint, **kwargs) on each layer when its switch goes on; where
    that partial holds the checkpoint imported before ckcheck, it gets the pass-through too."""
    for m in module.modules():
        fn = vars(m).get("_gradient_checkpointing_func")
        if fn is _ORIGINAL_CHECKPOINT:
            m._gradient_checkpointing_func = _tapped_checkpoint
        elif isinstance(fn, functools.partial) and fn.func is _ORIGINAL_CHECKPOINT:
            m._gradient_checkpointing_func = functools.partial(_tapped_checkpoint, *fn.args, **fn.keywords)


# ---------------------------------------------------------------------------------------------
# Loading the factory


def _import_factory(spec: str):
    path, _, name = spec.rpartition(":") if ":" in spec else (spec, ":", "make_model")
    if not name:
        name = "make_model"
    if path.endswith(".py"):
        if not os.path.isfile(path):
            raise UsageError(f"no Python file '{path}'")
        mod_name = "ckcheck_user_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in sys.path:
            sys.path.insert(0, folder)  # the file's own imports of its neighbours
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:  # one line: what failed in the user's file
            raise UsageError(_failure(f"importing {path} failed", e)) from e
    else:
        try:
            module = importlib.import_module(path)
        except Exception as e:
            raise UsageError(_failure(f"importing {path} failed", e)) from e
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UsageError(f"{path} has no callable '{name}' (write FILE.py:CALLABLE)")
    return factory


def _parse_result(result):
    """(module, args, kwargs, loss, enable, disable) from what the factory returned."""
    parts = {}
    if isinstance(result, torch.nn.Module):
        parts["model"] = result
    elif isinstance(result, dict):
        unknown = set(result) - {"model", "inputs", "args", "kwargs", "loss", "enable", "disable", "context_fn",
                                 "offload", "ddp", "fsdp"}
        if unknown:
            raise UsageError(f"the factory's dict has unknown keys {sorted(unknown)}; "
                             "known: model, inputs, args, kwargs, loss, enable, disable, context_fn, offload, ddp, fsdp")
        parts = dict(result)
    elif isinstance(result, (tuple, list)) and 2 <= len(result) <= 3:
        parts["model"], parts["inputs"] = result[0], result[1]
        if len(result) == 3:
            parts["loss"] = result[2]
    else:
        raise UsageError("the factory must return an nn.Module, (module, inputs[, loss]) or a dict "
                         f"with 'model'; it returned {type(result).__name__}")
    module = parts.get("model")
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"the factory's model is a {type(module).__name__}, not a torch.nn.Module")
    args, kwargs = (), {}
    if "inputs" in parts:
        inputs = parts["inputs"]
        if isinstance(inputs, torch.Tensor):
            args = (inputs,)
        elif isinstance(inputs, (tuple, list)):
            args = tuple(inputs)
        elif isinstance(inputs, dict):
            kwargs = dict(inputs)
        else:
            raise UsageError("the factory's inputs must be a tensor, a tuple or list (positional) or a "
                             f"dict (keyword arguments), not {type(inputs).__name__}")
    args = tuple(parts.get("args", args))
    kwargs = dict(parts.get("kwargs", kwargs))
    for key in ("loss", "enable", "disable", "context_fn", "offload"):
        if parts.get(key) is not None and not callable(parts[key]):
            raise UsageError(f"the factory's '{key}' must be callable")
    extras = {"context_fn": parts.get("context_fn"), "offload": parts.get("offload"), "ddp": parts.get("ddp"),
              "fsdp": parts.get("fsdp")}
    return module, args, kwargs, parts.get("loss"), parts.get("enable"), parts.get("disable"), extras


def _option_inputs(opts: dict):
    """Positional inputs from --input (a file) or the tensor made from --input-shape/--input-dtype/--input-range."""
    if opts.get("file"):
        path = opts["file"]
        try:
            loaded = torch.load(path, weights_only=True)
        except Exception as e:
            raise UsageError(f"--input {path}: {type(e).__name__}: {_first_line(e)}") from e
        if isinstance(loaded, torch.Tensor):
            return (loaded,)
        if isinstance(loaded, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in loaded):
            return tuple(loaded)
        raise UsageError(f"--input {path} holds a {type(loaded).__name__}; save a tensor, list or tuple of tensors")
    if opts.get("tensor") is None:
        raise UsageError("the factory returns no inputs; give --input-shape (and --input-dtype, "
                         "--input-range) or --input FILE, or return (model, inputs) from the factory")
    # Made by ckcheck from --input-shape/--input-dtype/--input-range, by the rules of every model.
    return (opts["tensor"],)


def _seed_host_generators(seed):
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)  # NumPy's legacy seeds are 32-bit


def _made_by(spec, factory, seed: int):
    """What the factory returns, its errors one line each; weights drawn follow --seed."""
    torch.manual_seed(seed)  # the model's random weights follow --seed
    if not callable(spec):
        # ckcheck's own process (a factory named on the command line): weights or inputs a factory
        # draws from Python's or NumPy's global generator follow --seed too, so that the report's
        # reproduce line makes the same model. ckcheck.run leaves the caller's generators alone.
        _seed_host_generators(seed)
    try:
        return factory()
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(_failure("the factory raised", e, sep=" ")) from e


def _uncompiled(module, compile_opts):
    """torch.compile(model): the program trained is compiled. ckcheck compiles the module itself,
    once plainly and once checkpointed, so it takes the module the factory compiled."""
    if type(module).__name__ != "OptimizedModule" or not isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):
        return module
    if compile_opts is None:
        raise UsageError("the factory returns a compiled module (torch.compile); add --compile (compile=True in "
                         "ckcheck.run, with --compile-mode for its mode): ckcheck compiles the module itself, "
                         "plainly and checkpointed")
    return module._orig_mod


def _engine_options(module, parallel, policy_opts: dict, compile_opts, extras: dict):
    """(DDP's options, FSDP's options) the factory gave, checked. --offload and --parallel apply to
    eager training; FSDP shards a whole model itself."""
    if policy_opts.get("offload", "off") != "off" and compile_opts is not None:
        raise UsageError("--offload applies to eager training; drop --compile or --offload")
    if parallel != Parallel.off and compile_opts is not None:
        raise UsageError("--parallel applies to eager training; drop --compile or --parallel")
    options = _parallel.check_ddp_options(extras["ddp"]), _parallel.check_fsdp_options(extras["fsdp"])
    if parallel == Parallel.fsdp and any(type(p).__name__ == "DTensor" for p in module.parameters()):
        raise UsageError("the factory's model is sharded already (its parameters are DTensors); return it whole: "
                         "ckcheck shards a copy with fully_shard (the factory's 'fsdp' dict: reshard_after_forward, "
                         "modules)")
    return options


def _join_engine(adapter, module, parallel, policy_opts: dict, ddp_options, fsdp_options) -> None:
    """A rank of a data-parallel run joins its process group now; the process that starts the ranks
    (no RANK yet) only checks the model."""
    if parallel == Parallel.off or "RANK" not in os.environ:
        return
    try:
        timeout = int(policy_opts.get("parallel_timeout", 300))
        if parallel == Parallel.fsdp:
            engine = _parallel.FsdpEngine(adapter, fsdp_options, timeout, policy_opts.get("mixed_precision", "off"))
        else:
            engine = _parallel.Engine(module, ddp_options, timeout)
        adapter.attach_engine(engine)
        engine.prepare()
    except BaseException:
        adapter.close()
        raise


def load(spec, seed: int, input_opts: dict, checkpoint: str, mode: str, compile_opts=None,
         policy_opts=None) -> "ModelAdapter":
    """The adapter of the model a factory makes: `spec` names it (FILE.py[:CALLABLE],
    package.module:CALLABLE) or is the factory itself. `compile_opts` (--compile): {"mode",
    "memory_budget", "input_requires_grad"}, or None for eager training. `policy_opts`: {"sac_save"
    (--sac-save, comma-separated ops), "offload" (off or cpu)}."""
    policy_opts = dict(policy_opts or {})
    factory = spec if callable(spec) else _import_factory(spec)
    module, args, kwargs, loss, enable, disable, extras = _parse_result(_made_by(spec, factory, seed))
    module = _uncompiled(module, compile_opts)
    if not args and not kwargs:
        args = _option_inputs(input_opts)
    elif input_opts.get("tensor") is not None or input_opts.get("file"):
        raise UsageError("the factory returns its own inputs; drop --input-shape/--input")
    if mode == "train":
        module.train()
    elif mode == "eval":
        module.eval()
    switch = own_switch(module, enable, disable)
    checkpoint, reason = choose_checkpoint(checkpoint, switch, compile_opts, extras["context_fn"])
    context_fn = selective_context(checkpoint, policy_opts.get("sac_save", ""), extras["context_fn"])
    offload = policy_opts.get("offload", "off")
    offload_fn = (extras["offload"] or offload_to_cpu) if offload != "off" else None
    parallel = Parallel.parse(policy_opts.get("parallel", "off"))  # the engine, a ParallelKind
    ddp_options, fsdp_options = _engine_options(module, parallel, policy_opts, compile_opts, extras)
    name = spec if isinstance(spec, str) else getattr(spec, "__qualname__", "model")
    adapter = ModelAdapter(name, module, args, kwargs, loss, switch, checkpoint, reason, compile_opts, context_fn,
                           (offload_fn, "the factory's offload" if extras["offload"] else "ckcheck's copy to the CPU"),
                           factory=factory)
    adapter.first_seed = seed
    _join_engine(adapter, module, parallel, policy_opts, ddp_options, fsdp_options)
    return adapter


def own_switch(module, enable=None, disable=None):
    """(enable, disable, what it is) of the model's own checkpointing switch, or None: the
    factory's callables, Hugging Face's (activation_* in transformers 5, gradient_* before, where
    the model says it supports it) or timm's set_grad_checkpointing."""
    if enable is not None or disable is not None:
        if not (callable(enable) and callable(disable)):
            raise UsageError("the factory gives one of 'enable' and 'disable'; give both (the model's "
                             "checkpointing switch on and off)")
        return enable, disable, _GIVEN_SWITCH
    found = _switch_of(module)
    if found is not None:
        return found
    # A wrapper of the model (a LightningModule, the user's own module around a Hugging Face
    # backbone): the switch of the outermost submodule that came switched on is the one trained with.
    for path, sub in module.named_modules():
        if path and _switched_on(sub) and (inner := _switch_of(sub)) is not None:
            return inner[0], inner[1], f"{path}.{inner[2]}, found switched on"
    return None


def _switch_of(module):
    """(enable, disable, what) of the module's own switch (Hugging Face's or timm's), or None."""
    if getattr(module, "supports_gradient_checkpointing", True):
        for prefix in ("activation_checkpointing", "gradient_checkpointing"):
            on, off = getattr(module, prefix + "_enable", None), getattr(module, prefix + "_disable", None)
            if callable(on) and callable(off):
                return on, off, f"{prefix}_enable()"
    grad_ckpt = getattr(module, "set_grad_checkpointing", None)
    if callable(grad_ckpt):
        return (lambda: grad_ckpt(True)), (lambda: grad_ckpt(False)), "set_grad_checkpointing()"
    return None


def _switched_on(module) -> bool:
    """Whether a Hugging Face model's switch is on (its is_activation_checkpointing flag)."""
    return bool(getattr(module, "is_activation_checkpointing", False))


def choose_checkpoint(asked, switch, compile_opts=None, context_fn=None):
    """The checkpoint under test and why: what was asked for, or with `auto` the model's own
    switch when it has one (what its users train with), else PyTorch's non-reentrant checkpoint
    (what PyTorch recommends). Compiled with a memory budget below 1 and `auto`, the budget alone
    ("compiler": the compiler decides what its backward recomputes). `asked` is a name or a Kind; the
    checkpoint returned is a Kind."""
    asked = asked if isinstance(asked, Kind) else Kind.parse(asked)
    if compile_opts is not None:
        if asked == Kind.ckcheck:
            raise UsageError("--checkpoint ckcheck cannot run inside a compiled graph (it is a C++ autograd "
                             "function); with --compile use torch, torch-reentrant or model")
        if asked in (Kind.torch_sac, Kind.torch_wrapper):
            raise UsageError(f"--checkpoint {asked.text} is checked in eager training; with --compile use torch, "
                             "torch-reentrant, model or --memory-budget (the compiler's own selective recompute)")
        budget = compile_opts.get("memory_budget", 1.0)
        if asked == Kind.auto and budget < 1.0:
            return Kind.compiler, (f"the compiler's activation memory budget {budget:g} decides what the compiled "
                                "backward recomputes; no module checkpoints")
    if asked == Kind.model and switch is None:
        raise UsageError("--checkpoint model needs the model's own switch: the module has no "
                         "gradient_checkpointing_enable()/_disable() or set_grad_checkpointing(); return "
                         "'enable' and 'disable' callables from the factory, or use --checkpoint torch")
    if asked != Kind.auto:
        return asked, "asked for"
    if switch is not None:
        return Kind.model, f"the model's own switch, {switch[2]}: what its users train with"
    if context_fn is not None and compile_opts is None:
        return Kind.torch_sac, ("the factory's context_fn: torch.utils.checkpoint (use_reentrant=False) around its "
                             "blocks with that op-level policy, as its training runs them")
    return Kind.torch, ("the model has no checkpointing switch of its own: torch.utils.checkpoint "
                     "(use_reentrant=False, what PyTorch recommends) around its blocks")


class _Unit(torch.nn.Module):
    """A checkpointed unit's call as a module, for PyTorch's checkpoint_wrapper to wrap."""

    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self, *args, **kwargs):
        return self.call(*args, **kwargs)


def _wrapped(call, preserve_rng_state):
    """--checkpoint torch-wrapper: the unit's call inside PyTorch's checkpoint_wrapper (non-reentrant),
    the module apply_activation_checkpointing puts in place of each block (FSDP and torchtitan-style
    training)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    return checkpoint_wrapper(_Unit(call), checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                              preserve_rng_state=preserve_rng_state)


def _sac_op(text):
    """The aten op (OpOverloadPacket) or overload (OpOverload) a --sac-save entry names."""
    parts = text.split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"--sac-save: '{text}' is not an op; write NAMESPACE.OP[.OVERLOAD], as aten.mm or "
                         "aten.mm.default")
    try:
        op = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(op, parts[2]) if len(parts) == 3 else op
    except (AttributeError, RuntimeError):
        raise UsageError(f"--sac-save: there is no op {text} in this PyTorch; write NAMESPACE.OP[.OVERLOAD], as "
                         "aten.mm or aten.mm.default") from None


def selective_context(checkpoint, sac_save, factory_context_fn):
    """--checkpoint torch-sac: the context_fn torch.utils.checkpoint gets -- the ops --sac-save names
    are saved (MUST_SAVE), every other op recomputed (PREFER_RECOMPUTE); or the factory's own
    context_fn. None for every other checkpoint."""
    if checkpoint != Kind.torch_sac:
        return None
    ops = [o.strip() for o in sac_save.split(",") if o.strip()] if sac_save else []
    if ops and factory_context_fn is not None:
        raise UsageError("--sac-save and the factory's context_fn both give the op policy; give one")
    if factory_context_fn is not None:
        return factory_context_fn
    if not ops:
        raise UsageError("--checkpoint torch-sac needs the op policy: --sac-save OPS (as aten.mm,aten.bmm) or a "
                         "'context_fn' from the factory")
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    named = [_sac_op(o) for o in ops]
    packets = {o for o in named if isinstance(o, torch._ops.OpOverloadPacket)}
    overloads = {o for o in named if not isinstance(o, torch._ops.OpOverloadPacket)}

    def policy(ctx, op, *args, **kwargs):
        saved = op in overloads or getattr(op, "overloadpacket", None) in packets
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


def _saves(decision):
    """Whether an op-level policy's decision keeps the op's output (True, MUST_SAVE, PREFER_SAVE)."""
    from torch.utils.checkpoint import CheckpointPolicy

    return decision is True or decision in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


def offload_to_cpu():
    """ckcheck's activation offload: saved-tensor hooks that copy every tensor autograd saves to
    the CPU in the forward (pinned memory from a GPU) and back to its device in the backward, as
    torch.autograd.graph.save_on_cpu does -- but a copy on the CPU too, where save_on_cpu keeps the
    tensor itself, so that the copy is what the backward reads on every device."""

    def pack(t):
        pinned = t.is_cuda and not t.is_sparse
        copy = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pinned) if pinned else None
        if copy is None:
            return t.device, t.detach().to("cpu", copy=True)
        copy.copy_(t)
        return t.device, copy

    def unpack(packed):
        device, copy = packed
        return copy.to(device, non_blocking=copy.is_pinned())

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


# ---------------------------------------------------------------------------------------------
# Outputs


def _float_tensors(obj, out, seen):
    """Every floating-point tensor in an output: tensors, tuples, lists, dicts, dataclasses and
    model-output objects, in a stable order."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            out.append(obj)
        return
    if id(obj) in seen or isinstance(obj, _SCALARS):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for v in obj.values():
            _float_tensors(v, out, seen)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            _float_tensors(v, out, seen)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _float_tensors(getattr(obj, f.name), out, seen)


class _CallArguments:
    """A module call's arguments: their tensors, nested or not, in pytree's order (the site's
    inputs), and the arguments again with other tensors in their places. A list or dict whose
    tensors are all the ones it holds is handed over as the same object, as the model hands it: a
    list the call appends to or a dict it fills (a cache, auxiliary losses) stays the caller's, not
    a copy the caller never sees, and a recompute gets it as it is then, as in training. Only where
    a checkpoint hands the call other tensors (detached ones) is a container made anew."""

    def __init__(self, args, kwargs, forward=None):
        # Tuples (named ones too) are opened; lists, dicts and other objects are one leaf each. The
        # keywords' values in their order are pytree's order of the dict.
        self._forward, self.args, self.kwargs = forward, args, kwargs
        # The call as a checkpoint's recompute hands it, where its arguments hold other tensors
        # than at the forward (a list the forward popped from); None otherwise.
        self.recomputed = None
        self.site = ""  # the runner's site the call goes through (_through_site)
        self._outer, self._spec = pytree.tree_flatten((args, tuple(kwargs.values())), is_leaf=_unopened)
        self._inner = []  # per outer leaf: (its leaves, its spec) where pytree opens it, else None
        self.tensors = []
        for v in self._outer:
            inner = None
            if isinstance(v, torch.Tensor):
                self.tensors.append(v)
            else:
                leaves, spec = pytree.tree_flatten(v)
                if not spec.is_leaf():
                    inner = (leaves, spec)
                    self.tensors.extend(t for t in leaves if isinstance(t, torch.Tensor))
            self._inner.append(inner)
        self.opened = any(i is not None for i in self._inner)  # a list, dict or object holds tensors

    def with_tensors(self, tensors):
        """(args, kwargs) with `tensors` (in the order of self.tensors) in place of the call's."""
        given = iter(tensors)
        outer = []
        for v, inner in zip(self._outer, self._inner):
            if isinstance(v, torch.Tensor):
                outer.append(next(given))
            elif inner is None:
                outer.append(v)
            else:
                leaves, spec = inner
                new = [next(given) if isinstance(x, torch.Tensor) else x for x in leaves]
                outer.append(v if all(a is b for a, b in zip(new, leaves)) else pytree.tree_unflatten(new, spec))
        args, values = pytree.tree_unflatten(outer, self._spec)
        return args, dict(zip(self.kwargs, values))

    def handed_state(self):
        """Each argument that holds state the call may change -- the lists, dicts and objects (a
        Hugging Face Cache) in it, nested or not, that the call may append to, fill or rebind an
        attribute of: (its name, the argument, those lists, dicts and objects)."""
        out = []
        for name, value in itertools.chain(zip(self._positional_names(), self.args), self.kwargs.items()):
            kept = _kept_in(value)
            if kept:
                out.append((name, value, kept))
        return out

    def _positional_names(self):
        """The names of the positional arguments in the called forward's signature ("argument 2"
        past its named ones, or where it has no signature)."""
        try:
            params = inspect.signature(self._forward).parameters.values()
        except (TypeError, ValueError):
            params = ()
        named = [p.name for p in params
                 if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        return [named[i] if i < len(named) else f"argument {i}" for i in range(len(self.args))]


def _unopened(value):
    """pytree's is_leaf for _CallArguments: all but tuples. A function of its own: a lambda that
    closed over the call's arguments kept them alive past the call (peaks measured higher)."""
    return not isinstance(value, tuple)


def _structure(obj, depth=0):
    """What an output is made of, without its values: containers, their keys and the kind of each
    leaf ("CausalLMOutputWithPast{loss: tensor, logits: tensor, past_key_values: DynamicCache}")."""
    if isinstance(obj, torch.Tensor):
        return "tensor"
    if obj is None or isinstance(obj, _SCALARS) or depth > 4:
        return type(obj).__name__
    if isinstance(obj, dict):
        inner = ", ".join(f"{k}: {_structure(v, depth + 1)}" for k, v in obj.items())
    elif isinstance(obj, (tuple, list)):
        parts = [_structure(v, depth + 1) for v in obj]
        inner = f"{len(parts)} x {parts[0]}" if len(parts) > 4 and len(set(parts)) == 1 else ", ".join(parts)
    elif dataclasses.is_dataclass(obj):
        inner = ", ".join(f"{f.name}: {_structure(getattr(obj, f.name), depth + 1)}" for f in dataclasses.fields(obj))
    else:
        return type(obj).__name__
    return f"{type(obj).__name__}{{{inner}}}"


# ---------------------------------------------------------------------------------------------
# The model


def _blocks_among(with_params):
    """The paths of the blocks among a container's called children with parameters ((path, module)
    pairs): all of them when they are at least two and share a class, else those of the one class
    most share, when at least two and more than half do; none else. Containers as the common class
    (Swin's stages between its patch merges) hold the blocks: the scan goes on into them."""
    if len(with_params) < 2:
        return []
    if not _share_a_class([c for _, c in with_params]):
        common, count = collections.Counter(type(c) for _, c in with_params).most_common(1)[0]
        if count < 2 or 2 * count <= len(with_params) or issubclass(common, _LAYER_CONTAINERS):
            return []
        with_params = [(p, c) for p, c in with_params if type(c) is common]
    return [p for p, _ in with_params]


class ModelAdapter:
    """What ckcheck's Model interface needs, for an nn.Module and its inputs."""

    def __init__(self, name, module, args, kwargs, loss, switch, checkpoint, reason="asked for", compile_opts=None,
                 context_fn=None, offload=(None, ""), factory=None):
        self.name = name
        # The model's own modules' variables (a counter, a loss tracker): state, as its attributes are.
        self._globals = ModuleVariables(own_namespaces(module, factory))
        self._context_fn = context_fn  # --checkpoint torch-sac: the op-level policy's contexts
        self._offload, self._offload_hooks = offload  # --offload: a context manager factory, and whose
        self._offload_facts = None
        self._op_policy = {}
        self._inputs_seen = {}  # site -> input tensors its latest call's arguments held as its code ran
        self.module = module
        self.loss = loss
        self.checkpoint = checkpoint
        self.checkpoint_reason = reason
        self._call_site = None
        self._recording = None
        self._structures = []  # the _CallArguments of the site calls under way
        self._paths = {}
        self._names = {}  # id(module) -> path
        self._tied = None  # see _tied_tensors()
        self._active_paths = []  # the module forwards under way (innermost last)
        self._init_taps()
        self._switch_on = False  # the model's own switch is on for the step under way
        self.last_structure = ""  # what the last forward returned, without its values
        leaves, self._in_spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        self._in_leaves = leaves
        self._in_idx = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        if not self._in_idx:
            raise UsageError("the model's inputs hold no tensor")
        self._enable, self._disable = (switch[0], switch[1]) if switch else (None, None)
        if checkpoint == Kind.model and switch is None:
            choose_checkpoint(checkpoint, switch)  # raises: no switch to test
        self._wrap_modules()
        self._switch_attrs = set()
        self._switch_before = []
        if checkpoint == Kind.model:
            self._learn_switch(switch)
        start = self.snapshot()
        try:
            self.sites, self.default_sites = self._discover()
        finally:
            self.restore(start)
        if checkpoint != Kind.ckcheck:
            # torch.utils.checkpoint imports torch's compiler (torch._dynamo) on its first call: a
            # one-time cost the user's own training pays at its first checkpointed step, seconds on
            # a small CPU. Paid here, while loading, it is not counted as the check's cost.
            importlib.import_module("torch._dynamo")
        self._compiler = None
        self.compiled = compile_opts is not None  # trained through torch.compile (--compile)
        self._step_context_fn = None  # a sac:OPS policy's contexts, for the step under way
        self._policy_contexts = {}  # sac:OPS -> its context_fn, made once
        self._engine = None  # --parallel: the data-parallel engine the steps run through
        if compile_opts is not None:
            self._compile(compile_opts)
        if self._offload is not None:
            self._offload_facts = self._compare_offloaded()

    def _init_taps(self):
        """What --checkpoint model's tap of the model's own checkpoint calls keeps."""
        self._units_seen = []  # units met by the checkpoint tap, in order
        self._tap_units = False  # the units are the tapped calls
        # (serial of the tapped checkpoint call, whether the checkpoint runs its function again) while
        # a tapped unit runs; None otherwise.
        self.unit_call = None
        self._tapped_calls = itertools.count(1)
        self._taps = 0  # checkpoint calls the tap met, all steps together
        self._tap_depth = 0  # tapped functions running now
        self._nested_seen, self._outer_seen = set(), set()  # units met inside another's function, and not
        self._unit_paths = set()  # ... and their modules

    # -- data-parallel training (--parallel) ----------------------------------------------------
    def attach_engine(self, engine):
        self._engine = engine

    @property
    def parallel(self):
        """The engine's kind (ParallelKind.ddp, .fsdp), or ParallelKind.off without one."""
        return self._engine.kind if self._engine is not None else Parallel.off

    @property
    def process_group(self):
        return self._engine.group

    def use_engine(self, on):
        self._engine.use(on)

    def engine_step_done(self):
        self._engine.step_done()

    @property
    def mixed_precision(self):
        """FSDP2's parameter dtype under --mixed-precision ("bf16", "fp16"), or "off"."""
        return getattr(self._engine, "mixed_precision", "off")

    @property
    def engine_op_scopes(self):
        """Prefixes of the record_function scopes the engine runs its own ops in."""
        return list(getattr(self._engine, "op_scopes", ()))

    def engine_hook_fires(self):
        """The engine's count of each parameter's gradient hook in the last backward (named_parameters
        order), or None where the parameters' own hooks fire."""
        return self._engine.hook_fires()

    def twin_module(self):
        """A copy of the module to train in an engine that changes its modules in place (FSDP2's
        fully_shard); wrap_twin() then routes its forwards through the runner's sites."""
        self._unwrap_forwards()
        try:
            return copy.deepcopy(self.module)
        except Exception as e:
            raise UsageError(_failure("--parallel fsdp shards a copy of the model, and copy.deepcopy failed", e)) from e
        finally:
            self._wrap_modules()

    def wrap_twin(self, twin):
        """The twin's forwards through the runner's sites, as the module's go. After the engine
        changed the twin's classes (fully_shard makes each an FSDP subclass): a forward bound
        before would be the old class's, and a model that checkpoints in its class's forward
        (Hugging Face's layers, which checkpoint only from the outermost class) would not."""
        self._wrap_forwards(twin)

    def blocks(self):
        """The model's blocks (module paths), as the default sites find them."""
        return self._block_sites(self.sites)

    def copy_state(self, src, dst):
        """The state attributes of the module, read in `src` and set in `dst` (the module and its
        twin, either way round)."""
        for path, _, key, _ in self._attributes():
            value = getattr(src.get_submodule(path), key)
            target = dst.get_submodule(path)
            if isinstance(value, torch.Generator):
                getattr(target, key).set_state(value.get_state())
            else:
                setattr(target, key, _copy_value(value))

    def _sync_switch(self, twin):
        """The model's own switch as set on the module, on its twin."""
        for m, key, _ in self._switch_before:
            path = "" if m is self.module else self._names.get(id(m))
            if path is None:
                continue
            target = twin.get_submodule(path)
            if key in vars(m):
                setattr(target, key, vars(m)[key])
            else:
                vars(target).pop(key, None)

    def _compile(self, opts):
        """--compile: the steps run through torch.compile; the modules get their own forwards back
        (the compiled graph calls them as the user's training does) and the eager plain step is
        compared with the compiled one, once."""
        from ckcheck import _compile

        self._unwrap_forwards()
        self._compiler = _compile.Compiler(self, opts.get("mode", "default"), float(opts.get("memory_budget", 1.0)),
                                           self.checkpoint)
        requires_grad = bool(opts.get("input_requires_grad"))

        def inputs():
            return [t.requires_grad_(True) if requires_grad and t.is_floating_point() else t
                    for t in self.make_inputs(0)]

        try:
            self._compiler.compare_with_eager(inputs)
        except UsageError:
            raise
        except Exception as e:
            raise UsageError(_failure("the model fails compiled (torch.compile) without checkpointing", e)) from e
        # The checkpointed step of the default plan compiles here too, so that the run's steps measure
        # steps, not compiling (a step that fails is the run's to report).
        key = self._compiler.variant(True, self.default_sites)
        try:
            self._compiler.warm_up(key, inputs)
        except Exception:
            pass

    def offload_facts(self):
        """What the offload's hooks did to the plain step (--offload), or None."""
        return self._offload_facts

    def _compare_offloaded(self):
        """The plain step with the offload's hooks against the plain step without them, from the same
        state and seed: packing a saved tensor away and back must not change one value."""
        start = self.snapshot()
        results, packed = [], {"n": 0, "bytes": 0, "error": ""}

        def counted():
            # The offload's own hooks run inside; an outer pair only counts what autograd saves.
            def pack(t):
                packed["n"] += 1
                packed["bytes"] += t.numel() * t.element_size()
                return t

            return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

        def plain(args, kwargs):
            return self.module(*args, **kwargs)

        def offloaded(args, kwargs):
            with self._offload():
                return self.module(*args, **kwargs)

        try:
            for name, forward in (("plain", plain), ("offloaded", offloaded)):
                self.restore(start)
                try:
                    with counted() if name == "plain" else contextlib.nullcontext():
                        outputs, _ = one_step(self, forward, lambda: self.make_inputs(0))
                except UsageError:
                    raise
                except Exception as e:
                    if name == "plain":
                        raise UsageError(_failure("the model fails without checkpointing", e)) from e
                    packed["error"] = _first_line(e)
                    break
                # Named as the runner names them (the gradients check reads these names).
                tensors = [(f"output[{i}]", t.detach().clone()) for i, t in enumerate(outputs)]
                tensors += [(n, p.grad.detach().clone()) for n, p in self.named_parameters() if p.grad is not None]
                results.append(tensors)
        finally:
            self.restore(start)
        facts = {"hooks": self._offload_hooks, "packed": packed["n"], "packed_bytes": packed["bytes"], "differs": [],
                 "worst": "", "max_rel": 0.0, "error": packed["error"]}
        if len(results) < 2:
            return facts
        other = dict(results[1])
        for name, a in results[0]:
            b = other.get(name)
            if b is None or b.shape != a.shape:
                facts["differs"].append(name)
                continue
            if torch.equal(a, b):
                continue
            facts["differs"].append(name)
            rel = relative_difference(a, b)
            if rel >= facts["max_rel"]:
                facts["max_rel"], facts["worst"] = rel, name
        if any(n.startswith("output[") for n in facts["differs"]):
            facts["differs"].append("loss")  # the runner's loss is taken from the outputs
        if facts["differs"] and not facts["worst"]:
            facts["worst"] = facts["differs"][0]
        return facts

    def compiled_facts(self):
        """What the compiler did with the steps (--compile), or None."""
        return self._compiler.facts() if self._compiler is not None else None

    # -- sites ----------------------------------------------------------------------------------
    def _wrap_modules(self):
        for path, m in self._wrap_forwards(self.module):
            self._paths[path] = m

    def _wrap_forwards(self, root):
        """Every module under `root` calls its forward through the runner's site of its path; the
        (path, module) pairs wrapped."""
        wrapped = [(path, m) for path, m in root.named_modules() if path]
        for path, m in wrapped:
            self._names[id(m)] = path
            had_own = "forward" in vars(m)
            m.forward = self._wrapped(path, m.forward)
            m.forward._ckcheck_had_own = had_own
        return wrapped

    def close(self):
        """Gives every module its own forward back and its own switch's setting (ckcheck.run
        leaves the model as it found it)."""
        self._call_site = None
        if getattr(self, "_compiler", None) is not None:
            self._compiler.close()
        if getattr(self, "_engine", None) is not None:
            self._engine.close()
            self._engine = None
        self._put_switch_attributes_back()
        self._switch_before = []
        self._unwrap_forwards()
        self._paths = {}

    def _unwrap_forwards(self):
        for m in self._paths.values():
            wrapper = vars(m).get("forward")
            if wrapper is None or not hasattr(wrapper, "_ckcheck_had_own"):
                continue
            if wrapper._ckcheck_had_own:
                m.forward = wrapper.__wrapped__
            else:
                del m.forward

    def _wrapped(self, path, forward):
        @functools.wraps(forward)
        def call(*args, **kwargs):
            if self._recording is not None:
                self._recording(path)
            call_site = self._call_site
            # With the tapped units of --checkpoint model, the tap watches a unit while the model's
            # switch is on; with it off (the plain step, the probes) the unit's module call does.
            if call_site is None or (self._tap_units and (self._switch_on or path not in self._unit_paths)):
                self._active_paths.append(path)
                try:
                    return forward(*args, **kwargs)
                finally:
                    self._active_paths.pop()
            return self._through_site(path, forward, call_site, args, kwargs)

        return call

    def unit_function(self, function):
        """What the checkpoint tap hands to torch's checkpoint in place of `function`: the same
        function, which under --checkpoint model goes through the runner as the unit it stands for
        (so its forward and its recompute are watched); as it is otherwise."""
        if self.checkpoint != Kind.model:
            return function
        module = _unit_module(function)
        path = self._names.get(id(module)) if module is not None else None
        if path is None:  # a closure: the module whose forward called the checkpoint
            path = self._active_paths[-1] if self._active_paths else "(root)"
        if path not in self._units_seen:
            self._units_seen.append(path)
        # A checkpoint reached while a tapped function runs is nested in that unit (timm's stages
        # checkpointed from the root and their blocks from each stage): the outer unit covers it.
        (self._nested_seen if self._tap_depth else self._outer_seen).add(path)

        # The checkpoint runs `function` once in its forward and again in each recompute; a
        # checkpoint inside a recomputed unit is a new call, whose first run is its forward.
        serial, runs = next(self._tapped_calls), [0]
        self._taps += 1

        @functools.wraps(function)
        def unit(*args, **kwargs):
            call_site = self._call_site
            outer = self.unit_call
            self._tap_depth += 1
            try:
                if call_site is None or not self._tap_units:
                    return function(*args, **kwargs)
                self.unit_call = (serial, runs[0] > 0)
                runs[0] += 1
                return self._through_site(path, function, call_site, args, kwargs)
            finally:
                self.unit_call = outer
                self._tap_depth -= 1

        return unit

    def _through_site(self, path, forward, call_site, args, kwargs):
        """Calls forward(*args, **kwargs) through the runner's site `path`: its tensors, nested or
        not, are the site's inputs and outputs."""
        call = _CallArguments(args, kwargs, forward)
        call.site = path
        box = {}

        def fn(tensors):
            # A checkpoint that hands the recompute the arguments themselves (torch's) may hand a
            # list the forward consumed or refilled since: the call as the checkpoint makes it.
            a, k = (call.recomputed or call).with_tensors(tensors)
            # What the model's code gets: a list it is handed holds what it holds now (inputs_seen).
            self._inputs_seen[path] = len(_CallArguments(a, k).tensors) if call.opened else -1
            out = forward(*a, **k)
            out_leaves, out_spec = pytree.tree_flatten(out)
            out_idx = [i for i, v in enumerate(out_leaves) if isinstance(v, torch.Tensor)]
            if "out" not in box:
                box["out"] = (out_leaves, out_spec, out_idx)
            return [out_leaves[i] for i in out_idx]

        self._structures.append(call)
        try:
            ys = call_site(path, fn, call.tensors)
        finally:
            self._structures.pop()
        out_leaves, out_spec, out_idx = box["out"]
        out_leaves = list(out_leaves)
        for i, y in zip(out_idx, ys):
            out_leaves[i] = y
        return pytree.tree_unflatten(out_leaves, out_spec)

    def _discover(self):
        """The sites the forward calls, in the order it first reaches them, and the default ones.
        Under --checkpoint model one forward with the model's switch on shows both: it calls the
        modules the plain forward calls, and the units its checkpoint takes (a forward fewer in
        the check's cost); the plain forward runs here only to say which of the two fails."""
        called = []
        seen = set()

        def record(path):
            if path not in seen:
                seen.add(path)
                called.append(path)

        if self.checkpoint == Kind.model:
            own = self._own_sites(called, record)
            return called + [u for u in own if u not in called], own
        self._recording = record
        try:
            self._run_plain()  # with autograd on, as the step runs (a forward may take gradients itself)
        except UsageError:
            raise
        except Exception as e:
            raise UsageError(_failure("the model fails without checkpointing", e)) from e
        finally:
            self._recording = None
        return called, self._block_sites(called)

    def _run_plain(self):
        a, k = pytree.tree_unflatten(list(self._in_leaves), self._in_spec)
        return self.module(*a, **k)

    def _block_sites(self, called):
        """The model's blocks: in each outermost ModuleList, Sequential or ModuleDict, the children with
        parameters when they are at least two, all of one class or of subclasses of one
        (transformer layers, ResNet blocks, ViT blocks; not a stem of a convolution and a norm), else
        those of the one class most of them share (MobileNet's inverted residuals between its stem
        and last convolution). A child without parameters (an activation, a dropout, a pooling) is
        no block: checkpointing it alone saves nothing, and an in-place one breaks the checkpoint."""
        called_set = set(called)
        chosen, blocks = [], set()
        for path, m in self.module.named_modules():
            if not isinstance(m, _LAYER_CONTAINERS) or any(path == c or path.startswith(c + ".") for c in chosen):
                continue
            kids = [(f"{path}.{n}" if path else n, c) for n, c in m.named_children()]
            found = _blocks_among([(p, c) for p, c in kids if any(True for _ in c.parameters()) and p in called_set])
            if found:
                chosen.append(path)
                blocks.update(found)
        if blocks:
            return [p for p in called if p in blocks]
        return [p for p in called if "." not in p]  # the root's children

    def _refuse_failing_switch(self, failed):
        """The model fails with its own checkpointing on: say whether it fails without it too."""
        try:
            self._run_plain()
        except Exception as plain:
            raise UsageError(_failure("the model fails without checkpointing", plain)) from plain
        raise UsageError(_failure("the model fails with its own checkpointing on", failed)) from failed

    def _tapped_units(self, called):
        """The units the checkpoint tap saw, in call order, outermost only."""
        self._tap_units = True
        order = {p: i for i, p in enumerate(called)}
        units = sorted(self._units_seen, key=lambda p: order.get(p, len(order)))
        nested = [u for u in units if any(u.startswith(v + ".") for v in units if v != u)
                  or (u in self._nested_seen and u not in self._outer_seen)]
        units = [u for u in units if u not in nested]
        self._unit_paths = set(units)
        return units

    def _own_sites(self, called, record_call):
        """--checkpoint model: the units the model's own checkpoint takes. Seen through the
        checkpoint tap, they are the callables the model hands to the checkpoint, which a forward
        with the switch on meets (nested ones included); where the model reaches a checkpoint the
        tap does not see, the modules called again during a backward, outermost only. The
        forward's module calls go to record_call, and fill `called`."""
        recomputed = []

        def record(path):
            if torch._C._current_graph_task_id() == -1:
                record_call(path)
            elif path not in recomputed:
                recomputed.append(path)

        self._units_seen = []
        self._nested_seen, self._outer_seen = set(), set()
        self._enable()
        _tap_stored_checkpoints(self.module)
        self._recording = record
        _ACTIVE.append(self)
        failed = None
        try:
            with torch.utils.checkpoint.set_checkpoint_early_stop(False):
                out = self._run_plain()
                if not self._units_seen:  # no tapped checkpoint: the recompute shows the units
                    ts = []
                    _float_tensors(_apply_loss(self.loss, out) if self.loss else out, ts, set())
                    ts = [t for t in ts if t.requires_grad]
                    if ts:
                        torch.autograd.backward([t.sum() for t in ts])
                del out
        except Exception as e:
            failed = e
        finally:
            _ACTIVE.remove(self)
            self._recording = None
            self._disable()
        if failed is not None:
            self._refuse_failing_switch(failed)
        if self._units_seen:
            return self._tapped_units(called)
        outer = [p for p in called if p in recomputed and not any(p.startswith(q + ".") for q in recomputed)]
        if not outer:
            sets = f" (it sets {', '.join(sorted(self._switch_attrs))})" if self._switch_attrs else ""
            raise UsageError(f"--checkpoint model: the model's own switch{sets} checkpointed nothing (no module ran "
                             "again during backward), so checkpointing is not applied: does the forward read what "
                             "the switch sets, is the switch on the module that runs, is the model in training "
                             "mode, and does a checkpointed layer get an input that requires grad?")
        return outer

    def torch_checkpoint(self, fn, inputs, reentrant, preserve_rng_state):
        """torch.utils.checkpoint.checkpoint around the unit now being called, with its arguments
        as the model passes them (tensors nested in tuples and dicts stay nested, keyword
        arguments stay keywords: bound with functools.partial under use_reentrant=True, which takes
        none, as Hugging Face does). `fn` takes the flat tensors.

        Early stopping of the non-reentrant recompute is off so that the recompute always runs to
        its end (it changes no value, only how much is recomputed)."""
        import torch.utils.checkpoint as tc

        call = self._structures[-1]

        def structured(*a, **k):  # the call's arguments, their tensors detached under use_reentrant=True
            given = _CallArguments(a, k)
            call.recomputed = given if len(given.tensors) != len(call.tensors) else None
            try:
                return fn(*given.tensors)
            finally:
                call.recomputed = None

        a, k = call.args, call.kwargs
        with tc.set_checkpoint_early_stop(False):
            if self.checkpoint == Kind.torch_wrapper:
                out = _wrapped(structured, preserve_rng_state)(*a, **k)
            elif reentrant:
                out = tc.checkpoint(functools.partial(structured, **k), *a, use_reentrant=True,
                                    preserve_rng_state=preserve_rng_state)
            else:
                context_fn = self._step_context_fn or self._context_fn
                extra = {"context_fn": self._tallied(context_fn, call.site)} if context_fn is not None else {}
                out = tc.checkpoint(structured, *a, use_reentrant=False, preserve_rng_state=preserve_rng_state,
                                    **extra, **k)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def _tallied(self, context_fn, site):
        """`context_fn` whose forward context counts what its op-level policy decides at `site`:
        [ops saved, ops left to recompute] in self._op_policy. The decisions are the policy's own."""
        def contexts():
            forward_ctx, recompute_ctx = context_fn()
            policy = getattr(forward_ctx, "policy_fn", None)
            if callable(policy):
                tally = self._op_policy[site] = [0, 0]  # the site's latest call

                def counting(ctx, op, *args, **kwargs):
                    decision = policy(ctx, op, *args, **kwargs)
                    tally[0 if _saves(decision) else 1] += 1
                    return decision

                forward_ctx.policy_fn = counting
            return forward_ctx, recompute_ctx

        return contexts

    def inputs_seen(self, site):
        """How many input tensors the arguments of `site`'s latest call held as the model's code got
        them (a list consumed since its forward holds fewer); -1 where they hold no list or dict."""
        return self._inputs_seen.get(site, -1)

    def op_policy(self):
        """[(site, ops saved, ops left to recompute)] of the op-level policy at each site's latest
        checkpointed call; empty without one."""
        return [(site, saved, recomputed) for site, (saved, recomputed) in self._op_policy.items()]

    def selective_problem(self, ops):
        """Why the ops of a sac:OPS policy cannot be saved ("" when they can)."""
        try:
            selective_context(Kind.torch_sac, ",".join(ops), None)
        except UsageError as e:
            return str(e)
        return ""

    def site_problem(self, site):
        if self.checkpoint == Kind.model and site not in self.default_sites:
            return ("with --checkpoint model the model decides where checkpoints go; it checkpoints "
                    + ", ".join(self.default_sites))
        return ""

    # -- steps ----------------------------------------------------------------------------------
    first_seed = 0  # the run's seed: make_inputs(first_seed) is the factory's batch itself

    def make_inputs(self, seed):
        """The inputs as the model gets them: copies that require grad where the factory's did.
        Another micro-batch (seed past the run's) holds the same samples in another order: each
        input rolled by that many places along its first dimension, where that is longer than one,
        so that state a forward fills from its batch differs from micro-batch to micro-batch while
        every value stays one the model was given (token ids, masks and labels stay in step)."""
        shift = seed - self.first_seed
        out = []
        for i in self._in_idx:
            t = self._in_leaves[i].detach().clone()
            if shift and t.dim() > 0 and t.shape[0] > 1:
                t = t.roll(shift, 0)
            out.append(t.requires_grad_(self._in_leaves[i].requires_grad))
        return out

    def arguments(self, tensors):
        """(args, kwargs) of the model's call with `tensors` in place of its input tensors."""
        leaves = list(self._in_leaves)
        for i, t in zip(self._in_idx, tensors):
            leaves[i] = t
        return pytree.tree_unflatten(leaves, self._in_spec)

    @staticmethod
    def float_outputs(out):
        ts = []
        _float_tensors(out, ts, set())
        return ts

    def forward(self, tensors, call_site, checkpointing, sites=(), budget=None, sac=""):
        a, k = self.arguments(tensors)
        # A sac:OPS policy (bench, plan): its op-level contexts in place of the checkpoint's own.
        if sac and sac not in self._policy_contexts:
            self._policy_contexts[sac] = selective_context(Kind.torch_sac, sac, None)
        self._step_context_fn = self._policy_contexts.get(sac) if sac else None
        if self._compiler is not None:
            # Compiled: the checkpoints are applied inside the compiled graph, where no call reaches
            # the runner; `sites` says which the runner checkpoints, `budget` a budget:F policy's F.
            out = self._compiler.run(self._compiler.variant(checkpointing, sites, budget), a, k)
            if self.loss is not None:
                out = _apply_loss(self.loss, out)
            return self._outputs(out)
        own = self.checkpoint == Kind.model
        if own:
            (self._enable if checkpointing else self._disable)()
            self._switch_on = checkpointing
            _tap_stored_checkpoints(self.module)
            twin = getattr(self._engine, "sharded", None)
            if twin is not None:
                self._sync_switch(twin)
                _tap_stored_checkpoints(twin)
            _ACTIVE.append(self)
        # Kept after the forward: the backward's recomputes call the modules again.
        self._call_site = call_site
        offloaded = self._offload() if self._offload is not None and checkpointing else contextlib.nullcontext()
        try:
            with torch.utils.checkpoint.set_checkpoint_early_stop(False), offloaded, self._globals.within_step():
                taps = self._taps
                out = (self._engine or self.module)(*a, **k)
                if self.loss is not None:
                    out = _apply_loss(self.loss, out)
            if own and checkpointing and self._taps == taps and getattr(self._engine, "sharded", None) is not None \
                    and self._engine.on:
                # The engine's copy must checkpoint as the module does, or the step compared is plain.
                raise RuntimeError(f"the engine's copy of the model ran its forward with the model's switch on and "
                                   f"checkpointed nothing, where the model checkpoints {', '.join(self.default_sites)}")
        except BaseException:
            self._call_site = None
            raise
        finally:
            if own:
                _ACTIVE.remove(self)
        return self._outputs(out)

    def _outputs(self, out):
        self.last_structure = _structure(out)
        ts = self.float_outputs(out)
        if not ts:
            raise UsageError("the model's output holds no floating-point tensor to differentiate; "
                             "return a 'loss' from the factory")
        return ts

    # -- state ----------------------------------------------------------------------------------
    def named_parameters(self):
        return list(self.module.named_parameters())

    def named_buffers(self):
        return list(self.module.named_buffers())

    def _attributes(self):
        """(module path, module, attribute name, full name) of every attribute that is state:
        numbers, flags, strings, tensors held as plain attributes and containers of those."""
        for path, m in self.module.named_modules():
            for key, full in self._state_attributes(path, m):
                yield path, m, key, full

    def _state_attributes(self, path, m):
        """(attribute name, full name) of the state attributes of module `m` at `path`."""
        for key, value in vars(m).items():
            if key in _MODULE_INTERNALS or key.startswith("__"):
                continue
            full = f"{path}.{key}" if path else key
            if full in self._switch_attrs or not _is_state_value(value):
                continue
            yield key, full

    def _attributes_the_switch_sets(self):
        """The state attributes the model's switch sets (found by turning it on and off). Every
        instance attribute the switch touches, state or not (a flag, a function it stores), is
        kept in self._switch_before as the model came, for close() to put back: a switch that was on
        stays on, one that was off stays off, an attribute it added goes again."""
        def attributes():
            return {(p, k): (m, v) for p, m in self.module.named_modules() for k, v in vars(m).items()
                    if k not in _MODULE_INTERNALS}

        def values(attrs):
            return {f"{p}.{k}" if p else k: _fingerprint(v) for (p, k), (m, v) in attrs.items() if _is_state_value(v)}

        came = attributes()
        self._hooks_came = [(m, name, dict(getattr(m, name))) for m in self.module.modules() for name in _HOOK_DICTS]
        before = values(came)
        self._enable()
        switched_on = attributes()
        on = values(switched_on)
        self._disable()
        switched_off = attributes()
        after = values(switched_off)
        touched = {}
        for seen in (switched_on, switched_off):
            for key, (m, v) in seen.items():
                if key not in came or came[key][1] is not v:
                    touched[key] = (m, came[key][1] if key in came else _ABSENT)
        self._switch_before = [(m, k, v) for (p, k), (m, v) in touched.items()]
        flags = {k for k in set(on) | set(after) if on.get(k) != after.get(k)}
        self._switch_came_on = bool(flags) and all(before.get(k) == on.get(k) for k in flags)
        return {k for k in set(before) | set(on) | set(after)
                if before.get(k) != on.get(k) or on.get(k) != after.get(k)}

    def _learn_switch(self, switch):
        """What the model's own switch sets; a switch the caller turned on (a trainer, with its kwargs)
        is checked as it came, not as the switch's defaults would set it."""
        self._switch_attrs = self._attributes_the_switch_sets()
        if self._switch_came_on and switch[2] != _GIVEN_SWITCH:
            self._enable = self._switch_as_it_came
            self.checkpoint_reason += "; it came switched on, and is checked as it came (its own settings)"

    def _put_switch_attributes_back(self):
        """Every attribute the switch touches at the value the model came with (gone where it had none)."""
        for m, key, value in self._switch_before:
            if value is _ABSENT:
                vars(m).pop(key, None)
            else:
                setattr(m, key, value)

    def _switch_as_it_came(self):
        """The model's switch on as the caller set it: every attribute the switch touches back at the
        value the model came with (the stored checkpoint function with its kwargs), and a forward
        hook the switch's off removed (Hugging Face's input-grad hook under PEFT) back in place."""
        self._put_switch_attributes_back()
        for m, name, came in self._hooks_came:
            now = getattr(m, name)
            for hook_id, hook in came.items():
                now.setdefault(hook_id, hook)

    def state_tensors(self):
        out = [(n, b, "buffer") for n, b in self.module.named_buffers()]
        for path, m, key, full in self._attributes():
            _flatten_attr("@" + full, getattr(m, key), out)
        for path, m in self.module.named_modules():
            out.append(("@" + (f"{path}.training" if path else "training"), _scalar_tensor(bool(m.training)), "mode"))
        self._globals.state_tensors(out)
        return out

    def module_variables(self):
        """[("FILE:NAME", digest)] of the module-level variables of the model's own code."""
        return self._globals.digests()

    def state_origin(self, name):
        """Where the model's code writes the state entry `name` ("FILE:LINE"), where ckcheck can tell
        (module-level variables); "" otherwise."""
        return self._globals.origin(name) if name.startswith("@") and ":" in name else ""

    def unit_state(self, sites):
        """(name, tensor, kind) of the parameters (kind "") and the state (as state_tensors() lists
        it) of the modules at `sites` and inside them: what a checkpointed unit reads of the model,
        read at each of its calls, so that a call's cost does not grow with the model's depth. Names
        are the whole lists': a module reached through several paths, or a tensor several modules
        hold, by its first path. None where a site is no module path: the caller then filters the
        whole lists."""
        roots = []
        for site in sites:
            m = self.module if site == "" else self._paths.get(site)
            if m is None:
                return None
            roots.append((site, m))
        modules, seen = [], set()
        for site, root in roots:
            for path, m in root.named_modules(prefix=site):
                if id(m) not in seen:
                    seen.add(id(m))
                    modules.append((self._names.get(id(m), path), m))
        tied = self._tied_tensors()
        out, tensors = [], set()
        for members, kind in (("_parameters", ""), ("_buffers", "buffer")):
            for path, m in modules:
                for key, t in getattr(m, members).items():
                    if t is None or id(t) in tensors:
                        continue
                    tensors.add(id(t))
                    holders = tied.get(id(t))
                    name = holders[1][0] if holders and holders[0] is t else f"{path}.{key}" if path else key
                    out.append((name, t, kind))
        for path, m in modules:
            for key, full in self._state_attributes(path, m):
                _flatten_attr("@" + full, getattr(m, key), out)
            _flatten_closure("@" + (path or type(m).__name__), m, out)
            out.append(("@" + (f"{path}.training" if path else "training"), _scalar_tensor(bool(m.training)), "mode"))
        return out

    def _tied_tensors(self):
        """{id(tensor): (tensor, its names)} of the parameters and buffers that several modules hold
        (an output layer's weight tied to the embedding's), named in the order of the whole lists:
        the first is the name they give it. Found once: ties are made when the model is built."""
        if self._tied is None:
            held = {}
            for path, m in self.module.named_modules():
                for members in ("_parameters", "_buffers"):
                    for key, t in getattr(m, members).items():
                        if t is not None:
                            held.setdefault(id(t), (t, []))[1].append(f"{path}.{key}" if path else key)
            self._tied = {k: v for k, v in held.items() if len(v[1]) > 1}
        return self._tied

    def state_aliases(self):
        """{name: [its other paths]} for the parameters, buffers, attributes and training flag of a
        module that the model reaches through several paths (one module every block calls), and for a
        tensor several modules hold (a tied weight): state_tensors() and named_parameters() name each
        by its first path, and a site that reaches it through another path reads it too."""
        paths = {}
        for path, m in self.module.named_modules(remove_duplicate=False):
            paths.setdefault(id(m), (m, []))[1].append(path)
        out = {names[0]: names[1:] for _, names in self._tied_tensors().values()}
        for m, found in paths.values():
            if len(found) < 2:
                continue
            first, others = found[0], found[1:]
            own = [n for n, _ in m.named_parameters(recurse=False)] + [n for n, _ in m.named_buffers(recurse=False)]
            for key in own:
                out[f"{first}.{key}"] = [f"{o}.{key}" for o in others]
            out[f"@{first}.training"] = [f"@{o}.training" for o in others]
            for path, owner, key, full in self._attributes():
                if path != first:
                    continue
                flat = []
                _flatten_attr("@" + full, getattr(owner, key), flat)
                for name, _, _ in flat:
                    rest = name[len("@" + full):]
                    out[name] = ["@" + (f"{o}.{key}" if o else key) + rest for o in others]
        return out

    def eval_modules(self):
        return [p or "(root)" for p, m in self.module.named_modules() if not m.training]

    def host_generators(self):
        """Python's and NumPy's global generators, then those the model keeps as attributes."""
        kept = [(full, _state_digest(_generator_state(getattr(m, key)))) for path, m, key, full in self._attributes()
                if _host_generator(getattr(m, key))]
        return _host_generator_digests() + kept

    def _handed(self):
        """(name, argument, the lists, dicts and objects it holds) for each argument of the site
        calls under way that holds any."""
        return [h for call in self._structures for h in call.handed_state()]

    def handed_state(self):
        """Each argument of the site calls under way that holds lists, dicts or objects, named with
        its type, and a digest of what they hold: a unit whose call changes one keeps state outside
        the model (a cache it appends to)."""
        return [(f"{name}: {type(value).__name__}", _held_digest(kept)) for name, value, kept in self._handed()]

    def snapshot(self):
        with torch.no_grad():
            params = {n: p.detach().clone() for n, p in self.module.named_parameters()}
            buffers = {n: b.detach().clone() for n, b in self.module.named_buffers()}
        # A container keeps the model's own parameters and buffers, not copies; a tensor, dict or
        # list attribute is put back into the object the model held (_put_back_into).
        keep = {id(t): t for t in itertools.chain(self.module.parameters(), self.module.buffers())}
        attrs = {full: (m, key, _copy_value(getattr(m, key), keep)) for path, m, key, full in self._attributes()}
        held = {full: getattr(m, key) for full, (m, key, value) in attrs.items()
                if isinstance(value, (torch.Tensor, dict, list))}
        modes = {path: m.training for path, m in self.module.named_modules()}
        # Taken inside a call (the determinism probe runs a unit again from here): the lists, dicts
        # and objects the calls under way were handed are state too (a cache a block appends to).
        handed = _container_contents(c for _, _, kept in self._handed() for c in kept)
        return params, buffers, (attrs, held, keep), modes, _host_generators(), handed, self._globals.snapshot()

    def restore(self, snap):
        params, buffers, (attrs, held, keep), modes, host, handed, variables = snap
        _set_host_generators(host)
        _put_back_contents(handed)
        self._globals.restore(variables)
        with torch.no_grad():
            for n, p in self.module.named_parameters():
                if n in params:
                    p.copy_(params[n])
                p.grad = None
            for n, b in self.module.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])
        for full, (m, key, value) in attrs.items():
            if isinstance(value, _GeneratorState):
                value.put_back(getattr(m, key))
            elif full in held and _put_back_into(held[full], value, keep):
                setattr(m, key, held[full])
            elif not _plain_scalar(value) or getattr(m, key, _ABSENT) is not value:
                setattr(m, key, _copy_value(value, keep))
        for path, m in self.module.named_modules():
            if path in modes:
                m.training = modes[path]

    def precision_changed(self, rerun):
        """A float64 rerun begins (rerun) or ends: ops without a float64 kernel run by their
        definition meanwhile (ckcheck._float64)."""
        if rerun:
            self._float64 = _float64.Float64Scope()
            self._float64.begin()
        elif getattr(self, "_float64", None) is not None:
            scope, self._float64 = self._float64, None
            scope.end()

    def to(self, device):
        self.module.to(device)
        self._in_leaves = [v.to(device) if isinstance(v, torch.Tensor) else v for v in self._in_leaves]

    def options(self):
        return {}


def _host_generators():
    """The states of Python's and NumPy's global generators: a forward may draw from them (speech
    models' SpecAugment masks come from NumPy), and every run starts from the same state, as it does
    from the same torch seed."""
    numpy = sys.modules.get("numpy")
    return random.getstate(), (numpy.random.get_state() if numpy is not None else None)


def _host_generator_digests():
    """[(name, digest)] of Python's and NumPy's global generators: a unit whose call changes a digest
    drew from that generator, which no checkpoint replays."""
    python_state, numpy_state = _host_generators()
    out = [("random", _state_digest(python_state))]
    if numpy_state is not None:
        out.append(("numpy.random", _state_digest(numpy_state)))
    return out


def _set_host_generators(states):
    python_state, numpy_state = states
    random.setstate(python_state)
    if numpy_state is not None:
        sys.modules["numpy"].random.set_state(numpy_state)


# What holds a model's layers: a list, a sequence, or layers by name.
_LAYER_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def _share_a_class(modules):
    """True when the modules have a common class below nn.Module."""
    common = None
    for m in modules:
        mro = {c for c in type(m).__mro__ if issubclass(c, torch.nn.Module) and c is not torch.nn.Module}
        common = mro if common is None else common & mro
    return bool(common)


def import_ops(spec):
    """validate-op --import: imports the module that registers a custom op -- a module name
    (mypkg.ops) or a file (ops.py) -- so that its torch.library registrations run."""
    if not spec.strip():
        raise UsageError("--import: give a module name (mypkg.ops) or a file (ops.py)")
    try:
        if spec.endswith(".py"):
            if not os.path.isfile(spec):
                raise UsageError(f"--import {spec}: no such file")
            name = "ckcheck_ops_" + str(abs(hash(os.path.abspath(spec))))
            module_spec = importlib.util.spec_from_file_location(name, spec)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except UsageError:
        raise
    except Exception as e:  # what importing the user's module raised, in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UsageError(f"--import {spec}: cannot import it: {type(e).__name__}: {first}") from e
