"""What a recompute touches besides the modules' state: module-level variables of the model's code
written again (a loss tracker appended to, a counter counted up) and a list argument consumed by
the forward. Truth comes from PyTorch alone: the model stepped plainly and with
torch.utils.checkpoint on each block, from the same state, and what differs between the two."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from conftest import fixture, fixture_module

FILE = "side_effects.py"


def pytorch_step(module, make, checkpointed):
    """One step of the factory's model, plain or with every block checkpointed (non-reentrant), from
    fresh module-level state: (the module-level variables after it, the parameters' gradients)."""
    module.TRACKER["aux"].clear()
    module.STATS.clear()
    module.CALLS = 0
    torch.manual_seed(0)
    made = make()
    model, args = (made["model"], made["args"]) if isinstance(made, dict) else (made[0], (made[1],))
    if checkpointed:
        for block in model.blocks:
            forward = block.forward
            block.forward = lambda *a, f=forward: checkpoint(f, *a, use_reentrant=False)
    model(*args).sum().backward()
    variables = (len(module.TRACKER["aux"]), dict(module.STATS), module.CALLS)
    return variables, [p.grad.clone() for p in model.parameters()]


def pytorch_truth(name):
    """(module-level state differs, gradients differ) between PyTorch's plain and checkpointed step."""
    module = fixture_module(FILE)
    make = getattr(module, name)
    plain_vars, plain_grads = pytorch_step(module, make, False)
    ck_vars, ck_grads = pytorch_step(module, make, True)
    return plain_vars != ck_vars, not all(torch.equal(a, b) for a, b in zip(plain_grads, ck_grads))


def findings(run, check_id):
    return run.check(check_id)["findings"]


@pytest.mark.parametrize("name,variable,line", [("aux_tracker", "TRACKER", "TRACKER[\"aux\"].append"),
                                                ("counter", "CALLS", "CALLS += 1")])
def test_a_variable_the_recompute_writes_again_fails_side_effects_with_site_and_line(ckcheck, name, variable, line):
    state_differs, grads_differ = pytorch_truth(name)
    assert state_differs and not grads_differ  # PyTorch: the variable alone differs
    r = ckcheck("run", "--model", fixture(f"{FILE}:{name}"), "--checkpoint", "torch")
    assert r.code == 1, r.out + r.err
    check = r.check("side-effects")
    assert check["status"] == "fail", check
    (f,) = findings(r, "side-effects")
    assert f["cause"] == "side-effect" and f["site"] == "blocks.1", f
    assert f["tensor"] == f"{FILE}:{variable}", f
    file, number = f["details"]["written_at"].split(":")
    source = open(fixture(FILE)).read().splitlines()
    assert file == FILE and line in source[int(number) - 1], f
    assert r.check("gradients")["status"] == "pass"
    assert r.check("buffers")["status"] == "pass"  # the modules' own state is equal


@pytest.mark.parametrize("name", ["aux_by_key", "aux_in_parent", "counter_in_parent"])
def test_writes_the_recompute_repeats_alike_or_does_not_make_pass(ckcheck, name):
    state_differs, grads_differ = pytorch_truth(name)
    assert not state_differs and not grads_differ
    r = ckcheck("run", "--model", fixture(f"{FILE}:{name}"), "--checkpoint", "torch")
    assert r.code == 0, r.out + r.err
    assert r.check("side-effects")["status"] == "pass"


@pytest.mark.parametrize("checkpoint_kind", ["ckcheck", "torch"])
def test_the_same_variable_without_checkpoints_passes_and_each_checkpoint_is_caught(ckcheck, checkpoint_kind):
    r = ckcheck("run", "--model", fixture(f"{FILE}:aux_tracker"), "--checkpoint", checkpoint_kind, "--policy", "none")
    assert r.check("side-effects")["status"] == "pass", r.out
    r = ckcheck("run", "--model", fixture(f"{FILE}:aux_tracker"), "--checkpoint", checkpoint_kind)
    assert r.check("side-effects")["status"] == "fail", r.out


@pytest.mark.parametrize("name,checkpoint_kind", [("list_pop", "torch"), ("list_parent_pops", "torch"),
                                                   ("list_pop", "ckcheck")])
def test_a_list_argument_consumed_before_the_recompute_fails_with_the_arguments_named(ckcheck, name,
                                                                                      checkpoint_kind):
    _, grads_differ = pytorch_truth(name)
    assert grads_differ  # PyTorch: the recompute reads the next item, silently
    r = ckcheck("run", "--model", fixture(f"{FILE}:{name}"), "--checkpoint", checkpoint_kind)
    assert r.code == 1, r.out + r.err
    assert r.check("gradients")["status"] == "fail"
    mutation = findings(r, "input-mutation")
    assert {f["site"] for f in mutation} == {"blocks.0", "blocks.1"}, mutation
    assert all(f["cause"] == "in-place" and f["tensor"] == "arguments" for f in mutation), mutation
    assert all(g["cause"] == "in-place" for g in findings(r, "gradients")), findings(r, "gradients")


def test_a_list_argument_read_by_index_passes(ckcheck):
    _, grads_differ = pytorch_truth("list_index")
    assert not grads_differ
    r = ckcheck("run", "--model", fixture(f"{FILE}:list_index"), "--checkpoint", "torch")
    assert r.code == 0, r.out + r.err


def test_module_variables_are_as_the_model_left_them_after_a_run():
    import ckcheck

    module = fixture_module(FILE)
    marker = torch.zeros(())
    module.TRACKER["aux"][:] = [marker]
    module.CALLS = 5
    model, x = module.aux_tracker()
    report = ckcheck.run(model, (x,), checkpoint="torch")
    assert report.verdict == "fail"  # through the Python API too, from a module loaded without sys.modules
    assert module.CALLS == 5
    assert module.TRACKER["aux"] == [marker] and module.TRACKER["aux"][0] is marker


DATA_FACTORY = '''
import torch
from torch import nn

DATA = torch.zeros(1 << 21)  # a dataset kept at module level: data, not state
SEEN = [0]  # read by the blocks, never written


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x) + SEEN[0] + DATA[0]
        return x


def make():
    return Net(), torch.randn(2, 4)
'''


def test_module_level_data_and_unwritten_variables_are_not_compared(ckcheck, tmp_path):
    path = tmp_path / "data_factory.py"
    path.write_text(DATA_FACTORY)
    r = ckcheck("run", "--model", f"{path}:make", "--checkpoint", "torch")
    assert r.code == 0, r.out + r.err
    assert r.check("side-effects")["status"] == "pass"
    assert not [t for t in r.report["tensors"] if t["kind"] == "global"], r.report["tensors"]
