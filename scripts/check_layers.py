#!/usr/bin/env python3
"""The flow has no back-edges: each source file includes only headers of its own stage or of the
stages before it, no check runs a model, and no library error names a command-line flag (the
library names fields, @sites in a FieldError; the command line maps them to its flags).

    support -> checkpoint -> model -> runner -> checks -> analyses -> reports -> testing -> cli

Fixtures (the built-in and planted-fault models) sit on the model layer and are seen only by the
command line, the Python package, the benchmarks and the tests. The Python package (python/ckcheck)
has no import cycle, counting imports inside functions too. Prints one line per violation and
exits 1 when there is any (run by CTest as layers.no_back_edges). An argument names another tree
to scan (the test of this script plants a back-edge in one)."""
import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ORDER = ["support", "checkpoint", "model", "runner", "checks", "analyses", "reports", "testing",
         "cli", "python"]
# Where a path belongs: the first prefix that matches.
STAGES = [
    ("harness/support/", "support"),
    ("harness/checkpoint/", "checkpoint"), ("harness/include/ckcheck/checkpoint.h", "checkpoint"),
    ("ckcheck/checkpoint.h", "checkpoint"),
    ("harness/model/", "model"), ("harness/include/ckcheck/model.h", "model"), ("ckcheck/model.h", "model"),
    ("harness/runner/", "runner"),
    ("checks/", "checks"),
    ("analyses/", "analyses"),
    ("reports/", "reports"),
    ("testing/", "testing"), ("testing/include/ckcheck/testing.h", "testing"),
    ("ckcheck/testing.h", "testing"),
    ("ckcheck/version.h", "support"),
    ("fixtures/", "fixtures"),
    ("cli/", "cli"),
    ("python/", "python"),
]
FIXTURES_MAY_SEE = {"support", "checkpoint", "model", "fixtures"}
# The folders are the stages too, in the same order (harness/ holds the first four; each public
# header lives in its stage's folder, ckcheck/testing.h in testing/include).
FOLDERS = ["harness", "checks", "analyses", "reports", "testing", "cli", "python"]
PUBLIC = {"ckcheck/checkpoint.h": "harness", "ckcheck/model.h": "harness", "ckcheck/version.h": "harness",
          "ckcheck/testing.h": "testing"}
# What running a model looks like in C++: the checks read records, they never do this.
RUNS_A_MODEL = re.compile(r"\bRunner\s*[&*(]|\brunner\.|\brun_step\b|->forward\(|\bmodel\.forward\(|\bsite_runner\b")
# A thrown error, up to its ';', and a flag in one of its string literals.
THROW = re.compile(r"\bthrow\s+\w*Error\s*\((?:[^;\"]|\"(?:[^\"\\]|\\.)*\")*;", re.S)
FLAG_IN_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*?(?<![-\w])--(?:[a-z]|\{\}|")(?:[^"\\]|\\.)*"')


def stage_of(path):
    for prefix, stage in STAGES:
        if path.startswith(prefix):
            return stage
    return None


def folder_of(path):
    """The top folder a file or an include path belongs to, or None (a system header)."""
    if path in PUBLIC:
        return PUBLIC[path]
    top = path.split("/")[0]
    return top if top in FOLDERS or top == "fixtures" else None


def folder_allowed(source, target):
    if "fixtures" in (source, target):
        return True  # allowed() decides for the fixtures
    return FOLDERS.index(target) <= FOLDERS.index(source)


def allowed(source, target):
    if source == "fixtures":
        return target in FIXTURES_MAY_SEE
    if target == "fixtures":
        return source in ("cli", "python")
    return ORDER.index(target) <= ORDER.index(source)


def violations(root):
    for file in sorted(root.glob("**/*")):
        rel = file.relative_to(root).as_posix()
        if file.suffix not in (".h", ".cpp", ".cu") or rel.startswith(("build", "python/build", "tests/", "bench/")):
            continue
        source = stage_of(rel)
        if source is None and folder_of(rel) is None:
            continue
        text = file.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            match = re.match(r'\s*#include\s+["<]([^">]+)[">]', line)
            target = stage_of(match.group(1)) if match else None
            if source and target and not allowed(source, target):
                yield f"{rel}:{number}: the {source} stage includes {match.group(1)} of the {target} stage"
            elif match and folder_of(rel) and folder_of(match.group(1)) and \
                    not folder_allowed(folder_of(rel), folder_of(match.group(1))):
                yield f"{rel}:{number}: the {folder_of(rel)}/ folder includes {match.group(1)} of the later " \
                      f"{folder_of(match.group(1))}/ folder"
            if source == "checks" and not match and RUNS_A_MODEL.search(line) and not line.lstrip().startswith("//"):
                yield f"{rel}:{number}: a check runs a model; checks read the records of the steps"
        if source in (None, "cli", "python"):
            continue
        for throw in THROW.finditer(text):
            if FLAG_IN_LITERAL.search(throw.group(0)):
                number = text.count("\n", 0, throw.start()) + 1
                yield f"{rel}:{number}: a library error names a flag; throw FieldError naming the field (@name)"


