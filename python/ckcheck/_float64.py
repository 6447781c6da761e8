"""The float64 rerun's ops: while ckcheck reruns a model's plain and checkpointed steps in float64,
every op computes in float64 -- ops without a float64 kernel (torch._grouped_mm) by their
definition, a cast or a factory asked for a lower precision (x.float(), dtype=torch.bfloat16) in
float64 instead, and a lower-precision tensor that meets a float64 one promoted.

That rerun is ckcheck's evidence that a difference is rounding (it shrinks with the precision) or
real (it keeps its size); a model that pins float32 somewhere, or a Mixture-of-Experts model's
experts, could not be rerun otherwise. Nothing here runs in a checked step.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

_LOWER = (torch.float32, torch.float16, torch.bfloat16)


def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm by its definition: one matrix product per group. offs holds each group's
    end along the dimension it splits (rows of a 2-D mat_a against a 3-D mat_b, columns of a 2-D
    mat_b against a 3-D mat_a, the shared dimension of two 2-D matrices); 3-D with 3-D is a batch."""
    if mat_a.dim() == 3 and mat_b.dim() == 3:
        out = torch.bmm(mat_a, mat_b)
    else:
        ends = [int(e) for e in offs.tolist()]
        starts = [0] + ends[:-1]
        groups = list(enumerate(zip(starts, ends)))
        if mat_a.dim() == 2 and mat_b.dim() == 3:
            out = mat_a.new_zeros(mat_a.shape[0], mat_b.shape[-1])
            for g, (s, e) in groups:
                out[s:e] = mat_a[s:e] @ mat_b[g]
        elif mat_a.dim() == 3 and mat_b.dim() == 2:
            out = mat_a.new_zeros(mat_a.shape[1], mat_b.shape[-1])
            for g, (s, e) in groups:
                out[:, s:e] = mat_a[g] @ mat_b[:, s:e]
        else:
            out = mat_a.new_zeros(len(ends), mat_a.shape[0], mat_b.shape[-1])
            for g, (s, e) in groups:
                out[g] = mat_a[:, s:e] @ mat_b[s:e]
    if bias is not None:
        out = out + bias
    return out if out_dtype is None else out.to(out_dtype)


# Op -> its definition, for ops whose kernels refuse float64.
_BY_DEFINITION = {}
if hasattr(torch.ops.aten, "_grouped_mm"):
    _BY_DEFINITION[torch.ops.aten._grouped_mm] = grouped_mm


def _in_float64(args, kwargs):
    """The call's arguments with every lower floating dtype asked for made float64, and, where a
    float64 tensor is among them, every lower-precision tensor promoted to float64."""
    leaves = pytree.tree_leaves((args, kwargs))
    mixed = any(isinstance(v, torch.Tensor) and v.dtype == torch.float64 for v in leaves)

    def promote(v):
        if isinstance(v, torch.dtype) and v in _LOWER:
            return torch.float64
        if mixed and isinstance(v, torch.Tensor) and v.dtype in _LOWER:
            return v.to(torch.float64)
        return v

    return pytree.tree_map(promote, (args, kwargs))


class ByDefinition(TorchDispatchMode):
    """Below autograd (the forward's and the backward's calls alike): every op computes in float64
    (_in_float64), an op of _BY_DEFINITION by its definition."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        args, kwargs = _in_float64(args, kwargs or {})
        impl = _BY_DEFINITION.get(func.overloadpacket)
        if impl is not None:
            return impl(*args, **kwargs)
        return func(*args, **kwargs)


class Float64Scope:
    """What a float64 rerun holds: the ByDefinition mode, entered on begin() and left on end()."""

    def __init__(self):
        self._mode = None

    def begin(self):
        if self._mode is None:
            self._mode = ByDefinition()
            self._mode.__enter__()

    def end(self):
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
