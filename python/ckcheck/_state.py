"""Values that are state: how ckcheck tells a model's state from the rest of what it holds (numbers,
flags, strings, tensors that are no parameters, generators, and lists, tuples and dicts of those),
copies it, flattens it into named tensors for the runner, and puts it back -- for module attributes
and module-level variables alike."""

from __future__ import annotations

import copy
import random
import sys

import torch

_SCALARS = (bool, int, float, str, type(None))


def _kept_in(value):
    """The lists, dicts and objects `value` is or holds, tuples opened. Tensors and modules are not
    opened (the model's own state is snapshotted apart); nor are callables. At most _HANDED_MAX."""
    found, seen, todo = [], set(), [value]
    while todo and len(found) < _HANDED_MAX:
        v = todo.pop()
        if isinstance(v, tuple):
            todo.extend(v)
            continue
        if id(v) in seen or not _kept_state(v):
            continue
        seen.add(id(v))
        found.append(v)
        held = _held(v)
        todo.extend(held if isinstance(held, list) else held.values())
    return found


_HANDED_MAX = 10000


def _kept_state(v):
    """Whether a call may keep state in `v`: a list, a dict, or an object with attributes of its
    own that is no tensor, module, class or callable."""
    if isinstance(v, (list, dict)):
        return True
    if isinstance(v, (torch.Tensor, torch.nn.Module, type)) or callable(v):
        return False
    return isinstance(getattr(v, "__dict__", None), dict)


def _held(v):
    """What a list, dict or object holds: the list itself, the dict itself, the object's attributes."""
    return v if isinstance(v, (list, dict)) else vars(v)


def _held_digest(kept):
    """A digest of what lists, dicts and objects hold: which items, by identity, and each tensor's
    version (the snapshot that holds the old items keeps their identities from being reused)."""
    parts = []
    for c in kept:
        held = _held(c)
        items = enumerate(held) if isinstance(held, list) else held.items()
        parts.append(tuple((k, id(v), _version_of(v)) for k, v in items))
    return str(hash(tuple(parts)))


def _version_of(v):
    """A tensor's version counter (-1 for anything else, and for an inference tensor, which keeps none)."""
    try:
        return v._version if isinstance(v, torch.Tensor) else -1
    except RuntimeError:
        return -1


def _container_contents(kept):
    """What each list, dict or object holds now (its items or attributes, not copies of them), to
    be put back."""
    return [(c, list(_held(c)) if isinstance(c, list) else dict(_held(c))) for c in kept]


def _put_back_contents(contents):
    for c, items in contents:
        held = _held(c)
        if isinstance(held, list):
            held[:] = items
        else:
            held.clear()
            held.update(items)


class _GeneratorState:
    """A generator attribute's state (torch.Generator, random.Random, NumPy's Generator or
    RandomState), put back into the same generator."""

    def __init__(self, generator):
        self.state = _generator_state(generator)

    def put_back(self, generator):
        if isinstance(generator, torch.Generator):
            generator.set_state(self.state)
        elif isinstance(generator, random.Random):
            generator.setstate(self.state)
        elif hasattr(generator, "bit_generator"):
            generator.bit_generator.state = self.state
        else:
            generator.set_state(self.state)


def _host_generator(value):
    """True for a generator outside torch: Python's random.Random, NumPy's Generator or RandomState."""
    if _plain_scalar(value):
        return False
    if isinstance(value, random.SystemRandom):  # the system's entropy: no state to keep or compare
        return False
    if isinstance(value, random.Random):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, (numpy.random.Generator, numpy.random.RandomState))


def _is_generator(value):
    """A torch.Generator or a generator outside torch: state put back into the same object."""
    return isinstance(value, torch.Generator) or _host_generator(value)


def _generator_state(generator):
    if isinstance(generator, torch.Generator):
        return generator.get_state()
    if isinstance(generator, random.Random):
        return generator.getstate()
    if hasattr(generator, "bit_generator"):
        return copy.deepcopy(generator.bit_generator.state)
    return generator.get_state()


def _state_digest(state):
    """A string that changes whenever the generator whose state this is draws."""
    if isinstance(state, tuple) and state and isinstance(state[0], str):  # RandomState's (kind, keys, pos, ...)
        kind, keys, pos, has_gauss, cached = state[:5]
        return f"{kind}:{pos}:{has_gauss}:{cached}:{hash(keys.tobytes())}"
    if isinstance(state, dict):  # a NumPy bit generator's: numbers
        return repr(state)
    return str(hash(state))  # Python's random: a tuple of ints


