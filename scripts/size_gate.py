#!/usr/bin/env python3
"""The size gate: no function of ckcheck's own code (harness/, checks/, analyses/, reports/,
testing/, cli/, python/; C++ and Python) is longer than 60 lines or more complex than 20
(cyclomatic, as lizard counts it), unless scripts/size_exemptions.txt lists it -- with the size it
had, which it may not outgrow. The list may only shrink: a listed function that fits the limits now,
or is gone, fails the gate until its line is removed. The gate also counts the runs of six or more
lines of the same shape (the same lines, or the same with other names, strings and numbers; blank
lines, comments and lone braces aside) that two places share, against the ceiling the list records,
and prints every figure.

    .venv/bin/python scripts/size_gate.py               # the gate (CTest: size.gate)
    .venv/bin/python scripts/size_gate.py --self-test   # a planted tree gives exactly its faults
    .venv/bin/python scripts/size_gate.py --write       # rewrite the list from the tree as it is

Exit 1 on a violation, 2 when lizard (PyPI, scripts/constraints.txt) is missing."""
from __future__ import annotations

import collections
import csv
import io
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ["harness", "checks", "analyses", "reports", "testing", "cli", "python"]
MAX_LINES = 60
MAX_COMPLEXITY = 20
RUN = 6  # identical lines that make a duplicated run
EXEMPTIONS = "scripts/size_exemptions.txt"
HEADER = f"""# Functions over the size gate's limits ({MAX_LINES} lines, complexity {MAX_COMPLEXITY}), each with the size it
# has: FILE FUNCTION LINES COMPLEXITY. scripts/size_gate.py fails on a function over the limits that is
# not here, on one that outgrew its line, and on a line whose function fits now or is gone: the list
# only shrinks. `duplicate-runs N` is the ceiling of pairs of places sharing {RUN}+ lines of one shape.
"""


def sources(root):
    for folder in FOLDERS:
        for file in sorted((root / folder).glob("**/*")):
            rel = file.relative_to(root).as_posix()
            if file.suffix in (".h", ".cpp", ".cu", ".py") and "/build/" not in rel and "__pycache__" not in rel:
                yield rel


def functions(root, files):
    """{(file, name): (lines, complexity, first line)} as lizard measures them (the largest of
    overloads that share a name)."""
    try:
        import lizard  # noqa: F401
    except ImportError:
        print("size gate: lizard is not installed; run scripts/install-deps.sh (pip install lizard)", file=sys.stderr)
        sys.exit(2)
    out = subprocess.run([sys.executable, "-m", "lizard", "--csv", *files], cwd=root, capture_output=True,
                         text=True, check=False)
    measured = {}
    for row in csv.reader(io.StringIO(out.stdout)):
        if len(row) < 10 or not row[0].isdigit():
            continue
        key = (row[6], row[7])
        size = (int(row[4]), int(row[1]), int(row[9]))
        if key not in measured or size[:2] > measured[key][:2]:
            measured[key] = size
    return measured


def normalized(text):
    """The lines that carry code: stripped, without blank lines, comments and lone braces, each with
    its line number."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(("//", "#", "*", "/*", '"""')) or re.fullmatch(r"[{}()\[\];,]*", s):
            continue
        out.append((number, s))
    return out


KEYWORDS = frozenset("""if else for while do switch case default return break continue try catch throw
    const auto static struct class namespace using template typename public private protected virtual override
    new delete nullptr true false this void bool int def lambda pass raise except finally with as in not and or
    is None True False yield import from elif assert del global nonlocal self""".split())
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|\d[\w.]*|[A-Za-z_]\w*|\S')


def shape(line):
    """The line with other names, strings and numbers: its keywords and punctuation kept."""
    out = []
    for token in TOKEN.findall(line):
        if token[0] in "\"'":
            out.append("S")
        elif token[0].isdigit():
            out.append("0")
        elif token[0].isalpha() or token[0] == "_":
            out.append(token if token in KEYWORDS else "i")
        else:
            out.append(token)
    return " ".join(out)


def duplicate_runs(root, files):
    """Pairs of places that share a run of RUN+ code lines of the same shape (the same lines, or the
    same with other names, strings and numbers), one (file:line, file:line) per pair of files (or
    per run within one file)."""
    windows = collections.defaultdict(list)
    lines = {}
    for rel in files:
        lines[rel] = normalized((root / rel).read_text(errors="replace"))
        shapes = [shape(s) for _, s in lines[rel]]
        for i in range(len(shapes) - RUN + 1):
            windows[hash(tuple(shapes[i:i + RUN]))].append((rel, i))
    pairs = set()
    for places in windows.values():
        if len(places) > 8:
            continue  # boilerplate repeated everywhere (an include block, a table's rows)
        for a in range(len(places)):
            for b in range(a + 1, len(places)):
                (fa, ia), (fb, ib) = places[a], places[b]
                if fa != fb or abs(ia - ib) >= RUN:
                    pairs.add((places[a], places[b]))
    starts = [p for p in pairs if ((p[0][0], p[0][1] - 1), (p[1][0], p[1][1] - 1)) not in pairs]
    first = {}
    for (fa, ia), (fb, ib) in sorted(starts):
        key = (fa, fb) if fa != fb else (fa, ia, ib)
        first.setdefault(key, (f"{fa}:{lines[fa][ia][0]}", f"{fb}:{lines[fb][ib][0]}"))
    return sorted(first.values())


