"""Hardening of the ckcheck command line: bad input and report targets (data-parallel runs:
test_hardening_ranks.py).

The bad-input corpus is a table of (arguments, expected exit status, pattern of the one error
line): every option of every subcommand with wrong types, out-of-range and boundary values, empty
and very long strings, duplicates and conflicting flags. Each row must exit as stated, print
exactly one line on standard error and nothing on standard output, and leave no file behind.

Run by CTest (cli.hardening) with CKCHECK_BIN, the ckcheck program, and CKCHECK_TEST_OPS, the
library of test ops; `python -m pytest tests/cli/test_hardening.py` with both set runs it by hand.
"""
import concurrent.futures
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from typing import Tuple

import pytest

BIN = os.environ.get("CKCHECK_BIN", "")
OPS = os.environ.get("CKCHECK_TEST_OPS", "")
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK), reason="CKCHECK_BIN is not set to the ckcheck program")

LONG = "x" * 5000
WHOLE = r"is not a whole number"
NUMBER = r"is not a number"

# ---------------------------------------------------------------------------------------------
# The corpus. Each row: (arguments, exit status, regular expression the error line must match,
# environment overrides). Files named in arguments are made in each row's own empty folder:
# tiny.pt (a scripted model), str_site.pt (its only block returns a string), corrupt.pt, a folder
# 'dir' and an existing report 'old.json'.
# ---------------------------------------------------------------------------------------------
ROWS = []


def row(args, pattern, code=2, env=None):
    ROWS.append((list(args), code, pattern, env or {}))


MODEL_COMMANDS = {"run": ["run", "--model", "mlp"], "diagnose": ["diagnose", "--model", "mlp"],
                  "bench": ["bench", "--model", "mlp", "--steps", "1", "--warmup", "0"]}

