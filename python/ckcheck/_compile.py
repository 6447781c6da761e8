"""Compiled training (--compile): the model's steps run through torch.compile, as users train it.

Three steps are compared. The eager plain step against the compiled plain step is the reference for
the math (here, at load); the compiled plain step against the compiled checkpointed step is the
run's verdict (the C++ runner's reference and checkpointed steps). Each variant -- plain, a set of
checkpointed sites, the model's own switch on, the memory budget -- is compiled once, as its own
function, and reused by every later step (ckcheck's determinism needs the same graph each time).

Inside a compiled graph no call can reach ckcheck's runner, so the checkpoints are applied here
(torch.utils.checkpoint around each checkpointed site, the model's own switch, or the compiler's
activation memory budget), and the evidence comes from the compiled graphs themselves: inductor
compiles through compile_fx with an inner compiler that reads each forward and backward graph (the
random ops a backward runs again, the tensors the forward saves, graph breaks) and then compiles
it as inductor would. Inductor's and AOTAutograd's on-disk caches are off in this process, so every
graph is seen (a cached graph would skip the inner compiler); no value the model computes changes.
"""

from __future__ import annotations

import functools
import re
import time
import types

import torch

from ckcheck import _base
from ckcheck._core import CheckpointKind as Kind

# The relative difference, against the tensor's largest magnitude, within which the compiled plain
# step counts as the eager one's math (fp32). Measured on this project's models (docs/compile.md):
# up to 8e-5 (a BatchNorm bias's gradient, reduced in another order), so 1e-3 leaves room.
EAGER_TOLERANCE = 1e-3

# How facts() marks a graph break that only the checkpointed step's compile met (checks/compile.cpp
# reads it).
CHECKPOINTED_ONLY = "checkpointed step only: "

_SEED_OPS = ("inductor_seed", "inductor_lookup_seed", "inductor_seeds")


