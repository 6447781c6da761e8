"""ckcheck.run and ckcheck.validate_op call the C++ core with typed options: no command line, no
file, no redirected output; they return a Report and raise UsageError naming the argument."""

import json
import os
import tempfile

import pytest
import torch

import ckcheck
from conftest import factory_result, fixture, twin


def _forbidden(*_, **__):
    raise AssertionError("ckcheck wrote a temporary file")


def _without_redirection(call):
    """call(), failing if it redirects a file descriptor (os.dup2) meanwhile."""
    redirected = []
    dup2 = os.dup2
    os.dup2 = lambda *a, **k: redirected.append(a) or dup2(*a, **k)
    try:
        result = call()
    finally:
        os.dup2 = dup2
    assert redirected == [], f"ckcheck redirected file descriptors: {redirected}"
    return result


def test_the_checkpoint_kind_is_one_vocabulary_for_cpp_and_python():
    from ckcheck._core import CheckpointKind

    for kind in CheckpointKind.__members__.values():
        assert CheckpointKind.parse(kind.text) == kind
    assert CheckpointKind.parse("torch-reentrant") == CheckpointKind.torch_reentrant
    with pytest.raises(ValueError):
        CheckpointKind.parse("torch_reentrant")


def test_the_data_parallel_engine_is_one_vocabulary_for_cpp_and_python():
    from ckcheck._core import ParallelKind

    assert [k.text for k in ParallelKind.__members__.values()] == ["off", "ddp", "fsdp"]
    for kind in ParallelKind.__members__.values():
        assert ParallelKind.parse(kind.text) == kind
    with pytest.raises(ValueError):
        ParallelKind.parse("FSDP")


def test_verdict_status_and_cause_are_the_cores_words_typed():
    from ckcheck import _core

    assert [v.text for v in _core.Verdict.__members__.values()] == [v.value for v in ckcheck.Verdict]
    assert [s.text for s in _core.Status.__members__.values()] == [s.value for s in ckcheck.Status]
    assert set(_core.cause_names()) == {c.value for c in ckcheck.Cause}
    assert ckcheck.Cause("rng") is ckcheck.Cause.RNG and ckcheck.Cause("in-place") is ckcheck.Cause.IN_PLACE
    assert ckcheck.Verdict.PASS == "pass" and f"{ckcheck.Status.WARN}" == "warn" and str(ckcheck.Verdict.FAIL) == "fail"
    with pytest.raises(ValueError):
        ckcheck.Cause("no-such-cause")  # a word outside the vocabulary is refused, not carried
    model, x = twin("faulty_private_generator")
    report = ckcheck.run(model, (x,), checkpoint="torch")
    assert report.verdict is ckcheck.Verdict.FAIL and not report.passed
    assert {type(c.status) for c in report.checks} == {ckcheck.Status}
    assert report.findings and all(isinstance(f.cause, ckcheck.Cause) for f in report.findings)
    assert ckcheck.Cause.RNG in {f.cause for f in report.findings}
    model, x = twin("mlp")
    clean = ckcheck.run(model, (x,), checkpoint="torch")
    assert clean.verdict is ckcheck.Verdict.PASS and clean.passed  # the negative control