def read_exemptions(path):
    listed, ceiling = {}, None
    if not path.exists():
        return listed, ceiling
    for line in path.read_text().splitlines():
        parts = line.split("#")[0].split()
        if len(parts) == 2 and parts[0] == "duplicate-runs":
            ceiling = int(parts[1])
        elif len(parts) == 4:
            listed[(parts[0], parts[1])] = (int(parts[2]), int(parts[3]))
    return listed, ceiling


def over(size):
    return size[0] > MAX_LINES or size[1] > MAX_COMPLEXITY


def judge(measured, listed, runs, ceiling):
    """The violations, one line each."""
    found = []
    for (file, name), (length, ccn, first) in sorted(measured.items()):
        if not over((length, ccn)):
            continue
        if (file, name) not in listed:
            found.append(f"{file}:{first}: {name} is {length} lines, complexity {ccn} (limits {MAX_LINES}, "
                         f"{MAX_COMPLEXITY}); split it")
        elif length > listed[(file, name)][0] or ccn > listed[(file, name)][1]:
            was = listed[(file, name)]
            found.append(f"{file}:{first}: {name} grew to {length} lines, complexity {ccn}, past its exemption "
                         f"({was[0]}, {was[1]}); split it")
    for (file, name), (length, ccn) in sorted(listed.items()):
        now = measured.get((file, name))
        if now is None or not over(now[:2]):
            state = "is gone" if now is None else f"fits the limits now ({now[0]} lines, complexity {now[1]})"
            found.append(f"{EXEMPTIONS}: {file} {name} {state}; remove its line (the list only shrinks)")
    if ceiling is not None and len(runs) > ceiling:
        found.append(f"{len(runs)} duplicated runs of {RUN}+ lines, over the ceiling of {ceiling}; the newest: "
                     f"{runs[-1][0]} ~ {runs[-1][1]}")
    return found


def figures(measured, runs, listed):
    sizes = list(measured.values())
    return (f"size gate: {len(sizes)} functions; {sum(1 for s in sizes if s[0] > MAX_LINES)} over {MAX_LINES} lines, "
            f"{sum(1 for s in sizes if s[1] > MAX_COMPLEXITY)} over complexity {MAX_COMPLEXITY} (largest "
            f"{max((s[1] for s in sizes), default=0)}), {len(listed)} exempted; {len(runs)} duplicated runs of "
            f"{RUN}+ same-shape lines")


def gate(root):
    files = list(sources(root))
    measured = functions(root, files)
    runs = duplicate_runs(root, files)
    listed, ceiling = read_exemptions(root / EXEMPTIONS)
    found = judge(measured, listed, runs, ceiling)
    return measured, runs, listed, ceiling, found


def write(root):
    files = list(sources(root))
    measured = functions(root, files)
    runs = duplicate_runs(root, files)
    body = [f"{f} {n} {s[0]} {s[1]}" for (f, n), s in sorted(measured.items()) if over(s[:2])]
    (root / EXEMPTIONS).write_text(HEADER + f"duplicate-runs {len(runs)}\n" + "\n".join(body) + "\n")
    print(f"{EXEMPTIONS}: {len(body)} functions, duplicate-runs {len(runs)}")


def self_test():
    """The negative control: a planted tree whose every fault the gate must name, and nothing else."""
    import tempfile
    long_body = "".join(f"  x += {i};\n" for i in range(70))
    grown_body = "".join(f"  x -= y * {i};\n" if i % 2 else f"  y += x;\n" for i in range(70))
    branches = "".join(f"  if (x == {i}) return {i};\n" for i in range(25))
    twin = "".join(f"  int v{i} = x * {i} + {i};\n" for i in range(8))
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        planted = {
            "checks/long.cpp": f"int too_long(int x) {{\n{long_body}  return x;\n}}\n",
            "checks/complex.cpp": f"int too_complex(int x) {{\n{branches}  return 0;\n}}\n",
            "checks/grown.cpp": f"int grown(int x, int y) {{\n{grown_body}  return x;\n}}\n",
            "checks/fits.cpp": "int fits(int x) {\n  return x;\n}\n",
            "reports/a.cpp": f"int a(int x) {{\n{twin}  return v1;\n}}\n",
            "reports/b.cpp": f"int b(int x) {{\n{twin}  return v2;\n}}\n",
            "python/short.py": "def short(x):\n    return x\n",
        }
        for name, text in planted.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        (root / "scripts").mkdir()
        (root / EXEMPTIONS).write_text("duplicate-runs 0\nchecks/grown.cpp grown 65 1\nchecks/fits.cpp fits 70 1\n")
        *_, found = gate(root)
    expected = ["1 duplicated", "checks/complex.cpp", "checks/grown.cpp", "checks/long.cpp", EXEMPTIONS]
    got = sorted(line.split(":")[0].split(" runs")[0] for line in found)
    print("planted faults found:" if got == expected else f"expected {expected}, found", found)
    return 0 if got == expected else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if sys.argv[1:] == ["--write"]:
        write(ROOT)
        return 0
    measured, runs, listed, ceiling, found = gate(ROOT)
    for line in found:
        print(line)
    print(figures(measured, runs, listed) + (f" (ceiling {ceiling})" if ceiling is not None else ""))
    if ceiling is not None and len(runs) < ceiling:
        print(f"the duplicated runs fell to {len(runs)}: lower the ceiling in {EXEMPTIONS}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