# Options every model command shares.
for name, base in MODEL_COMMANDS.items():
    for v in ["-1", "", "18446744073709551616", "99999999999999999999999", "abc", "1.5", " 1", "0x10", "1e3", "+1"]:
        row(base + ["--seed", v], r"--seed.*" + WHOLE)
    for v in ["", "every:0", "every:-1", "every:", "every:x", "segments:0", "segments:99", "bogus", "every:1:2",
              "sites:", LONG]:
        row(base + ["--policies" if name == "bench" else "--policy", v], r"polic|segments")
    for v in ["nomatch*", "[", "blocks.9", LONG, "a,,b", ","]:
        row(base + ["--sites", v], r"--sites")
    for v in ["gpu", "", "cuda:x", "cuda:-1", "cuda:99", "tpu", "cpu,cuda"]:
        row(base + ["--device", v], r"--device|device")
    for v in ["fp8", "", "FP16", "fp16", "bf16,fp16"]:
        row(base + ["--amp", v], r"--amp|amp")
    # Model options: wrong types, out of range, beyond the machine.
    for opt, values in {"--layers": ["0", "-1", "abc", "", "1.5", "99999999999999999999"],
                        "--hidden": ["0", "abc", "-5", "100000000"],
                        "--batch": ["0", "x"], "--in": ["0"], "--out": ["-2"],
                        "--dropout": ["-0.1", "1.5", "nan", "abc", "inf"],
                        "--zero-head": ["maybe", ""]}.items():
        for v in values:
            row(base + [opt, v], opt + r"|needs about .* available")
    row(base + ["--heads", "4"], r"model mlp has no option --heads")
    row(base + ["--frobnicate", "1"], r"--frobnicate")
    row(base + ["--model", "transformer"], r"--model|only once|allowed", code=2)
    row(base[:1] + ["--model", "transformer", "--hidden", "30", "--heads", "4"] + base[3:], r"--hidden 30 must be a multiple of --heads 4")
    row(base[:1] + ["--model", "faulty/stateful-counter", "--fault-site", "9"] + base[3:], r"--fault-site")
    row(base[:1] + ["--model", "faulty/rank-fault", "--rank-fault", "explode"] + base[3:], r"--rank-fault")
    # Models and TorchScript inputs.
    for m, pattern in [("", r"--model|unknown model"), ("resnet9000", r"unknown model 'resnet9000'"),
                       ("/dev/null", r"--model /dev/null: is a device"), ("dir", r"--model dir: is a folder"),
                       ("./missing.pt", r"no such file"), ("corrupt.pt", r"not a readable TorchScript file"),
                       ("/nonexistent/m.pt", r"no such file"), (LONG + ".pt", r"no such file|name too long")]:
        row(base[:1] + ["--model", m] + base[3:], pattern)
    row(base[:1] + base[3:], r"--model is required")
    for opts, pattern in [(["--input-shape", "2,3"], r"--input-shape applies to TorchScript models"),
                          (["--mode", "eval"], r"--mode applies to TorchScript models"),
                          (["--input", "old.json"], r"--input applies to TorchScript models")]:
        row(base + opts, pattern)
    ts = base[:1] + ["--model", "tiny.pt"] + base[3:]
    for opts, pattern in [([], r"give its input with --input-shape"),
                          (["--input-shape", "abc"], r"--input-shape"), (["--input-shape", ""], r"--input-shape"),
                          (["--input-shape", "0,4"], r"--input-shape|rejects"), (["--input-shape", "-1,4"], r"--input-shape"),
                          (["--input-shape", "2,4", "--input-dtype", "complex"], r"--input-dtype"),
                          (["--input-shape", "2,4", "--input-range", "5,1"], r"--input-range"),
                          (["--input-shape", "2,4", "--input-range", "a,b"], r"--input-range"),
                          (["--input", "dir"], r"--input dir: is a folder"),
                          (["--input", "/dev/null"], r"--input /dev/null: is a device"),
                          (["--input", "nofile.pt"], r"--input nofile.pt: no such file"),
                          (["--input", "corrupt.pt"], r"--input corrupt.pt: not a file of tensors"),
                          (["--input-shape", "2,4", "--mode", "sideways"], r"--mode"),
                          (["--input-shape", "2,4", "--layers", "3"], r"--layers is an option of the built-in models"),
                          (["--input-shape", "2,4", "--sites", "nope*"], r"--sites 'nope\*' matches no site"),
                          (["--input-shape", "2,4", "--report", "json=tiny.pt"], r"would overwrite the input file 'tiny.pt'"),
                          (["--input-shape", "99999,99999,99999"], r"at most 2\^31")]:
        row(ts + opts, pattern)
    row(base[:1] + ["--model", "str_site.pt", "--input-shape", "2,4"] + base[3:], r"site a of model str_site.pt cannot be checkpointed: its forward returns")
    # Reports: formats, paths, clashes, nothing written.
    for v, pattern in [("pdf", r"unknown report format 'pdf'"), ("=x.json", r"unknown report format ''"),
                       ("json=", r"give a file path after '='"), ("json=dir", r"'dir' is a folder"),
                       ("json=dir/", r"give a file path"), ("json=/nonexistent/dir/r.json", r"cannot write into folder"),
                       ("json=missing/r.json", r"cannot write into folder 'missing'"),
                       ("JSON=r.json", r"unknown report format 'JSON'")]:
        row(base + ["--report", v], pattern)
    row(base + ["--report", "json=a.json", "--report", "html=a.json"], r"would overwrite --report json=a.json")
    row(base + ["--report", "json=a.json", "--report", "json=./a.json"], r"would overwrite --report json=a.json")
    row(base + ["--report", "json=r.json", "--report", "pdf=r.pdf"], r"unknown report format 'pdf'")

# run and diagnose: the protections and knobs they share.
for name in ["run", "diagnose"]:
    base = MODEL_COMMANDS[name]
    for v in ["0", "-1", "", "abc", "10001", "1.5"]:
        row(base + ["--steps", v], r"--steps.*" + WHOLE)
    for v, pattern in [("rtol=abc", r"tolerance 'rtol=abc'"), ("rtol=-1", r"not a non-negative number"),
                       ("rtol=", r"not a non-negative number"), ("", r"tolerance"),
                       ("rtol=1e-5,rtol=2", r"gives rtol twice"), ("atol=1,atol=1", r"gives atol twice"),
                       ("ulp=1e99", r"ulp needs a whole number from 0 to"), ("ulp=1.5", r"ulp needs a whole number"),
                       ("ulp=-1", r"not a non-negative number"), ("ulp=", r"not a non-negative number"),
                       ("rtol=nan", r"not a non-negative number"), ("rtol=inf", r"not a non-negative number"),
                       ("foo=1", r"unknown tolerance"), ("bitwise,rtol=1", r"unknown tolerance"), (LONG, r"unknown tolerance")]:
        row(base + ["--tolerance", v], pattern)
    for v in ["-1", "nan", "inf", "abc", "", "1e7"]:
        row(base + ["--lr", v], r"--lr.*" + NUMBER)
    row(base + ["--offload", "gpu"], r"--offload")
    row(base + ["--sac-save", "aten.mm"], r"applies to Python models")
    row(base + ["--checkpoint", "torch-sac"], r"applies to Python models")
    for v in ["0.5", "nan", "inf", "0", "-1", "abc", ""]:
        row(base + ["--amp-error-factor", v], r"--amp-error-factor.*" + NUMBER)
    row(base + ["--no-preserve-rng=maybe"], r"--no-preserve-rng")
    row(base + ["--restore-buffers", "extra"], r"extra|not expected|arguments")