def test_run_makes_no_file_and_leaves_stdout_alone(tmp_path, monkeypatch, capfd):
    model, x = twin("faulty_stateful_counter")
    work, temp = tmp_path / "work", tmp_path / "temp"
    work.mkdir()
    temp.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    for name in ("TemporaryFile", "NamedTemporaryFile", "TemporaryDirectory", "mkstemp", "mkdtemp"):
        monkeypatch.setattr(tempfile, name, _forbidden)
    stdout = os.sys.stdout
    report = _without_redirection(lambda: ckcheck.run(model, (x,), checkpoint="torch"))
    assert report.verdict == "fail"  # a real run: its finding below
    assert os.sys.stdout is stdout
    # PyTorch's own cache folder (torchinductor_USER) may appear in TMPDIR; nothing of ckcheck's.
    assert list(work.iterdir()) == [] and [p for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_the_report_has_its_fields_as_attributes():
    model, x = twin("faulty_stateful_counter")
    report = ckcheck.run(model, (x,), checkpoint="torch")
    assert isinstance(report, ckcheck.Report) and not report.passed
    stateful = report.check("stateful") or next(c for c in report.checks if c.status == "fail")
    assert stateful.status == "fail" and stateful.findings
    finding = report.findings[0]
    assert isinstance(finding, ckcheck.Finding)
    assert finding.site == "blocks.1" and finding.cause and finding.hint
    assert str(report) == report.console and "FAIL" in report.console
    data = report.to_dict()
    assert data["verdict"] == "fail" and data["console"] == report.console
    assert json.loads(report.to_json())["checks"] == data["checks"]
    assert report["verdict"] == report.verdict  # the JSON report as a mapping still reads
    assert report.check("no-such-check") is None


def test_a_correct_model_passes_with_attributes():
    model, x = twin("mlp")
    report = ckcheck.run(model, (x,), checkpoint="torch")
    assert report.verdict == "pass" and report.passed and report.findings == []
    assert report.model["name"].endswith(type(model).__qualname__)


def test_the_report_states_what_the_check_cost():
    model, x = twin("mlp")
    report = ckcheck.run(model, (x,), checkpoint="torch")
    cost = report.cost
    assert cost["plain_step_cpu_seconds"] > 0 and cost["plain_steps"] > 0
    assert cost["plain_steps"] == pytest.approx(cost["cpu_seconds"] / cost["plain_step_cpu_seconds"])
    assert [p["part"] for p in cost["phases"]][:2] == ["reference", "checkpointed"]
    assert "cost:" in report.console and "plain steps" in report.console


def test_the_probe_runs_only_where_a_recompute_differed():
    # A correct model: every recompute reproduces its forward, so no unit is run again ...
    model, x = twin("mlp")
    clean = ckcheck.run(model, (x,), checkpoint="torch")
    parts = lambda report: [p["part"] for p in report.cost["phases"]]  # noqa: E731
    assert "probe" not in parts(clean)
    assert "reproduce" in clean.check("determinism").summary
    # ... unless asked (the negative control: the probe phase is there when it runs).
    every = ckcheck.run(model, (x,), checkpoint="torch", probe_every_unit=True)
    assert "probe" in parts(every) and every.check("determinism").status == "pass"
    # A stateful unit's recompute differs: it is probed and classified as before.
    model, x = twin("faulty_stateful_counter")
    faulty = ckcheck.run(model, (x,), checkpoint="torch")
    assert "probe" in parts(faulty)
    assert faulty.check("determinism").status == "fail"
    assert {f.cause for f in faulty.check("determinism").findings} == {"stateful"}


def test_options_by_keyword_are_the_command_lines_options(request):
    """The binding sets the rows the command line sets: the same options give the same config."""
    command = request.getfixturevalue("ckcheck")  # the ckcheck program (conftest)
    model, x = twin("mlp")
    given = dict(checkpoint="torch", accumulate=2, lr=0.5, restore_buffers=True, input_requires_grad=True,
                 checks=["gradients", "buffers"], amp_error_factor=4.0)
    report = ckcheck.run(model, (x,), **given)
    cli = command("run", "--model", fixture("twins.py:mlp"), "--checkpoint", "torch", "--accumulate", "2", "--lr", "0.5",
                  "--restore-buffers", "--input-requires-grad", "--checks", "gradients,buffers",
                  "--amp-error-factor", "4")
    assert cli.code == 0, cli.out + cli.err
    assert report.verdict == "pass"
    ignore = {"checkpoint_reason"}
    assert {k: v for k, v in report.config.items() if k not in ignore} == \
        {k: v for k, v in cli.report["config"].items() if k not in ignore}
    assert [c.id for c in report.checks] == [c["id"] for c in cli.report["checks"]]
    defaults = ckcheck.run(model, (x,), checkpoint="torch", checks="gradients")
    assert defaults.config["accumulate"] == 1 and defaults.config["restore_buffers"] is False  # control


@pytest.mark.parametrize("given, field, words", [
    (dict(sites=3), "sites", "a string or a list of strings"),
    (dict(accumulate="2"), "accumulate", "a whole number"),
    (dict(seed=-1), "seed", "out of range"),
    (dict(steps=0), "steps", "steps"),
    (dict(amp_error_factor=-1.0), "amp_error_factor", "at least"),
    (dict(restore_buffers="yes"), "restore_buffers", "True or False"),
    (dict(timeout=5), "timeout", "ckcheck run --timeout"),
    (dict(world_size=2), "world_size", "ckcheck run --world-size"),
    (dict(sites="nothing.here"), "sites", "matches no site"),
    (dict(no_such_option=1), None, "has no option 'no_such_option'; options: accumulate"),
])
def test_a_bad_argument_is_a_usage_error_naming_it(given, field, words):
    model, x = twin("mlp")
    with pytest.raises(ckcheck.UsageError) as caught:
        ckcheck.run(model, (x,), **given)
    assert caught.value.field == field
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_validate_op_returns_a_report_without_files(monkeypatch):
    for name in ("TemporaryFile", "TemporaryDirectory", "mkstemp", "mkdtemp"):
        monkeypatch.setattr(tempfile, name, _forbidden)
    report = _without_redirection(lambda: ckcheck.validate_op("aten::relu", shapes=[(4, 8)]))
    assert report.verdict == "pass" and report.model["name"] == "aten::relu"
    with pytest.raises(ckcheck.UsageError) as caught:
        ckcheck.validate_op("aten::relu", cases=0)
    assert caught.value.field == "cases"


class _Switchy(torch.nn.Module):
    """A model with its own checkpointing switch, as Hugging Face's: a flag its forward reads."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(3))
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self):
        self.gradient_checkpointing = False

    def forward(self, x):
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


@pytest.mark.parametrize("switched_on", [False, True])
def test_the_models_own_switch_is_left_as_it_was(switched_on):
    # ckcheck turns the switch on for the checkpointed step; the user's model must come back with
    # its switch as the user set it (a later step, or a later check, trains that program).
    torch.manual_seed(0)
    model, x = _Switchy(), torch.randn(4, 8)
    model.gradient_checkpointing = switched_on
    report = ckcheck.run(model, (x,), checkpoint="model")
    assert report.verdict == "pass"
    assert model.gradient_checkpointing is switched_on


@pytest.mark.parametrize("kind", ["scalar", "mode"])
def test_the_shared_tensors_of_numbers_and_flags_keep_their_values(kind):
    # The adapter reads each number or flag of the model's state as one 0-d tensor shared by every
    # read of that value; a reader that wrote into it would change what later reads of the same
    # number compare. After a failing run (the recompute counts again), every one still holds its
    # number.
    from ckcheck import _state

    model, x = factory_result("state_kinds.py", kind)
    report = ckcheck.run(model, (x,), checkpoint="torch")
    assert report.verdict == "fail"
    assert _state._scalar_tensors, "the run read no number or flag"
    for (kind_of, value), tensor in _state._scalar_tensors.items():
        expected = float.fromhex(value) if kind_of is float else value
        assert tensor.item() == expected, (kind_of, value, tensor)


HOST_RANDOM_FACTORY = '''
import random

import numpy
import torch


def make():
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.add_(torch.tensor(numpy.random.standard_normal((4, 4)), dtype=torch.float32))
        model.bias.fill_(random.random())
    return model, torch.ones(2, 4)
'''


def test_seed_makes_the_weights_a_factory_draws_from_python_and_numpy(tmp_path):
    # A factory named on the command line draws from Python's and NumPy's global generators too:
    # --seed makes the same model again (the report's reproduce line), another seed another one.
    from ckcheck import _model

    path = tmp_path / "host_random.py"
    path.write_text(HOST_RANDOM_FACTORY)

    def weights(seed):
        adapter = _model.load(f"{path}:make", seed, {}, "torch", "train")
        return [p.detach().clone() for p in adapter.module.parameters()]

    first, again, other = weights(5), weights(5), weights(6)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


def test_a_protection_the_checkpoint_under_test_lacks_is_refused_not_ignored():
    """--no-preserve-rng under the model's own switch, or a setting only ckcheck's checkpoint has
    under torch's, would change nothing: a UsageError says so. The same settings where they hold run."""
    pytest.importorskip("transformers")
    made = factory_result("tiny_gpt2.py", "make_model")
    model, inputs = made["model"], made["inputs"]
    with pytest.raises(ckcheck.UsageError, match="preserve_rng_state in its switch"):
        ckcheck.run(model, inputs, checkpoint="model", preserve_rng_state=False)
    assert ckcheck.run(model, inputs, checkpoint="torch", preserve_rng_state=False).verdict is ckcheck.Verdict.FAIL
    mlp, x = twin("mlp")
    with pytest.raises(ckcheck.UsageError, match="--recompute-fp32 is a setting of ckcheck's own checkpoint"):
        ckcheck.run(mlp, (x,), checkpoint="torch", recompute_fp32=True)
    assert ckcheck.run(mlp, (x,), checkpoint="ckcheck", recompute_fp32=True).passed
