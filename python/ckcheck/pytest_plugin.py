"""ckcheck's pytest plugin (entry point pytest11, on once the package is installed).

A marker checks a model factory before the test runs; a fixture checks a model inside it. Either
fails the test with ckcheck's console report as the message:

    @pytest.mark.ckcheck(factory=make_model, checkpoint="torch")   # or factory="pkg.models:make_model"
    def test_checkpointing_changes_nothing():
        ...

    def test_my_block(ckcheck_equivalent):
        ckcheck_equivalent(model, (x,), checkpoint="torch-reentrant")

factory: what `ckcheck run --model` takes -- a callable returning an nn.Module, (module, inputs[,
loss]) or a dict with model and any of inputs, args, kwargs, loss, enable, disable -- or its
"package.module:callable" / "FILE.py:callable" name. The other keywords are ckcheck.run's.
"""

from __future__ import annotations

import pytest

import ckcheck

MARKER = "ckcheck(factory=..., **options): check that checkpointing the model the factory makes changes " \
         "nothing (ckcheck.check_factory) before the test runs; the test fails with ckcheck's report"


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)


def _fail_unless_equivalent(report):
    if report.verdict != "pass":
        pytest.fail(report.console, pytrace=False)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    for marker in item.iter_markers(name="ckcheck"):
        options = dict(marker.kwargs)
        if marker.args:
            if "factory" in options or len(marker.args) > 1:
                pytest.fail("@pytest.mark.ckcheck takes one factory (positional or factory=) and ckcheck.run's "
                            "keywords", pytrace=False)
            options["factory"] = marker.args[0]
        if "factory" not in options:
            pytest.fail("@pytest.mark.ckcheck needs factory= (a callable or 'package.module:callable')",
                        pytrace=False)
        try:
            report = ckcheck.check_factory(options.pop("factory"), **options)
        except ckcheck.UsageError as e:
            pytest.fail(f"ckcheck: {e}", pytrace=False)
        _fail_unless_equivalent(report)


@pytest.fixture
def ckcheck_equivalent():
    """ckcheck_equivalent(model, inputs=None, **options): ckcheck.run on the model; the test fails
    with the console report unless checkpointing changes nothing. Returns the Report."""

    def check(model, inputs=None, **options):
        return _fail_unless_equivalent(ckcheck.run(model, inputs, **options))

    return check