# run only.
base = MODEL_COMMANDS["run"]
for v in ["nope", "gradients,nope", "GRADIENTS"]:
    row(base + ["--checks", v], r"unknown check")
for v in ["0", "-1", "257", "abc", "", "2.5"]:
    row(base + ["--world-size", v], r"--world-size.*" + WHOLE)
for v in ["0", "-1", "86401", "abc", ""]:
    row(base + ["--timeout", v], r"--timeout.*" + WHOLE)
for v in ["0", "-1", "nan", "inf", "abc"]:
    row(base + ["--bench", "--max-overhead", v], r"--max-overhead.*" + NUMBER)
for v in ["0", "-1", "65", "abc", "", "1.5"]:
    row(base + ["--accumulate", v], r"--accumulate.*" + WHOLE)
row(base + ["--accumulate", "2", "--world-size", "2"], r"--accumulate runs in one process")
for v in ["", "Interleaved", "1f1b", LONG]:
    row(base + ["--schedule", v], r"--schedule")
row(base + ["--schedule", "interleaved", "--world-size", "2"], r"--schedule runs in one process")
row(base + ["--poison", "--world-size", "2"], r"--poison runs in one process")
row(base + ["--poison", "--schedule", "reversed"], r"--poison overwrites state .*drop --schedule")
for v in ["", "Torch", "reentrant", "torch,model"]:
    row(base + ["--checkpoint", v], r"--checkpoint")
row(base + ["--checkpoint", "torch"], r"--checkpoint torch applies to Python models")
for v in ["nofile.py", "nofile.py:make_model", "no_such_pkg_xyz.mod:make_model"]:
    row(["run", "--model", v], r"no Python file|importing no_such_pkg_xyz.mod failed")
row(base + ["--world-size", "2", "--bench"], r"--bench runs in one process")
row(["run", "--model", "faulty/rank-fault", "--fault-rank", "9", "--world-size", "2"], r"--fault-rank 9 is not a rank of this run: --world-size 2 has ranks 0 to 1")
row(["run", "--model", "transformer", "--batch", "3", "--world-size", "2"], r"does not split evenly over --world-size 2")
row(base + ["--device", "cuda:99", "--world-size", "2"], r"--device")
# Rank environments (torchrun's variables) that do not describe a rank.
for env, pattern in [({"RANK": "0", "WORLD_SIZE": "2"}, r"MASTER_ADDR or MASTER_PORT is not"),
                     ({"RANK": "abc", "WORLD_SIZE": "2"}, r"RANK='abc' is not an integer"),
                     ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, r"do not describe a rank"),
                     ({"RANK": "0", "WORLD_SIZE": "0"}, r"do not describe a rank"),
                     ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"}, r"MASTER_PORT=99999 is not a TCP port"),
                     ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}, r"MASTER_PORT=0 is not a TCP port"),
                     ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "port"}, r"MASTER_PORT='port' is not an integer"),
                     ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "", "MASTER_PORT": "29500"}, r"MASTER_ADDR is empty")]:
    row(base, pattern, env=env)

# bench only.
base = MODEL_COMMANDS["bench"]
for v in ["0", "-1", "", "abc", "10001"]:
    row(["bench", "--model", "mlp", "--warmup", "0", "--steps", v], r"--steps.*" + WHOLE)
for v in ["-1", "1001", "abc", ""]:
    row(["bench", "--model", "mlp", "--steps", "1", "--warmup", v], r"--warmup.*" + WHOLE)
