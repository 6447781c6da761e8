#!/usr/bin/env python3
"""ckcheck's verdict on real eager models under each --checkpoint mode, beside what PyTorch itself
does, as a Markdown table (docs/python.md's table comes from here).

    .venv/bin/python scripts/eager_verdicts.py [--ckcheck build/ckcheck]

PyTorch's column says what a training script sees with that checkpoint: it raises (the first
words of its error), or it runs -- and then ckcheck's verdict says whether the gradients, outputs
and state are those of the plain model.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODELS = [  # (factory, what it is, the modes that apply)
    ("tiny_gpt2.py:make_model", "GPT-2, 2 layers, dropout, mask, labels (transformers)", None),
    ("tiny_t5.py:make_model", "T5, 2+2 layers, shared position bias (transformers)", None),
    ("lora_gpt2.py:make_model", "PEFT LoRA on a frozen GPT-2", None),
    ("inplace_after_forward.py:make_model", "a block input changed in place after the forward",
     ("ckcheck", "torch", "torch-reentrant")),
    ("vision.py:timm_vit", "timm ViT-Tiny, 4 blocks, dropout", None),
    ("vision.py:timm_convnext", "timm ConvNeXt-Atto, drop-path", None),
    ("vision.py:resnet18", "torchvision ResNet-18 (BatchNorm)", ("ckcheck", "torch", "torch-reentrant")),
    ("vision.py:torchvision_vit", "torchvision ViT, dropout", ("ckcheck", "torch", "torch-reentrant")),
]
MODES = ("ckcheck", "torch", "torch-reentrant", "model")


def run(binary, factory, mode):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "r.json")
        proc = subprocess.run([binary, "run", "--model", os.path.join("fixtures", "python", factory),
                               "--checkpoint", mode, "--report", f"json={path}"],
                              capture_output=True, text=True, cwd=ROOT, timeout=900)
        if proc.returncode == 2 or not os.path.exists(path):
            lines = proc.stderr.strip().splitlines()
            return None, lines[-1] if lines else f"exit {proc.returncode}"
        with open(path) as f:
            return json.load(f), ""


def describe(report):
    failed = []
    raised = ""
    for check in report["checks"]:
        if check["status"] not in ("fail", "error"):
            continue
        found = sorted({f["cause"] for f in check["findings"]})
        failed.append(f"{check['id']} ({', '.join(found)})" if found else check["id"])
        for f in check["findings"]:
            if f["message"].startswith("the checkpointed step failed: ") and not raised:
                raised = f["message"][len("the checkpointed step failed: "):]
    return failed, raised


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckcheck", default=os.path.join(ROOT, "build", "ckcheck"))
    a = parser.parse_args()
    print("| model | --checkpoint | ckcheck | what fails (cause) | PyTorch itself |")
    print("|---|---|---|---|---|")
    for factory, what, modes in MODELS:
        for mode in modes or MODES:
            report, error = run(a.ckcheck, factory, mode)
            if report is None:
                print(f"| {what} | {mode} | not checked | {error[:90]} | |")
                continue
            failed, raised = describe(report)
            if mode == "ckcheck":
                pytorch = "(ckcheck's own checkpoint)"
            elif raised:
                pytorch = "raises: " + raised[:70]
            else:
                pytorch = "runs; gradients/state wrong, silently" if failed else "runs; correct"
            print(f"| {what} | {mode} | {report['verdict'].upper()} | {'; '.join(failed) or '-'} | {pytorch} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
