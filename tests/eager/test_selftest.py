"""ckcheck selftest in one process: each class of bug planted into a model and configuration, and
the detection matrix. On the built-in transformer, a Hugging Face decoder (GPT-2), a timm model and a
TorchScript file, at least 95% of the live cells are caught with the right cause, the unplanted
model passes, and the cost is stated; a configuration whose checks cannot see a class (the hooks
check left out) misses it and the selftest fails -- the negative control.
"""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, fixture


def _matrix(r):
    assert r.report is not None, r.out + r.err
    s = r.report["selftest"]
    live = s["counts"]["caught"] + s["counts"]["other_cause"] + s["counts"]["missed"]
    return s, live


def _sound(r, live_at_least):
    s, live = _matrix(r)
    assert r.code == 0, r.out + r.err
    assert s["unplanted"]["verdict"] == "pass", s["unplanted"]
    assert live >= live_at_least, r.out
    assert s["caught_share"] >= 0.95, r.out
    assert s["counts"]["false_alarm"] == 0 and s["counts"]["error"] == 0, r.out
    return s


def test_the_built_in_transformer_catches_every_class_and_states_its_cost(ckcheck):
    # The cost is reported in plain steps (docs/selftest.md has the figures), never asserted: a
    # timing on a shared CI machine is no test.
    r = ckcheck("selftest", "--model", "transformer")
    s = _sound(r, 5)
    assert s["plain_steps"] > 0, s
    assert "selftest cost:" in r.out and "plain steps" in r.out
    # hook-twice is dormant under ckcheck's own checkpoint: its node fires a hook once per backward.
    assert {c["plant"] for c in s["cells"] if c["outcome"] == "dormant"} <= {"hook-twice"}, r.out


def test_under_amp_at_every_site_autocast_lost_is_planted_and_caught(ckcheck):
    r = ckcheck("selftest", "--model", "transformer", "--amp", "bf16", "--every-site")
    s = _sound(r, 12)
    autocast = [c for c in s["cells"] if c["plant"] == "autocast-lost"]
    assert autocast and all(c["outcome"] == "caught" for c in autocast), autocast


@pytest.mark.parametrize("checkpoint,dormant", [("torch-reentrant", set()),
                                                ("model", {"lost-gradient", "hook-twice"})])
def test_a_hugging_face_decoder(ckcheck, checkpoint, dormant):
    r = ckcheck("selftest", "--model", fixture("tiny_gpt2.py"), "--checkpoint", checkpoint, "--every-site")
    s = _sound(r, 8)
    # The non-reentrant switch keeps what a reentrant checkpoint loses: those plants change nothing.
    assert {c["plant"] for c in s["cells"] if c["outcome"] == "dormant"} == dormant, r.out


def test_a_timm_model(ckcheck):
    r = ckcheck("selftest", "--model", fixture("vision.py:timm_convnext"), "--checkpoint", "torch-reentrant")
    _sound(r, 6)


def test_a_torchscript_model(ckcheck, tmp_path):
    made = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "python", "make_torchvision_models.py"),
                           str(tmp_path)], capture_output=True, text=True)
    if made.returncode == 77:
        pytest.skip(made.stdout)
    assert made.returncode == 0, made.stderr
    r = ckcheck("selftest", "--model", tmp_path / "vit.pt", "--input-shape", "2x3x32x32",
                "--sites", "encoder.layers.*", "--every-site")
    _sound(r, 10)


def test_a_class_the_checks_cannot_see_is_missed_and_fails_the_selftest(ckcheck):
    """Without the hooks check, a gradient hook fired twice changes no value: missed, exit 1, and the
    report names the cell with the command that plants it alone."""
    r = ckcheck("selftest", "--model", fixture("tiny_gpt2.py"), "--checkpoint", "torch-reentrant",
                "--checks", "gradients,buffers,rng", "--plants", "hook-twice,rng-not-replayed")
    s, _ = _matrix(r)
    assert r.code == 1, r.out + r.err
    outcomes = {c["plant"]: c["outcome"] for c in s["cells"]}
    assert outcomes == {"hook-twice": "missed", "rng-not-replayed": "caught"}, outcomes
    missed = next(c for c in s["cells"] if c["plant"] == "hook-twice")
    assert "--plant hook-twice@" in missed["reproduce"]
    assert f"missed hook-twice at {missed['site']}" in r.out


def test_the_python_api(tmp_path):
    import torch

    import ckcheck
    from conftest import factory_result

    made = factory_result("tiny_gpt2.py", "make_model")
    model, inputs = (made["model"], made["inputs"]) if isinstance(made, dict) else made
    r = ckcheck.selftest(model, inputs, checkpoint="torch-reentrant", plants=["lost-gradient", "input-in-place"])
    assert r.verdict == "pass", str(r)
    assert {c["plant"]: c["outcome"] for c in r.selftest["cells"]} == {"lost-gradient": "caught",
                                                                        "input-in-place": "caught"}
    assert r.reproduce.startswith("ckcheck.selftest(model, inputs")
    with pytest.raises(ckcheck.UsageError) as e:
        ckcheck.selftest(model, inputs, plants="no-such-bug")
    assert e.value.field == "plants"
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("args,message", [
    (["--plant", "nope@blocks.0"], "give CLASS@SITE"),
    (["--plant", "rng-not-replayed@no.such.site"], "has no site"),
    (["--plant", "rng-not-replayed"], "give CLASS@SITE"),
])
def test_a_bad_plant_is_refused(ckcheck, args, message):
    r = ckcheck("run", "--model", "transformer", *args)
    assert r.code == 2 and message in r.err, r.err


def test_run_plant_reports_the_plant(ckcheck):
    r = ckcheck("run", "--model", "transformer", "--plant", "state-twice@blocks.1")
    assert r.code == 1, r.out
    assert r.report["plant"] == {"plant": "state-twice", "site": "blocks.1", "cause": "buffer-update", "manifest": True}
    assert "--plant state-twice@blocks.1" in r.report["reproduce"]