for v, pattern in [("lots", r"memory size 'lots'"), ("-1GiB", r"memory size '-1GiB'"), ("", r"--memory-budget: an empty value"),
                   ("99999999999999999999GiB", r"beyond any machine"), ("1XB", r"memory size '1XB'"),
                   ("nanGiB", r"memory size"), ("1e400", r"memory size"), ("8 GiB", r"memory size")]:
    row(base + ["--memory-budget", v], pattern)
for v in ["-1", "nan", "86401", "abc", "inf"]:
    row(base + ["--time-budget", v], r"--time-budget.*" + NUMBER)
for v in ["0", "-1", "nan", "abc"]:
    row(base + ["--max-overhead", v], r"--max-overhead.*" + NUMBER)
for v in ["0", "-1", "100000", "abc", "", "1.5"]:
    row(base + ["--threads", v], r"--threads.*" + WHOLE)
for v, pattern in [("bogus", r"unknown policy 'bogus'"), ("sites:*.nope", r"matches none"), ("every:0", r"every:0"),
                   ("none,every:x", r"every:x"), ("segments:99", r"more segments")]:
    row(base + ["--policies", v], pattern)
row(base + ["--policy", "every:1"], r"--policy")
for v, pattern in [("rtol=abc", r"tolerance 'rtol=abc'"), ("foo=1", r"unknown tolerance")]:
    row(base + ["--tolerance", v], pattern)
row(base + ["--offload", "cpu"], r"--offload")

# validate-op.
ops = ["--library", "@OPS@"]
for v, pattern in [("", r"--op|namespace::name"), ("noname", r"namespace::name"), ("::x", r"namespace::name"),
                   ("lib::", r"namespace::name"), ("ckcheck_test::clean.", r"namespace::name"),
                   ("ckcheck_test::clean..x", r"namespace::name"), ("ckcheck_test::nope", r"no op ckcheck_test::nope is registered"),
                   ("aten::definitely_not_an_op", r"no op aten::definitely_not_an_op"), (LONG + "::x", r"no op")]:
    row(["validate-op"] + ops + ["--op", v], pattern)
row(["validate-op", "--library", "ckcheck_test"], r"--op is required")
for lib, pattern in [("/nonexistent.so", r"cannot load it"), ("/dev/null", r"cannot load it|not a"), ("dir", r"cannot load it|not a"),
                     ("corrupt.pt", r"cannot load it"), ("", r"cannot load it|--library")]:
    row(["validate-op", "--library", lib, "--op", "x::y"], pattern + "|no op x::y")
for v in ["abc", "4x", "0x4", "-1", "4x16,", "4xx16", "99999999x99999999"]:
    row(["validate-op"] + ops + ["--op", "ckcheck_test::clean", "--shapes", v], r"--shapes|shape")
for v in ["complex", "", "FLOAT32"]:
    row(["validate-op"] + ops + ["--op", "ckcheck_test::clean", "--dtype", v], r"--dtype")
for v in ["-1", "", "18446744073709551616", "x"]:
    row(["validate-op"] + ops + ["--op", "ckcheck_test::clean", "--seed", v], r"--seed.*" + WHOLE)
for v in ["0", "-1", "10001", "abc", ""]:
    row(["validate-op"] + ops + ["--op", "ckcheck_test::clean", "--cases", v], r"--cases.*" + WHOLE)
for v, pattern in [("pdf", r"unknown report format"), ("json=dir", r"is a folder"), ("json=@OPS@", r"would overwrite the input file")]:
    row(["validate-op"] + ops + ["--op", "ckcheck_test::clean", "--report", v], pattern)

# The program itself.
for args, pattern in [([], r"A subcommand is required|subcommand"), (["frobnicate"], r"frobnicate"),
                      (["--frobnicate"], r"--frobnicate"), (["list", "--frobnicate"], r"--frobnicate"),
                      (["list", "extra"], r"extra"), (["run", "--model"], r"--model"),
                      (["run", "diagnose"], r"diagnose|--model"), ([LONG], r"x{20}")]:
    row(args, pattern)