def python_imports(package):
    """{module: the package's modules it imports}, from every import statement of each module
    (inside functions too); `from ckcheck import name` of a name that is no module is the package's
    __init__."""
    modules = {f.stem for f in package.glob("*.py")}
    graph = {}
    for file in sorted(package.glob("*.py")):
        edges = set()
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name == "ckcheck" or a.name.startswith("ckcheck.")]
                edges.update(n.split(".")[1] if "." in n else "__init__" for n in names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("ckcheck", "") and \
                    (node.level > 0 or node.module):
                parts = (node.module or "").split(".")
                if len(parts) > 1 or (node.level and parts[0]):
                    edges.add(parts[-1])
                else:
                    edges.update(a.name if a.name in modules else "__init__" for a in node.names)
        graph[file.stem] = {e for e in edges if e in modules and e != file.stem}
    return graph


def python_cycles(root):
    """One line per import cycle of the Python package: its modules, each importing the next."""
    package = root / "python" / "ckcheck"
    if not package.is_dir():
        return
    graph = python_imports(package)
    reported = set()
    for start in sorted(graph):
        path = _cycle_from(graph, start)
        if path and frozenset(path) not in reported:
            reported.add(frozenset(path))
            yield (f"python/ckcheck/{start}.py: import cycle " + " -> ".join(path + [start]) +
                   "; move what both need into a module that imports neither")


def _cycle_from(graph, start):
    """The shortest chain of imports from `start` back to itself, or None."""
    frontier, seen = [[start]], {start}
    while frontier:
        following = []
        for path in frontier:
            for nxt in sorted(graph[path[-1]]):
                if nxt == start:
                    return path
                if nxt not in seen:
                    seen.add(nxt)
                    following.append(path + [nxt])
        frontier = following
    return None


def self_test():
    """The negative control: a tree with one back-edge of each kind must give exactly those."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        planted = {"checks/x.cpp": '#include "reports/report.h"\n',
                   "checks/y.cpp": "void f(Runner& r) { r.run(); }\n",
                   "fixtures/z.cpp": '#include "harness/runner/runner.h"\n',
                   "harness/runner/ok.cpp": '#include "ckcheck/model.h"\n#include "harness/support/text.h"\n'
                                            'void g() { throw FieldError("sites", "@sites matches nothing"); }\n',
                   "harness/model/w.cpp": 'void h() {\n  throw UsageError(fmt::format("bad {}; "\n  "give --sites", 1));\n}\n',
                   "cli/ok.cpp": 'void k() { throw UsageError("--sites matches nothing"); }\n',
                   # a folder back-edge from a file of no known stage: harness/ includes checks/
                   "harness/extra/v.cpp": '#include "checks/check.h"\n',
                   # an import cycle through a function-level import, beside a module that is fine
                   "python/ckcheck/_a.py": "from ckcheck import _b\n",
                   "python/ckcheck/_b.py": "def f():\n    from ckcheck._a import x\n",
                   "python/ckcheck/_c.py": "from ckcheck import _a, name_of_init\n"}
        for name, text in planted.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        found = sorted(line.split(":")[0] for line in [*violations(root), *python_cycles(root)])
    expected = ["checks/x.cpp", "checks/y.cpp", "fixtures/z.cpp", "harness/extra/v.cpp", "harness/model/w.cpp",
                "python/ckcheck/_a.py"]
    print("planted back-edges found:" if found == expected else f"expected {expected}, found", found)
    return 0 if found == expected else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    found = [*violations(root), *python_cycles(root)]
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} back-edge(s); move the code down the flow or the include up it", file=sys.stderr)
        return 1
    print("no back-edges: support -> checkpoint -> model -> runner -> checks -> analyses -> reports -> testing -> cli, "
          "and no folder includes a later one: " + " -> ".join(f"{f}/" for f in FOLDERS) +
          "; the Python package has no import cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