def _is_random(node) -> bool:
    if node.op != "call_function":
        return False
    name = str(node.target)
    if any(s in name for s in _SEED_OPS):
        return False
    if "inductor_random" in name or "inductor_randint" in name:
        return True
    tags = getattr(node.target, "tags", ())
    if torch.Tag.nondeterministic_seeded not in tags:
        return False
    # An op that may draw (attention with dropout_p, native_dropout) draws nothing at p = 0 or
    # train = False.
    schema = getattr(node.target, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        if arg.name not in ("p", "dropout_p", "train"):
            continue
        if i < len(node.args):
            value = node.args[i]
        elif arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            continue
        if isinstance(value, (bool, int, float)) and not value:
            return False
    return True


_PATH_PARTS = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]|\[['\"]([^'\"]+)['\"]\]|\[(\d+)\]")


def _draws_fresh(node) -> bool:
    """True when a random op of a backward graph draws new numbers: its seed comes from seeds the
    backward graph draws itself (prims.inductor_seeds), or it draws from the generator directly
    (an aten random op). A seed that the forward saved and passed in replays the forward's draw."""
    if "inductor_random" not in str(node.target) and "inductor_randint" not in str(node.target):
        return True
    todo, seen = list(node.all_input_nodes), set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_function" and "inductor_seeds" in str(n.target):
            return True
        if n.op == "call_function":
            todo.extend(n.all_input_nodes)
    return False


def _nbytes(node) -> int:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        try:
            return int(value.numel()) * value.element_size()
        except Exception:  # a size the graph leaves symbolic
            return 0
    return 0


def _module_path(text: str) -> str:
    """'L['module'].blocks.0.drop' or 'L['self']._modules['blocks']._modules['0']' -> 'blocks.0.drop'."""
    text = re.sub(r"^L\[['\"][^'\"]+['\"]\]", "", text)
    text = _PATH_PARTS.sub(lambda m: "." + next(g for g in m.groups() if g is not None), text)
    return text.strip(".")


def _source_of(node) -> str:
    """The user's line that made a node: 'torch.randn_like(h) (model.py:12)', or ''."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', trace)
    if not frames:
        return ""
    path, line, code = frames[-1]
    return f"{code.strip()} ({path.rsplit('/', 1)[-1]}:{line})"


def _site_of(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1]
    return _module_path(path[0] if isinstance(path, tuple) else str(path))


class _Graphs:
    """What the compiled graphs of one variant hold."""

    def __init__(self):
        self.forward = 0
        self.backward = 0
        self.saved = 0
        self.backward_random = []  # (site, op, source) of the random ops that draw new numbers
        self.backward_replayed = 0  # random ops that replay the forward's seeds
        self.forward_random = 0
        self.saved_bytes = 0  # activations saved for backward (parameters and inputs aside)
        self.breaks = {}  # Dynamo's reason (its first line) -> how many times
        self.seconds = 0.0


class Compiler:
    """The compiled steps of one adapter's model."""

    def __init__(self, adapter, mode: str, budget: float, checkpoint: Kind):
        self.adapter = adapter
        self.mode = mode
        self.budget = budget
        self.checkpoint = checkpoint
        self.graphs = {}  # variant key -> _Graphs
        self._compiled = {}  # variant key -> compiled function
        self._building = _Graphs()  # the record the inner compiler writes to now
        self._last = ("plain",)  # the variant run last
        self._last_checkpointed = None  # the variant other than plain run last
        self._wrappers = {}  # site -> its checkpointed forward (made once: the compiled guards see the same object)
        self._mode_options = torch._inductor.list_mode_options(mode) if mode != "default" else {}
        # Every graph must reach the inner compiler: the on-disk caches would skip it. Inductor imports
        # torch.utils.cpp_extension, whose import warns on a CUDA wheel without a GPU ("No CUDA
        # runtime is found"): not the model's business, and not ckcheck's output. Both are put back
        # in close() (ckcheck.run leaves the process as it found it).
        import logging

        import torch._functorch.config as functorch_config

        self._settings = [(torch._inductor.config, "fx_graph_cache", False),
                          (functorch_config, "enable_autograd_cache", False)]
        self._settings = [(owner, name, getattr(owner, name), value) for owner, name, value in self._settings]
        for owner, name, _, value in self._settings:
            setattr(owner, name, value)
        self._logger = logging.getLogger("torch.utils.cpp_extension")
        self._log_level = self._logger.level
        self._logger.setLevel(logging.ERROR)
        self.eager = {"compared": False, "note": "", "max_rel": 0.0, "worst": "", "tolerance": EAGER_TOLERANCE}

    # -- the inner compiler ---------------------------------------------------------------------
    def _inner(self, gm, example_inputs, **kwargs):
        from torch._inductor import compile_fx

        g = self._building
        backward = bool(kwargs.get("is_backward", False))
        if backward:
            g.backward += 1
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            saved = [n for n in placeholders if not n.name.startswith("tangents")]
            g.saved += len(saved)
            g.saved_bytes += sum(_nbytes(n) for n in saved if not n.name.startswith("primals"))
            for n in gm.graph.nodes:
                if not _is_random(n):
                    continue
                if _draws_fresh(n):
                    g.backward_random.append((_site_of(n), str(n.target), _source_of(n)))
                else:
                    g.backward_replayed += 1
        else:
            g.forward += 1
            g.forward_random += sum(_is_random(n) for n in gm.graph.nodes)
        t0 = time.perf_counter()
        try:
            return compile_fx.compile_fx_inner(gm, example_inputs, **kwargs)
        finally:
            g.seconds += time.perf_counter() - t0 if backward else 0.0

    def _backend(self, gm, example_inputs):
        from torch._inductor import compile_fx

        return compile_fx.compile_fx(gm, example_inputs, inner_compile=self._inner,
                                     config_patches=dict(self._mode_options) or None)

    def _function(self, key):
        """The compiled step of a variant: its own function (Dynamo keeps compiled code per
        function), compiled on its first call."""
        fn = self._compiled.get(key)
        if fn is None:
            def step(module, args, kwargs):
                return module(*args, **kwargs)

            name = f"ckcheck_compiled_{len(self._compiled)}"
            fresh = types.FunctionType(step.__code__.replace(co_name=name), step.__globals__, name,
                                       step.__defaults__, step.__closure__)
            fn = torch.compile(fresh, backend=self._backend, dynamic=False)
            self._compiled[key] = fn
        return fn

    # -- variants ---------------------------------------------------------------------------------
    def close(self):
        """The modules' own forwards back (the checkpoint wrappers off), and the settings as they were."""
        self._set_up(("plain",))
        for owner, name, before, _ in self._settings:
            setattr(owner, name, before)
        self._logger.setLevel(self._log_level)

    def variant(self, checkpointing: bool, sites, budget=None) -> tuple:
        """The variant a step runs: ("plain",), ("sites", sites) (torch's checkpoint around them),
        ("checkpointed",) (the model's switch, or the budget alone) or ("budget", F) (a budget:F
        policy: no module checkpoints)."""
        if budget is not None:
            return ("budget", float(budget))
        if self.checkpoint in (Kind.torch, Kind.torch_reentrant):
            return ("sites", tuple(sorted(sites))) if sites else ("plain",)
        return ("checkpointed",) if checkpointing else ("plain",)

    def _set_up(self, key):
        """Puts the model in the state the variant trains in: checkpoint wrappers on its sites, or
        the model's own switch on or off."""
        adapter = self.adapter
        if self.checkpoint in (Kind.torch, Kind.torch_reentrant):
            sites = set(key[1]) if key[0] == "sites" else set()
            for path, (wrapper, own) in self._wrappers.items():
                module = adapter._paths[path]
                if path not in sites and vars(module).get("forward") is wrapper:
                    if own is None:
                        del module.forward
                    else:
                        module.forward = own
            for path in sites:
                module = adapter._paths[path]
                if path not in self._wrappers:
                    own = vars(module).get("forward")  # a forward the user set on the instance
                    self._wrappers[path] = (_checkpointed(module.forward, self.checkpoint == Kind.torch_reentrant), own)
                module.forward = self._wrappers[path][0]
        elif self.checkpoint == Kind.model:
            (adapter._enable if key[0] == "checkpointed" else adapter._disable)()

    def _budget_of(self, key) -> float:
        if key[0] == "budget":
            return key[1]
        return self.budget if key[0] != "plain" else 1.0

    def run(self, key, args, kwargs):
        """One forward of the variant `key`, compiled (on its first call)."""
        import torch._functorch.config as functorch_config
        from torch._dynamo.utils import counters

        self._set_up(key)
        self._last = key
        if key != ("plain",):
            self._last_checkpointed = key
        fn = self._function(key)
        old = self.graphs.get(key)
        # What this call compiles (a first call, or a recompile when the inputs' guards changed:
        # autocast, inputs that require grad) replaces what the variant held; the backward graphs
        # are compiled during this step's backward, into the same record.
        self._building = _Graphs()
        breaks = dict(counters["graph_break"])
        t0 = time.perf_counter()
        with functorch_config.patch(activation_memory_budget=self._budget_of(key)):
            out = fn(self.adapter.module, args, kwargs)
        if self._building.forward > 0 or old is None:
            self._building.seconds += time.perf_counter() - t0 + (old.seconds if old else 0.0)
            after = counters["graph_break"]
            for reason in after:
                if after[reason] > breaks.get(reason, 0):
                    first = str(reason).strip().splitlines()[0] if str(reason).strip() else "graph break"
                    self._building.breaks[first] = self._building.breaks.get(first, 0) + after[reason] - breaks.get(reason, 0)
            self.graphs[key] = self._building
        else:
            self._building = old
        return out

    def warm_up(self, key, inputs):
        """One step of a variant from the start state, put back after: compiles it."""
        start = self.adapter.snapshot()
        try:
            _base.one_step(self.adapter, lambda args, kwargs: self.run(key, args, kwargs), inputs)
        finally:
            self.adapter.restore(start)
            self._set_up(("plain",))

    # -- the eager step against the compiled plain step --------------------------------------------
    def compare_with_eager(self, inputs):
        """One plain step eager and one compiled, from the same state and seed: outputs and
        parameter gradients, as the largest difference relative to each tensor's magnitude."""
        adapter = self.adapter
        start = adapter.snapshot()
        steps = {"eager": lambda args, kwargs: adapter.module(*args, **kwargs),
                 "compiled": lambda args, kwargs: self.run(("plain",), args, kwargs)}
        results = []
        try:
            for forward in steps.values():
                adapter.restore(start)
                outputs, drew = _base.one_step(self.adapter, forward, inputs)
                tensors = [(f"output {i}", t.detach().clone()) for i, t in enumerate(outputs)]
                tensors += [(n, p.grad.detach().clone()) for n, p in adapter.module.named_parameters() if p.grad is not None]
                results.append((tensors, drew))
        finally:
            adapter.restore(start)
        (eager, eager_drew), (compiled, _) = results
        random_ops = self.graphs.get(("plain",), _Graphs()).forward_random
        if eager_drew or random_ops:
            self.eager["note"] = ("the model draws random numbers, which a compiled graph draws its own way, so the "
                                  "eager and the compiled step differ by design and are not compared")
            return
        if [n for n, _ in eager] != [n for n, _ in compiled]:
            self.eager["note"] = "the eager and the compiled step return different outputs or gradients"
            return
        worst, worst_name = 0.0, ""
        for (name, a), (_, b) in zip(eager, compiled):
            if a.shape != b.shape or not (a.is_floating_point() and b.is_floating_point()):
                continue
            rel = _base.relative_difference(a, b)
            if rel > worst or worst_name == "":
                worst, worst_name = rel, name
        self.eager.update(compared=True, max_rel=worst, worst=worst_name)

    # -- what the report gets ---------------------------------------------------------------------
    def facts(self) -> dict:
        plain = self.graphs.get(("plain",), _Graphs())
        checkpointed = [g for key, g in self.graphs.items() if key != ("plain",)]
        last = self.graphs.get(self._last_checkpointed, _Graphs())
        # The plain step's graph breaks, then those only the checkpointed step's compile met (a
        # checkpoint Dynamo could not trace runs outside the graph): marked, for the compile check.
        breaks = [f"{reason} ({n}x)" for reason, n in plain.breaks.items()]
        breaks += [f"{CHECKPOINTED_ONLY}{reason} ({n}x)" for reason, n in last.breaks.items() if reason not in plain.breaks]
        random = []
        for g in checkpointed:
            for item in g.backward_random:
                if item not in random:
                    random.append(item)
        return {
            "mode": self.mode,
            "memory_budget": float(self.budget),
            "whole_graph": self.checkpoint not in (Kind.torch, Kind.torch_reentrant),
            "compile_seconds": sum(g.seconds for g in self.graphs.values()),
            "plain_graphs": plain.forward,
            "checkpointed_graphs": last.forward,
            "graph_breaks": breaks,
            "plain_saved": plain.saved,
            "plain_saved_bytes": plain.saved_bytes,
            "last_saved_bytes": self.graphs.get(self._last, _Graphs()).saved_bytes,
            "checkpointed_saved": last.saved,
            "plain_backward_random": len(plain.backward_random),
            "replayed_random": max((g.backward_replayed for g in checkpointed), default=0),
            "recomputed_random": random,
            "eager_compared": bool(self.eager["compared"]),
            "eager_note": self.eager["note"],
            "eager_max_rel": float(self.eager["max_rel"]),
            "eager_worst": self.eager["worst"],
            "eager_tolerance": float(self.eager["tolerance"]),
        }


def _checkpointed(forward, reentrant: bool):
    """A module's forward under torch.utils.checkpoint, as users wrap a block (keyword arguments
    bound with functools.partial under use_reentrant=True, which takes none)."""
    import torch.utils.checkpoint as tc

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        if reentrant:
            return tc.checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=True)
        return tc.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return checkpointed