def make_files(folder):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Block()
            self.b = Block()

        def forward(self, x):
            return self.b(self.a(x))

    class Tagged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x) -> Tuple[torch.Tensor, str]:
            return self.fc(x), "tag"

    class StrSite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Tagged()

        def forward(self, x):
            y, _ = self.a(x)
            return y

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(Tiny()).save(os.path.join(folder, "tiny.pt"))
        torch.jit.script(StrSite()).save(os.path.join(folder, "str_site.pt"))
    with open(os.path.join(folder, "corrupt.pt"), "w") as f:
        f.write("this is not a TorchScript archive\n")
    with open(os.path.join(folder, "old.json"), "w") as f:
        f.write("{}\n")
    os.mkdir(os.path.join(folder, "dir"))


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    folder = tmp_path_factory.mktemp("template")
    make_files(str(folder))
    return folder


def listing(folder):
    out = {}
    for root, dirs, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = fh.read()
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), folder) + "/"] = b""
    return out


def run_row(index, template):
    args, code, pattern, env = ROWS[index]
    args = [a.replace("@OPS@", OPS) for a in args]
    folder = tempfile.mkdtemp(prefix=f"row{index}-")
    subprocess.run(["cp", "-a", str(template) + "/.", folder], check=True)
    before = listing(folder)
    full_env = dict(os.environ, NO_COLOR="1")
    for k in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"]:
        full_env.pop(k, None)
    full_env.update(env)
    start = time.monotonic()
    p = subprocess.run([BIN] + args, cwd=folder, env=full_env, capture_output=True, timeout=120)
    took = time.monotonic() - start
    after = listing(folder)
    subprocess.run(["rm", "-rf", folder])
    return p, before, after, took


@pytest.fixture(scope="session")
def corpus(template):
    # All rows at once, a few at a time: each is one short process.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {i: pool.submit(run_row, i, template) for i in range(len(ROWS))}
        return {i: f.result() for i, f in futures.items()}


def test_corpus_is_large_enough():
    assert len(ROWS) >= 300, len(ROWS)


def row_id(i):
    args, code, _, env = ROWS[i]
    text = " ".join(a if len(a) < 40 else a[:12] + "..." for a in args)
    return f"{i}:{' '.join(f'{k}={v}' for k, v in env.items())} {text}".strip()


@pytest.mark.parametrize("index", range(len(ROWS)), ids=[row_id(i) for i in range(len(ROWS))])
def test_bad_input(index, corpus):
    args, code, pattern, _ = ROWS[index]
    p, before, after, took = corpus[index]
    err = p.stderr.decode(errors="replace")
    lines = err.splitlines()
    assert p.returncode == code, f"exit {p.returncode}, expected {code}; stderr: {err[:500]}"
    assert len(lines) == 1, f"expected one line on standard error, got {len(lines)}: {err[:800]}"
    assert lines[0].startswith("ckcheck: error: "), lines[0][:300]
    assert re.search(pattern, lines[0]), f"{lines[0][:400]!r} does not match {pattern!r}"
    assert p.stdout == b"", p.stdout[:300]
    assert "Exception raised from" not in err and "frame #" not in err
    assert before == after, f"files changed: {sorted(set(after) ^ set(before))}"


# The negative control: boundary values that are valid must still be accepted, silently.
GOOD_ROWS = [
    ["run", "--model", "mlp", "--checks", "gradients", "--seed", "18446744073709551615"],
    ["run", "--model", "mlp", "--checks", "gradients", "--seed", "0", "--steps", "2"],
    ["run", "--model", "mlp", "--checks", "gradients", "--tolerance", "ulp=4294967296"],
    ["run", "--model", "mlp", "--checks", "gradients", "--tolerance", "rtol=0,atol=0"],
    ["run", "--model", "mlp", "--checks", "gradients", "--lr", "0", "--amp-error-factor", "1"],
    ["run", "--model", "mlp", "--checks", "gradients", "--sites", "blocks.*", "--policy", "sites:blocks.1"],
    ["diagnose", "--model", "mlp", "--amp-error-factor", "1e6"],
    ["bench", "--model", "mlp", "--steps", "1", "--warmup", "0", "--memory-budget", "1TiB", "--threads", "1",
     "--time-budget", "0", "--policies", "none,every:1"],
    ["validate-op", "--library", "@OPS@", "--op", "ckcheck_test::clean", "--shapes", "4x16,4x16", "--cases", "1",
     "--seed", "18446744073709551615"],
    ["run", "--model", "tiny.pt", "--input-shape", "2,4", "--checks", "gradients", "--report", "json=-"],
]


