"""Golden verdicts for CI: `ckcheck run --export FILE` writes the verdict and each check's status and
causes; `--baseline FILE` exits 0 exactly when none of them changed (a known failure that stays the
same passes) and 1 when one did, naming what changed.
"""

import json
import os

from conftest import ROOT, ckcheck_bin  # noqa: F401  (the ckcheck fixture runs the binary)


def _export(ckcheck, tmp_path, *args):
    path = tmp_path / "baseline.json"
    r = ckcheck("run", "--model", "mlp", "--dropout", "0.5", *args, "--export", path)
    assert path.exists(), r.out + r.err
    return path, r


def test_an_unchanged_run_passes_and_a_changed_verdict_fails(ckcheck, tmp_path):
    path, r = _export(ckcheck, tmp_path)
    assert r.code == 0, r.out + r.err
    stored = json.loads(path.read_text())
    assert stored["verdict"] == "pass" and stored["baseline"] == 1
    assert {c["id"] for c in stored["checks"]} >= {"gradients", "rng", "determinism"}
    same = ckcheck("run", "--model", "mlp", "--dropout", "0.5", "--baseline", path)
    assert same.code == 0, same.out + same.err
    assert "unchanged" in same.out and same.report["baseline"]["unchanged"] is True
    changed = ckcheck("run", "--model", "mlp", "--dropout", "0.5", "--no-preserve-rng", "--baseline", path)
    assert changed.code == 1, changed.out + changed.err
    changes = changed.report["baseline"]["changes"]
    assert "verdict pass -> fail" in changes and "rng: pass -> fail" in changes, changes
    assert "gradients: causes no cause -> rng" in changes, changes


def test_a_failure_that_stays_the_same_passes_and_another_cause_fails(ckcheck, tmp_path):
    path, r = _export(ckcheck, tmp_path, "--no-preserve-rng")
    assert r.code == 1, r.out + r.err
    same = ckcheck("run", "--model", "mlp", "--dropout", "0.5", "--no-preserve-rng", "--baseline", path)
    assert same.code == 0, same.out + same.err
    assert same.report["verdict"] == "fail"  # the verdict itself is reported as it is
    fixed = ckcheck("run", "--model", "mlp", "--dropout", "0.5", "--baseline", path)
    assert fixed.code == 1, fixed.out  # a fix is a change too: the baseline is to be exported again
    assert "verdict fail -> pass" in fixed.report["baseline"]["changes"]


def test_a_json_report_serves_as_a_baseline(ckcheck, tmp_path):
    report = tmp_path / "full.json"
    r = ckcheck("run", "--model", "transformer", "--no-preserve-rng", "--report", f"json={report}")
    assert r.code == 1
    again = ckcheck("run", "--model", "transformer", "--no-preserve-rng", "--baseline", report)
    assert again.code == 0, again.out + again.err
    other = ckcheck("run", "--model", "transformer", "--baseline", report)
    assert other.code == 1, other.out


def test_bad_baselines_and_clobbering_exports_are_refused(ckcheck, tmp_path):
    not_one = tmp_path / "notes.json"
    not_one.write_text('{"hello": 1}\n')
    r = ckcheck("run", "--model", "mlp", "--baseline", not_one)
    assert r.code == 2 and "not a ckcheck baseline" in r.err, r.err
    missing = ckcheck("run", "--model", "mlp", "--baseline", tmp_path / "absent.json")
    assert missing.code == 2, missing.err
    path, _ = _export(ckcheck, tmp_path)
    before = path.read_text()
    clobber = ckcheck("run", "--model", "mlp", "--baseline", path, "--export", path)
    assert clobber.code == 2 and "overwrite" in clobber.err, clobber.err
    assert path.read_text() == before
    # Negative control: onto another file the export is written.
    other = tmp_path / "other.json"
    ok = ckcheck("run", "--model", "mlp", "--dropout", "0.5", "--baseline", path, "--export", other)
    assert ok.code == 0 and other.exists(), ok.out + ok.err
