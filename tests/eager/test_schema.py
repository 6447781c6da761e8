"""docs/report.schema.json is the JSON report's contract: it validates every golden report, fresh
reports of each command and of ckcheck.run, names ckcheck's whole cause vocabulary, and rejects
reports that break it."""

import copy
import glob
import json
import os
import subprocess

import jsonschema
import pytest

import ckcheck
from conftest import ROOT, ckcheck_bin, fixture, twin

SCHEMA = json.load(open(os.path.join(ROOT, "docs", "report.schema.json")))
ANY = "\0any"  # a golden's {{any}}: whatever the machine gives


def _golden(text):
    """A golden JSON report with its placeholders outside strings made values: {{num}} a number (1),
    {{any}} a marker the validation accepts anywhere (inside strings they are text already)."""
    out, in_string, i = [], False, 0
    while i < len(text):
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif text.startswith("{{num}}", i):
            out.append("1")
            i += 6
        elif text.startswith("{{any}}", i):
            # Where a key follows, the golden's {{any}} stands for the opening brace of an object.
            rest = text[i + 7:].lstrip()
            opens = rest.startswith('"') and rest.split('"', 2)[2].lstrip().startswith(":")
            out.append("{" if opens else json.dumps(ANY))
            i += 6
        else:
            out.append(c)
        i += 1
    return json.loads("".join(out))


def _real(error):
    """False for an error only an {{any}} marker caused (in some branch of an anyOf, too)."""
    if error.instance == ANY:
        return False
    if error.validator in ("anyOf", "oneOf") and error.context:
        branches = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        return all(any(_real(sub) for sub in branch) for branch in branches.values())
    return True


def _errors(report):
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(report) if _real(e)]


def test_the_schema_is_a_valid_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


GOLDENS = sorted(glob.glob(os.path.join(ROOT, "tests", "reports", "golden", "*.json.golden")))


@pytest.mark.parametrize("path", GOLDENS, ids=os.path.basename)
def test_every_golden_report_follows_the_schema(path):
    assert _errors(_golden(open(path).read())) == []


def test_there_is_a_golden_json_report_of_every_command():
    commands = {_golden(open(p).read())["command"] for p in GOLDENS}
    assert commands == set(SCHEMA["properties"]["command"]["enum"])


def _command(tmp_path, *args):
    path = tmp_path / "r.json"
    subprocess.run([ckcheck_bin(), *args, "--report", f"json={path}"], capture_output=True, timeout=600, cwd=ROOT)
    return json.loads(path.read_text())


@pytest.mark.parametrize("args", [
    ("run", "--model", "transformer", "--no-preserve-rng", "--diagnose"),
    ("diagnose", "--model", "faulty/nan-log"),
    ("bench", "--model", "mlp", "--policies", "none,every:1", "--steps", "2", "--warmup", "1"),
    ("validate-op", "--op", "aten::relu", "--shapes", "4x4"),
    ("run", "--model", fixture("twins.py:faulty_stateful_counter"), "--checkpoint", "torch"),
], ids=["run-diagnose", "diagnose-nan", "bench", "validate-op", "run-python"])
def test_fresh_reports_follow_the_schema(tmp_path, args):
    assert _errors(_command(tmp_path, *args)) == []


def test_a_python_report_follows_the_schema():
    model, x = twin("faulty_stateful_counter")
    report = ckcheck.run(model, (x,), checkpoint="torch")
    assert report.findings and _errors(json.loads(report.to_json())) == []


def test_the_schema_names_the_whole_cause_vocabulary():
    listed = subprocess.run([ckcheck_bin(), "list"], capture_output=True, text=True, timeout=60).stdout
    section = listed.split("Causes (in findings):")[1].split("\n\n")[0]
    causes = [line.split()[0] for line in section.strip().splitlines()]
    assert causes and SCHEMA["$defs"]["cause"]["enum"] == causes


def test_a_report_that_breaks_the_contract_is_rejected(tmp_path):
    """Negative controls: the schema is not vacuous."""
    good = _golden(open(os.path.join(ROOT, "tests", "reports", "golden", "run.json.golden")).read())
    assert _errors(good) == []
    broken = []
    for path, value in ((("verdict",), "passed"), (("checks", 0, "findings", 0, "cause"), "bad-luck"),
                        (("checks", 0, "status"), "ok"), (("tensors", 0, "max_abs"), "big"),
                        (("surprise",), 1)):
        report = copy.deepcopy(good)
        target = report
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        broken.append(report)
    missing = copy.deepcopy(good)
    del missing["reproduce"]
    broken.append(missing)
    for report in broken:
        assert _errors(report), report
