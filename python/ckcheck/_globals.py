"""Module-level state of the model's own Python code: the variables of the modules that define the
model's classes (and its factory) -- counters, loss trackers, logs kept in module-level lists and
dicts. A checkpointed site's recompute runs its Python code again, so a write it makes there is
made twice where the plain step makes it once. ckcheck compares these variables after the two
steps as it compares the modules' own state, and puts them back between the steps as it puts the
model back: both steps start from the same values.

Libraries' modules (site-packages, the standard library, torch, ckcheck) are not the model's own
and are left out: their caches fill on first use, which is not the model's state."""

from __future__ import annotations

import contextlib
import os
import re
import sys

import torch

from ckcheck._state import (_GeneratorState, _container_contents, _copy_value, _flatten_attr, _generator_state,
                            _is_generator, _is_state_value, _kept_in, _plain_scalar, _put_back_contents,
                            _state_digest, _version_of)

# The record kind of a module-level variable (harness/include/ckcheck/model.h, state_kind::kGlobal).
GLOBAL_KIND = "global"

_ABSENT = object()


def _library_folders():
    """Where installed and standard modules live: their variables are not the model's."""
    folders = {os.path.dirname(os.__file__), os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__))}
    folders |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return tuple(sorted(os.path.realpath(f) + os.sep for f in folders if f))


def own_namespaces(root, factory=None):
    """The global namespaces (module dicts) of the code that defines the classes of `root`'s
    submodules and of `factory`, leaving out libraries' modules, in a stable order. Read from the
    functions themselves (a module loaded from a file without a sys.modules entry has one too)."""
    functions = [factory] if factory is not None else []
    for cls in dict.fromkeys(type(m) for m in root.modules()):
        module = sys.modules.get(cls.__module__)
        functions += list(vars(cls).values())  # its functions hold their module's namespace
        if module is not None:
            functions.append(getattr(module, "__dict__", None))
    libraries = _library_folders()
    out, seen = [], set()
    for f in functions:
        space = f if isinstance(f, dict) else getattr(f, "__globals__", None)
        if not isinstance(space, dict) or id(space) in seen:
            continue
        seen.add(id(space))
        path = space.get("__file__")
        if isinstance(path, str) and not os.path.realpath(path).startswith(libraries):
            out.append(space)
    return out


class ModuleVariables:
    """The module-level state of some modules' namespaces: listed as named tensors, digested, copied
    and put back."""

    def __init__(self, spaces):
        labels = [os.path.basename(s["__file__"]) for s in spaces]  # a file's name; its module's where two share one
        self._spaces = [(label if labels.count(label) == 1 else s.get("__name__", label), s)
                        for label, s in zip(labels, spaces)]
        self._at_end = dict(self._digests())  # the digests at the end of the last step listed
        self._written = set()  # variables a step has ended with another value: the only ones compared
        self._within = 0  # inside the model's forward (a backward is seen by autograd's graph task)

    @contextlib.contextmanager
    def within_step(self):
        """Around the model's forward: what state_tensors() sees there is not a step's end."""
        self._within += 1
        try:
            yield
        finally:
            self._within -= 1

    def _variables(self):
        """(label, namespace, name, value) of each variable that is state: data (a large tensor or
        list, a dataset a script keeps at module level) is not."""
        for label, space in self._spaces:
            for name, value in list(space.items()):
                if not name.startswith("__") and _small(value) and _is_state_value(value):
                    yield label, space, name, value

    def state_tensors(self, out):
        """Appends (name, tensor, kind) for each variable some step has ended with another value than
        the step before, named "@FILE:NAME" (and ".KEY" within): one no step changes cannot differ
        between two steps. Called as a step ends: a flag a context manager sets and puts back within
        the forward (a precision context's switch) is not state, however often the forward is seen
        with it set."""
        if not self._within and torch._C._current_graph_task_id() == -1:
            now = dict(self._digests())
            self._written.update(k for k, d in now.items() if self._at_end.get(k) != d)
            self._at_end = now
        for label, _, name, value in self._variables():
            if f"{label}:{name}" in self._written:
                flat = []
                _flatten_attr(f"@{label}:{name}", value, flat)
                out.extend((n, t, GLOBAL_KIND) for n, t, _ in flat)

    def digests(self):
        """[("FILE:NAME", digest)]: a digest changes when the variable is rebound, appended to, or a
        tensor in it is written in place."""
        return self._digests()

    def _digests(self):
        return [(f"{label}:{name}", _digest(value)) for label, _, name, value in self._variables()]

    def snapshot(self):
        values = []
        for label, space, name, value in self._variables():
            kept = _copy_value(value) if isinstance(value, torch.Tensor) or _is_generator(value) else None
            values.append((space, name, value, kept))
        contents = _container_contents(c for _, _, value, _ in values if not _plain_scalar(value)
                                       for c in _kept_in(value))
        return values, contents, {label: set(space) for label, space in self._spaces}

    def restore(self, snap):
        values, contents, names = snap
        for label, space in self._spaces:  # variables the step added go again
            for name in set(space) - names[label]:
                if _is_state_value(space[name]):
                    del space[name]
        for space, name, value, kept in values:
            if space.get(name, _ABSENT) is not value:
                space[name] = value
            if isinstance(kept, _GeneratorState):
                kept.put_back(value)
            elif kept is not None:
                with torch.no_grad():
                    value.copy_(kept)
        _put_back_contents(contents)

    def origin(self, name):
        """"FILE:LINE" of the first line inside a function that writes the variable that state entry
        `name` ("@FILE:NAME.KEY") belongs to; "" where none is found."""
        label, _, rest = name.lstrip("@").partition(":")
        variable = rest.split(".", 1)[0]
        path = dict(self._spaces).get(label, {}).get("__file__")
        if not variable or not path:
            return ""
        write = re.compile(r"(?<![\w.])" + re.escape(variable) + r"\s*(\[[^\]]*\]\s*)*"
                           r"(\.\s*(append|extend|insert|update|setdefault|add|pop|clear)\s*\(|[-+*/|&]?=(?!=))")
        try:
            with open(path, encoding="utf-8", errors="replace") as source:
                lines = source.readlines()
        except OSError:
            return ""
        for number, line in enumerate(lines, 1):
            if line[:1].isspace() and write.search(line) and not line.lstrip().startswith(("global ", "#")):
                return f"{os.path.basename(path)}:{number}"
        return ""


# Past these a module-level variable is data, not state: neither digested nor copied at each call.
_LARGE_NUMEL = 1 << 20
_LARGE_LEN = 10000


def _small(value):
    if isinstance(value, torch.Tensor):
        return value.numel() <= _LARGE_NUMEL
    return not isinstance(value, (list, tuple, dict)) or len(value) <= _LARGE_LEN


def _digest(value):
    """What a variable holds, by value for numbers and strings, by identity and version for tensors."""
    if _plain_scalar(value):
        return repr(value)
    if isinstance(value, torch.Tensor):
        return f"tensor:{id(value)}:{_version_of(value)}"
    if _is_generator(value):
        return _state_digest(_generator_state(value))
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_digest(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_digest(v)}" for k, v in value.items()) + "}"
    return repr(value)
