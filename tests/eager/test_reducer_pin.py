"""ckcheck's own bucketed all-reduce -- what built-in and TorchScript models train data-parallel with
-- against PyTorch's DistributedDataParallel: each built-in fixture under `--world-size 2` gives the
verdicts, check by check and cause by cause, that its Python twin gives under `--parallel ddp`, with
ckcheck's checkpoint on both sides. The fixtures span a pass (mlp), a model whose dropout keeps it
from one process (transformer), per-shard BatchNorm statistics (convnet: data-parallel and buffers
fail) and a planted RNG hazard (faulty/private-generator)."""

import pytest

from conftest import fixture

FIXTURES = ["mlp", "transformer", "convnet", "faulty/private-generator"]


def causes(check):
    return sorted({(f["cause"], f["site"]) for f in check["findings"]})


@pytest.mark.parametrize("name", FIXTURES)
def test_ckchecks_reducer_gives_the_verdicts_of_ddp_on_the_python_twin(ckcheck, name):
    cpp = ckcheck("run", "--model", name, "--world-size", 2, "--timeout", 120)
    twin = fixture("twins.py:" + name.replace("/", "_").replace("-", "_"))
    ddp = ckcheck("run", "--model", twin, "--checkpoint", "ckcheck", "--parallel", "ddp", "--world-size", 2,
                  "--timeout", 120)
    assert cpp.code == ddp.code, cpp.out + ddp.out + ddp.err
    assert "ckcheck's bucketed all-reduce" in cpp.out and "PyTorch's DistributedDataParallel" in ddp.out
    assert cpp.statuses() == ddp.statuses(), (cpp.out, ddp.out)
    for check in cpp.report["checks"]:
        assert causes(check) == causes(ddp.check(check["id"])), check["id"]
    # The data-parallel comparison covers the same gradients on both sides.
    assert cpp.check("data-parallel")["summary"] == ddp.check("data-parallel")["summary"]


def test_ckchecks_reducer_over_several_steps(ckcheck):
    # One process takes SGD steps world_size times smaller, so every step compares; BatchNorm's
    # per-shard statistics fail it (the negative control).
    r = ckcheck("run", "--model", "mlp", "--world-size", 2, "--steps", 3, "--timeout", 120)
    assert r.code == 0 and r.check("data-parallel")["status"] == "pass", r.out + r.err
    bn = ckcheck("run", "--model", "convnet", "--world-size", 2, "--steps", 3, "--timeout", 120)
    assert bn.check("data-parallel")["status"] == "fail", bn.out + bn.err