def _is_state_value(value, depth=0):
    if _plain_scalar(value):  # most attributes: decided without the isinstance checks below
        return True
    if _is_generator(value):
        return depth == 0
    if isinstance(value, torch.Tensor):
        return not isinstance(value, torch.nn.Parameter)
    if isinstance(value, _SCALARS):
        return True
    if depth < 3 and isinstance(value, (tuple, list)):
        return all(_is_state_value(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return all(isinstance(k, _SCALARS) and _is_state_value(v, depth + 1) for k, v in value.items())
    return False


def _copy_value(value, keep=None):
    """A copy of a state value; `keep` ({id: object}): objects a container holds that the copy
    holds too rather than copies of (the model's parameters and buffers)."""
    if _plain_scalar(value):  # immutable: the value itself
        return value
    if _is_generator(value):
        return _GeneratorState(value)
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return copy.deepcopy(value, dict(keep or {}))


def _put_back_into(held, value, keep):
    """`held` (the tensor, dict or list the model held) made to hold `value` again in place, so that
    what else holds it (a block given the parent's workspace, a closure) sees the model's own;
    False where it cannot (another shape or type, a tensor that cannot be written)."""
    if isinstance(held, torch.Tensor):
        if not isinstance(value, torch.Tensor) or (held.shape, held.dtype, held.device) != (
                value.shape, value.dtype, value.device):
            return False
        try:
            with torch.no_grad():
                held.copy_(value)
        except RuntimeError:  # an inference tensor, a view that cannot be written
            return False
        return True
    if type(held) is not type(value) or not isinstance(held, (dict, list)):
        return False
    if isinstance(held, dict):
        held.clear()
        held.update(_copy_value(value, keep))
    else:
        held[:] = _copy_value(value, keep)
    return True


def _fingerprint(value):
    if _is_generator(value):
        return ("generator", id(value))
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), id(value))
    try:
        return repr(value)
    except Exception:
        return id(value)


# Attributes are read at every step and every checkpointed call: the 0-d tensor of each number
# is made once and shared (its readers copy it, none writes to it). A float is keyed by its bits,
# so that -0.0 and 0.0 stay apart; the table is emptied when it grows past _SCALAR_TENSORS_MAX.
_scalar_tensors = {}


_SCALAR_TENSORS_MAX = 4096


_EXACT_SCALARS = frozenset(_SCALARS)


def _plain_scalar(value):
    """A number, flag, string or None by its exact type (no subclass): immutable state, never a
    generator or a tensor -- decided before any isinstance check, as most attributes are these."""
    return type(value) in _EXACT_SCALARS


def _scalar_tensor(value):
    """The 0-d tensor of a bool (bool), int (int64) or float (float64)."""
    key = (float, value.hex()) if type(value) is float else (type(value), value)
    t = _scalar_tensors.get(key)
    if t is None:
        if len(_scalar_tensors) >= _SCALAR_TENSORS_MAX:
            _scalar_tensors.clear()
        dtype = torch.bool if type(value) is bool else torch.int64 if type(value) is int else torch.float64
        t = _scalar_tensors[key] = torch.tensor(value, dtype=dtype)
    return t


def _flatten_attr(name, value, out):
    if isinstance(value, torch.Generator):
        out.append((name, value.get_state(), "extra"))
    elif isinstance(value, torch.Tensor):
        out.append((name, value, "attribute"))
    elif value is None:
        out.append((name, None, "attribute"))
    elif isinstance(value, bool):
        out.append((name, _scalar_tensor(bool(value)), "scalar"))
    elif isinstance(value, int):
        small = -(2**63) <= value < 2**63
        out.append((name, _scalar_tensor(int(value) if small else hash(value)), "scalar"))
    elif isinstance(value, float):
        out.append((name, _scalar_tensor(float(value)), "scalar"))
    elif isinstance(value, str):
        out.append((name, _scalar_tensor(hash(value) & 0x7FFFFFFFFFFFFFFF), "scalar"))
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _flatten_attr(f"{name}.{i}", v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten_attr(f"{name}.{k}", v, out)


_CLOSURE_ITEMS_MAX = 64  # a cell holding a bigger container is data, not state a forward reads


def _flatten_closure(name, module, out):
    """The tensors and numbers `module`'s forward reaches through its closure cells (a weight an
    inner class of a factory reads, an adapter the model points it at), as _flatten_attr lists
    them, named NAME.forward:VAR (and .KEY below a container)."""
    for f in (vars(module).get("forward"), getattr(type(module), "forward", None)):
        f = getattr(f, "__func__", f)
        cells, code = getattr(f, "__closure__", None), getattr(f, "__code__", None)
        if not cells or code is None:
            continue
        for var, cell in zip(code.co_freevars, cells):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
            if isinstance(value, (tuple, list, dict)) and len(value) > _CLOSURE_ITEMS_MAX:
                continue
            if isinstance(value, (torch.Tensor, tuple, list, dict)):
                _flatten_attr(f"{name}.forward:{var}", value, out)

