"""The report ckcheck.run and ckcheck.validate_op return: the JSON report's fields as attributes,
its verdict, statuses and causes as the words of C++'s vocabularies (Verdict, Status, Cause)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from ckcheck._core import Status as _CoreStatus, Verdict as _CoreVerdict, cause_names as _cause_names


class _Word(str, enum.Enum):
    """A word of one of ckcheck's vocabularies: equal to its text ("pass" == Verdict.PASS), printed as it."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def _vocabulary(name: str, words) -> type:
    """A _Word enum of `words` (each member named as the word in upper case, '-' as '_')."""
    return _Word(name, {w.upper().replace("-", "_"): w for w in words}, module=__name__, qualname=name)


Verdict = _vocabulary("Verdict", [v.text for v in _CoreVerdict.__members__.values()])
Verdict.__doc__ = "A report's verdict: PASS, FAIL or ERROR (ckcheck._core.Verdict's words)."
Status = _vocabulary("Status", [s.text for s in _CoreStatus.__members__.values()])
Status.__doc__ = "A check's status: PASS, WARN, FAIL, SKIP or ERROR (ckcheck._core.Status's words)."
Cause = _vocabulary("Cause", _cause_names())
Cause.__doc__ = "Why a checkpointed step differs: the words of `ckcheck list`'s causes (RNG, IN_PLACE, ...)."


@dataclass(frozen=True)
class Finding:
    """One thing a check found: where (site), in what (tensor, attribute or op), why (cause, from
    ckcheck's fixed vocabulary) and the one-line fix (hint)."""

    site: str
    cause: Cause
    tensor: str
    message: str
    hint: str
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """One check's result: id ("gradients", "rng", ...), status (Status: "pass", "fail", "warn", "skip",
    "error")."""

    id: str
    status: Status
    summary: str
    findings: tuple = ()
    details: dict = field(default_factory=dict)


def _finding(d: dict) -> Finding:
    return Finding(d.get("site", ""), Cause(d["cause"]), d.get("tensor", ""), d.get("message", ""),
                   d.get("hint", ""), d.get("details", {}))


class Report:
    """A ckcheck report. verdict: "pass", "fail" or "error"; checks: the Check results; findings:
    every check's findings; reproduce: the call that reproduces it; console: the console report's
    text (also str(report)). report["key"] reads the JSON report as a dict; to_dict() and
    to_json() give all of it."""

    def __init__(self, data: dict, console: str):
        self._data = data
        self.console = console

    @property
    def verdict(self) -> Verdict:
        return Verdict(self._data.get("verdict", "error"))

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASS

    @property
    def checks(self) -> list:
        return [Check(c.get("id", ""), Status(c["status"]), c.get("summary", ""),
                      tuple(_finding(f) for f in c.get("findings", [])), c.get("details", {}))
                for c in self._data.get("checks", [])]

    @property
    def findings(self) -> list:
        return [f for c in self.checks for f in c.findings]

    def check(self, id: str) -> Optional[Check]:
        """The result of the check `id`, or None when it did not run."""
        return next((c for c in self.checks if c.id == id), None)

    @property
    def reproduce(self) -> str:
        return self._data.get("reproduce", "")

    @property
    def model(self) -> dict:
        return self._data.get("model", {})

    @property
    def config(self) -> dict:
        return self._data.get("config", {})

    @property
    def tensors(self) -> list:
        return self._data.get("tensors", [])

    @property
    def diagnosis(self) -> Optional[dict]:
        return self._data.get("diagnosis")

    @property
    def selftest(self) -> Optional[dict]:
        """ckcheck.selftest's detection matrix: classes, cells (plant, site, cause, outcome, found,
        reproduce), counts, caught_share and its cost in plain steps; None for other reports."""
        return self._data.get("selftest")

    @property
    def cost(self) -> Optional[dict]:
        """What the check cost in CPU time: "plain_steps", "cpu_seconds", "plain_step_cpu_seconds",
        "phases" (None for a report that does not measure it)."""
        return self._data.get("cost")

    def to_dict(self) -> dict:
        """The JSON report (as `--report json` writes it) with the console text under "console"."""
        return {**json.loads(json.dumps(self._data)), "console": self.console}

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self._data, indent=indent, sort_keys=True)

    # The JSON report as a mapping, as ckcheck.run returned it before the Report type.
    def __getitem__(self, key: str) -> Any:
        return self.console if key == "console" else self._data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.console if key == "console" else self._data.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key == "console" or key in self._data

    def keys(self):
        return [*self._data.keys(), "console"]

    def __str__(self) -> str:
        return self.console

    def __repr__(self) -> str:
        failed = [c.id for c in self.checks if c.status is Status.FAIL]
        return f"<ckcheck.Report {self.verdict}{' ' + ', '.join(failed) if failed else ''}: {self.model.get('name', '')}>"
