"""ckcheck selftest on two DDP ranks (PyTorch's DistributedDataParallel over Gloo on 127.0.0.1): every
rank plants the same bug in lockstep, rank 0 reports; the same mask drawn on every rank is a class
there. Under the reentrant checkpoint every class is live and caught; under the non-reentrant one the
lost gradient and the hook fired twice are dormant (it is immune to both).
"""

import pytest

from conftest import fixture

MODEL = fixture("parallel.py:transformer_dropout")


@pytest.mark.parametrize("checkpoint,dormant", [("torch-reentrant", set()), ("torch", {"lost-gradient", "hook-twice"})])
def test_two_ddp_ranks(ckcheck, checkpoint, dormant):
    r = ckcheck("selftest", "--model", MODEL, "--checkpoint", checkpoint, "--parallel", "ddp", "--world-size", 2,
                "--timeout", 600, "--every-site", timeout=900)
    assert r.report is not None, r.out + r.err
    s = r.report["selftest"]
    assert r.code == 0, r.out + r.err
    assert s["unplanted"]["verdict"] == "pass"
    assert s["caught_share"] >= 0.95 and s["counts"]["false_alarm"] == 0 and s["counts"]["error"] == 0, r.out
    assert {c["plant"] for c in s["cells"] if c["outcome"] == "dormant"} == dormant, r.out
    ranks = [c for c in s["cells"] if c["plant"] == "rank-same-mask"]
    assert len(ranks) == 2 and all(c["outcome"] == "caught" for c in ranks), ranks
