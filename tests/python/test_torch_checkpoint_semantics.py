"""What torch.utils.checkpoint (the installed torch 2.x) does in the cases where checkpointing goes
wrong silently, in both modes, each compared with the same computation without checkpointing.

The outcome of each case is asserted, so that the table of docs/cpp.md ("The checkpoint's
contract, and where it differs from PyTorch's") stays what this test measures; ckcheck's own column is asserted by the C++ tests named in
that table (tests/harness/checkpoint_test.cpp, checkpoint_conformance_test.cpp).

    .venv/bin/python -m pytest tests/python/test_torch_checkpoint_semantics.py -q
    .venv/bin/python tests/python/test_torch_checkpoint_semantics.py     # prints the table
"""
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

MODES = ["reentrant", "non-reentrant"]


def call(fn, x, mode):
    if mode == "plain":
        return fn(x)
    return checkpoint(fn, x, use_reentrant=(mode == "reentrant"))


def outcome(case, mode):
    """Runs a case; returns its result word, or 'error' / 'warning' with the first message line."""
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = case(mode)
        except RuntimeError as e:
            return "error", str(e).splitlines()[0]
    notes = [str(w.message) for w in caught if "checkpoint" in str(w.message) or "requires_grad" in str(w.message)]
    return result, (notes[0] if notes else "")


def dropout_replay(mode):
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    fn = lambda t: nn.functional.dropout(lin(t), 0.5, True)
    torch.manual_seed(1)
    call(fn, x, "plain").sum().backward()
    want, x.grad = x.grad.clone(), None
    torch.manual_seed(1)
    call(fn, x, mode).sum().backward()
    return "same" if torch.equal(want, x.grad) else "different"


def input_changed_in_place(mode):
    lin = nn.Linear(8, 8)
    x0 = torch.randn(4, 8, requires_grad=True)

    def grads(m):
        x = x0 * 1.0
        y = call(lambda t: lin(torch.tanh(t)), x, m)
        x.mul_(2)  # after the forward, before the backward: plain autograd does not need x
        lin.zero_grad()
        y.sum().backward()
        return lin.weight.grad.clone()

    return "same" if torch.equal(grads("plain"), grads(mode)) else "different"


def no_input_requires_grad(mode):
    lin = nn.Linear(8, 8)
    y = call(lin, torch.randn(4, 8), mode)
    if not y.requires_grad:
        return "no parameter gradients"
    y.sum().backward()
    return "parameters get gradients" if lin.weight.grad is not None else "no parameter gradients"


def output_view_changed_in_place(mode):
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)

    def grads(m):
        x.grad = None
        y = call(lambda t: lin(t)[:2], x, m)
        y.mul_(3)
        y.sum().backward()
        return x.grad.clone()

    return "same" if torch.equal(grads("plain"), grads(mode)) else "different"


def batchnorm_twice(mode):
    bn = nn.BatchNorm1d(8)
    call(bn, torch.randn(4, 8, requires_grad=True), mode).sum().backward()
    return f"running statistics updated {int(bn.num_batches_tracked)}x"


def grad_of_input(mode):
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    torch.autograd.grad(call(lin, x, mode).sum(), x)
    return "parameters' .grad filled" if lin.weight.grad is not None else "exact"


def backward_with_inputs(mode):
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    call(lin, x, mode).sum().backward(inputs=[x])
    return "parameters' .grad filled" if lin.weight.grad is not None else "exact"


def double_backward(mode):
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)

    def second(m):
        g, = torch.autograd.grad(call(lambda t: torch.tanh(lin(t)), x, m).sum(), x, create_graph=True)
        gg, = torch.autograd.grad(g.sum(), x)
        return gg

    return "same" if torch.allclose(second("plain"), second(mode)) else "different"


def captured_tensor(mode):
    stem, lin = nn.Linear(8, 8), nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)

    def grads(m):
        stem.zero_grad()
        h = stem(x)  # read inside the checkpointed function without being passed, and used after it
        y = call(lambda t: lin(t) * h, x, m)
        (y + h).sum().backward()
        return stem.weight.grad.clone()

    return "same" if torch.equal(grads("plain"), grads(mode)) else "different"


# (case, {mode: expected result}); "error" means PyTorch raises, with the message in the table.
EXPECTED = [
    (dropout_replay, {"reentrant": "same", "non-reentrant": "same"}),
    (input_changed_in_place, {"reentrant": "error", "non-reentrant": "error"}),
    (no_input_requires_grad, {"reentrant": "no parameter gradients", "non-reentrant": "parameters get gradients"}),
    (output_view_changed_in_place, {"reentrant": "error", "non-reentrant": "same"}),
    (batchnorm_twice, {"reentrant": "running statistics updated 2x", "non-reentrant": "running statistics updated 2x"}),
    (grad_of_input, {"reentrant": "error", "non-reentrant": "exact"}),
    (backward_with_inputs, {"reentrant": "error", "non-reentrant": "exact"}),
    (double_backward, {"reentrant": "error", "non-reentrant": "same"}),
    (captured_tensor, {"reentrant": "error", "non-reentrant": "same"}),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case,expected", EXPECTED, ids=[c.__name__ for c, _ in EXPECTED])
def test_torch_checkpoint_behaves_as_the_table_says(case, expected, mode):
    result, note = outcome(case, mode)
    assert result == expected[mode], f"{case.__name__} under use_reentrant={mode == 'reentrant'}: {result} ({note})"


@pytest.mark.parametrize("case", [c for c, _ in EXPECTED], ids=[c.__name__ for c, _ in EXPECTED])
def test_plain_autograd_is_the_reference(case):
    # The negative control: without checkpointing every case runs and (where it compares) agrees.
    result, note = outcome(case, "plain")
    assert result != "error", note
    assert result not in ("different", "no parameter gradients", "parameters' .grad filled"), result


def main():
    print(f"torch {torch.__version__}")
    print("| case | use_reentrant=True | use_reentrant=False |")
    print("|---|---|---|")
    for case, _ in EXPECTED:
        cells = []
        for mode in MODES:
            result, note = outcome(case, mode)
            cells.append(f"{result}: {note}" if result == "error" else result)
        print(f"| {case.__name__} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