@pytest.mark.parametrize("args", GOOD_ROWS, ids=[" ".join(a[:3]) + f" #{i}" for i, a in enumerate(GOOD_ROWS)])
def test_valid_boundary_values_are_accepted(args, template, tmp_path):
    subprocess.run(["cp", "-a", str(template) + "/.", str(tmp_path)], check=True)
    args = [a.replace("@OPS@", OPS) for a in args]
    p = subprocess.run([BIN] + args, cwd=tmp_path, capture_output=True, env=dict(os.environ, NO_COLOR="1"), timeout=300)
    assert p.returncode == 0, p.stderr.decode()[:500]
    assert p.stderr == b"", p.stderr.decode()[:500]
    assert b"verdict:" in p.stdout or b'"verdict"' in p.stdout


# ---------------------------------------------------------------------------------------------
# Report targets: files atomically, symlinks followed, devices and pipes written through, '-'.
# ---------------------------------------------------------------------------------------------
def ckcheck(*args, cwd=None, **kw):
    return subprocess.run([BIN, *args], cwd=cwd, capture_output=True, env=dict(os.environ, NO_COLOR="1"), **kw)


RUN = ["run", "--model", "mlp", "--checks", "gradients"]


def test_report_to_dash_goes_to_standard_output(tmp_path):
    p = ckcheck(*RUN, "--report", "json=-", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().lstrip().startswith("{") and '"tool": "ckcheck"' in p.stdout.decode()
    assert os.listdir(tmp_path) == []


def test_report_to_dev_stdout_is_written_through(tmp_path):
    p = ckcheck(*RUN, "--report", "json=/dev/stdout", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert '"tool": "ckcheck"' in p.stdout.decode()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_report_to_dev_null_keeps_the_device(tmp_path):
    p = ckcheck(*RUN, "--report", "json=/dev/null", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not [f for f in os.listdir("/dev") if f.startswith(".null.ckcheck")]


def test_report_to_full_device_fails_in_one_line_and_writes_no_file(tmp_path):
    p = ckcheck(*RUN, "--report", "json=r.json", "--report", "markdown=/dev/full", cwd=tmp_path)
    assert p.returncode == 2
    lines = p.stderr.decode().splitlines()
    assert len(lines) == 1 and "/dev/full" in lines[0], lines
    assert os.listdir(tmp_path) == []


def test_report_through_symlink_replaces_the_linked_file(tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    target = other / "real.json"
    target.write_text("old\n")
    (tmp_path / "link.json").symlink_to(target)
    p = ckcheck(*RUN, "--report", "json=link.json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert os.path.islink(tmp_path / "link.json")
    assert '"tool": "ckcheck"' in target.read_text()
    assert sorted(os.listdir(other)) == ["real.json"]


def test_report_to_dangling_symlink_is_refused(tmp_path):
    (tmp_path / "link.json").symlink_to(tmp_path / "missing" / "x.json")
    p = ckcheck(*RUN, "--report", "json=link.json", cwd=tmp_path)
    assert p.returncode == 2 and "symlink to a missing file" in p.stderr.decode()
    assert os.path.islink(tmp_path / "link.json")


def test_report_to_pipe_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    p = ckcheck(*RUN, "--report", f"json={fifo}", cwd=tmp_path, timeout=120)
    got = reader.communicate(timeout=60)[0].decode()
    assert p.returncode == 0, p.stderr
    assert '"tool": "ckcheck"' in got
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_report_to_socket_is_refused(tmp_path):
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    try:
        p = ckcheck(*RUN, "--report", "json=sock", cwd=tmp_path)
    finally:
        s.close()
    assert p.returncode == 2 and "not a regular file, a character device or a pipe" in p.stderr.decode()


def test_report_replaces_a_regular_file_atomically(tmp_path):
    (tmp_path / "r.json").write_text("old\n")
    p = ckcheck(*RUN, "--report", "json=r.json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert '"tool": "ckcheck"' in (tmp_path / "r.json").read_text()
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_bad_later_target_leaves_earlier_ones_untouched(tmp_path):
    (tmp_path / "a.json").write_text("old\n")
    p = ckcheck(*RUN, "--report", "json=a.json", "--report", "html=nofolder/b.html", cwd=tmp_path)
    assert p.returncode == 2
    assert (tmp_path / "a.json").read_text() == "old\n"
