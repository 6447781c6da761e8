#!/usr/bin/env python3
"""A sweep over real architectures with its own truth.

For every model class of the installed transformers whose model supports gradient checkpointing
(built from a tiny random config; skipped with the reason when it cannot be built offline) and
every timm family with set_grad_checkpointing (at its smallest config), one training step is run in
PyTorch alone -- plainly, with the model's own switch, and with torch.utils.checkpoint (non-
reentrant and reentrant) around its layers -- and the loss, every gradient and all state are
compared with the plain step's. That is the truth; no ckcheck code computes it. Then ckcheck checks
the same model with --checkpoint model, torch and torch-reentrant, and the two are set side by side.

    .venv/bin/python scripts/arch_sweep.py                      # the whole sweep, table on stdout
    .venv/bin/python scripts/arch_sweep.py --subset ci --check  # the CI subset; exit 1 on a disagreement
    .venv/bin/python scripts/arch_sweep.py --one hf:gpt2        # one case, as JSON

Each case runs in its own process (a crash or a hang is that case's error, under --timeout).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import functools
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The CI subset: text, vision, audio, MoE, encoder-decoder, and timm families.
CI_SUBSET = ["hf:gpt2", "hf:llama", "hf:bert", "hf:bart", "hf:t5", "hf:mixtral", "hf:vit", "hf:wav2vec2",
             "hf:qwen2_moe", "hf:mistral", "timm:vit_tiny_patch16_224", "timm:resnet18",
             "hf:qwen2_moe+router_logits", "hf:olmoe+router_logits", "hf:jamba+router_logits",
             "hf:switch_transformers+labels", "hf:t5+labels"]

MODES = ["model", "torch", "torch-reentrant"]
SWITCH_MODES = ["model", "model-reentrant"]
ROUTER = "+router_logits"  # router logits on, the model's own loss on labels
LABELS = "+labels"         # the model's own loss on labels


def variant_of(case):
    """(the case without its variant, the variant: "", ROUTER or LABELS)."""
    for v in (ROUTER, LABELS):
        if case.endswith(v):
            return case[: -len(v)], v
    return case, ""


def modes_of(case):
    return SWITCH_MODES if variant_of(case)[1] else MODES

# Config fields a tiny config sets, where the config has them.
TINY = {
    **dict.fromkeys(["num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers", "num_encoder_layers"], 2),
    **dict.fromkeys(["hidden_size", "d_model", "n_embd", "embed_dim", "dim"], 32),
    **dict.fromkeys(["num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_key_value_heads"], 2),
    **dict.fromkeys(["intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
                     "moe_intermediate_size", "shared_expert_intermediate_size"], 64),
    "head_dim": 16, "d_kv": 16, "vocab_size": 99, "max_position_embeddings": 64, "n_positions": 64,
    "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "image_size": 32, "patch_size": 8,
    "num_mel_bins": 16, "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3),
    "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2, "num_feat_extract_layers": 2,
    "layer_types": None,
}
PRIORITY = ["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
            "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_CTC_MAPPING_NAMES", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"]


# ---------------------------------------------------------------------------------------------
# Cases


def hf_cases():
    from transformers.models.auto import modeling_auto as ma

    from transformers import AutoConfig

    seen, out = set(), []
    for mapping in PRIORITY:
        for model_type in getattr(ma, mapping):
            if model_type not in seen:
                seen.add(model_type)
                out.append(f"hf:{model_type}")
    # Their own loss under both switch modes: the sequence-to-sequence models, and the MoE models
    # with and without their router logits.
    variants = []
    seq2seq = set(ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    for case in out:
        try:
            moe = hasattr(AutoConfig.for_model(case[3:]), "output_router_logits") or _forward_takes_router_logits(case[3:])
        except Exception:
            moe = False
        if moe or case[3:] in seq2seq:
            variants.append(case + LABELS)
        if moe:
            variants.append(case + ROUTER)
    return out + variants


def _model_class(name):
    """The transformers class the sweep builds for a model type, or None."""
    import transformers
    from transformers.models.auto import modeling_auto as ma

    cls_name = next((getattr(ma, m)[name] for m in PRIORITY if name in getattr(ma, m)), None)
    if cls_name is None:
        return None
    return getattr(transformers, cls_name if isinstance(cls_name, str) else cls_name[0], None)


def _forward_takes_router_logits(name):
    import inspect

    cls = _model_class(name)
    return cls is not None and "output_router_logits" in inspect.signature(cls.forward).parameters


# Size words of timm's model names, smallest first: a family's smallest config is its member whose
# name has the earliest of them (then the shortest name).
TIMM_SIZES = ["atto", "femto", "pico", "nano", "tiny", "xxsmall", "xxs", "xsmall", "xs", "mini", "small", "_s_",
              "b0", "lite", "light", "18", "26", "medium", "base"]


def timm_size_rank(name):
    for i, word in enumerate(TIMM_SIZES):
        if word in name:
            return (i, len(name), name)
    return (len(TIMM_SIZES), len(name), name)


def timm_cases():
    import timm

    families = {}
    for name in timm.list_models(pretrained=False):
        families.setdefault(name.split("_")[0].rstrip("0123456789"), []).append(name)
    return [f"timm:{min(names, key=timm_size_rank)}" for _, names in sorted(families.items())]


def spread(cases, n):
    """n cases taken evenly over the list (which is grouped by kind), so every kind is sampled."""
    if n < 0 or n >= len(cases):
        return list(cases)
    return [cases[(i * len(cases)) // n] for i in range(n)]


def build(case):
    """(model, kwargs inputs, description) for a case, with random weights."""
    import torch

    kind, name = case.split(":", 1)
    name, variant = variant_of(name)
    routed = variant == ROUTER
    torch.manual_seed(0)
    if kind == "timm":
        import timm

        with torch.device("meta"):
            size = sum(p.numel() for p in timm.create_model(name, pretrained=False, num_classes=10).parameters())
        if size > 100e6:
            raise Skip(f"{size / 1e6:.0f}M parameters: too large for a CPU sweep")
        model = timm.create_model(name, pretrained=False, num_classes=10)
        if not hasattr(model, "set_grad_checkpointing"):
            raise Skip("no set_grad_checkpointing")
        cfg = getattr(model, "pretrained_cfg", {}) or {}
        size = cfg.get("input_size", (3, 224, 224))
        model.train()
        return model, {"x": torch.randn(2, *size)}, f"timm {name}"
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto as ma

    cls_name = next((getattr(ma, m)[name] for m in PRIORITY if name in getattr(ma, m)), None)
    if cls_name is None:
        raise Skip("no task head in the sweep's list")
    import transformers

    cls = getattr(transformers, cls_name if isinstance(cls_name, str) else cls_name[0], None)
    if cls is None:
        raise Skip(f"{cls_name} is not importable")
    if not getattr(cls, "supports_gradient_checkpointing", False):
        raise Skip("does not support gradient checkpointing")
    config = AutoConfig.for_model(name)
    for key, value in TINY.items():
        if hasattr(config, key) and value is not None and not isinstance(getattr(config, key), (dict, list)):
            setattr(config, key, value)
    for sub in ("text_config", "vision_config", "encoder", "decoder"):
        part = getattr(config, sub, None)
        if part is not None and hasattr(part, "__dict__"):
            for key, value in TINY.items():
                if hasattr(part, key) and value is not None and not isinstance(getattr(part, key), (dict, list)):
                    setattr(part, key, value)
    for key in ("use_cache",):
        if hasattr(config, key):
            setattr(config, key, False)
    routed_by_argument = False
    if routed:
        if hasattr(config, "output_router_logits"):
            config.output_router_logits = True
        elif _forward_takes_router_logits(name):
            routed_by_argument = True
        else:
            raise Skip("no router logits")
    model = cls(config)
    model.train()
    inputs = inputs_for(model, config)
    if variant:
        if "input_ids" not in inputs:
            raise Skip("the model's own loss is checked on language models (labels from input_ids)")
        inputs["labels"] = (inputs.get("decoder_input_ids", inputs["input_ids"])).clone()
        if routed_by_argument:
            inputs["output_router_logits"] = True
    return model, inputs, f"transformers {cls.__name__}" + {ROUTER: " (router logits)", LABELS: " (own loss)", "": ""}[variant]


def inputs_for(model, config):
    import torch

    main = getattr(model, "main_input_name", "input_ids")
    vocab = getattr(config, "vocab_size", None) or 99
    g = torch.Generator().manual_seed(1)
    if main == "input_ids":
        ids = torch.randint(0, min(vocab, 99), (2, 12), generator=g)
        inputs = {"input_ids": ids}
        if model.config.is_encoder_decoder:
            inputs["decoder_input_ids"] = ids[:, :8]
        return inputs
    if main == "pixel_values":
        size = getattr(config, "image_size", 32)
        size = size if isinstance(size, int) else size[0]
        return {"pixel_values": torch.randn(2, getattr(config, "num_channels", 3), size, size, generator=g)}
    if main == "input_values":
        return {"input_values": torch.randn(2, 1600, generator=g)}
    if main == "input_features":
        return {"input_features": torch.randn(2, getattr(config, "num_mel_bins", 16), 64, generator=g)}
    raise Skip(f"main input {main} is not in the sweep's list")


class Skip(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# The truth: PyTorch alone


def blocks_of(model, inputs):
    """The layers: the children of the largest ModuleList or Sequential (timm's stages and blocks)
    whose children share a class and are called by the forward (a vision or audio tower that
    text-only inputs never reach does not count). Its paths, found on a copy of the model."""
    import torch

    probe = copy.deepcopy(model)
    ran = set()
    hooks = [m.register_forward_hook(lambda m, i, o, path=path: ran.add(path)) for path, m in probe.named_modules()]
    torch.manual_seed(2)
    probe(**inputs)
    for h in hooks:
        h.remove()
    best = []
    for path, m in probe.named_modules():
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and len(m) >= 2 and len({type(c) for c in m}) == 1:
            called = [f"{path}.{i}" for i in range(len(m)) if f"{path}.{i}" in ran]
            if len(called) == len(m) and len(m) > len(best):
                best = called
    return best


def float_tensors(obj, out):
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            out.append(obj)
    elif isinstance(obj, dict) or hasattr(obj, "items"):
        for v in obj.values():
            float_tensors(v, out)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            float_tensors(v, out)


def state_of(model):
    import torch

    out = {f"buffer {n}": b.detach().clone() for n, b in model.named_buffers()}
    for path, m in model.named_modules():
        for key, value in vars(m).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and not key.startswith("_"):
                out[f"attr {path}.{key}"] = value.detach().clone()
            elif isinstance(value, (int, float, bool)) and not key.startswith("_") and key != "training":
                out[f"attr {path}.{key}"] = value
    return out


def _switch(model, reentrant=None):
    """(on, off) of the model's own checkpointing switch; with `reentrant`, Hugging Face's
    gradient_checkpointing_kwargs={"use_reentrant": reentrant}."""
    if reentrant is not None:
        kwargs = {"gradient_checkpointing_kwargs": {"use_reentrant": reentrant}}
        return (lambda: model.gradient_checkpointing_enable(**kwargs)), model.gradient_checkpointing_disable
    if hasattr(model, "set_grad_checkpointing"):
        return (lambda: model.set_grad_checkpointing(True)), (lambda: model.set_grad_checkpointing(False))
    if hasattr(model, "activation_checkpointing_enable"):
        return model.activation_checkpointing_enable, model.activation_checkpointing_disable
    return model.gradient_checkpointing_enable, model.gradient_checkpointing_disable


def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm by its definition (one product per group), for float64, which its kernel
    refuses: offs ends each group along the dimension it splits."""
    import torch

    if a.dim() == 3 and b.dim() == 3:
        out = torch.bmm(a, b)
    else:
        ends = [int(e) for e in offs.tolist()]
        spans = list(enumerate(zip([0] + ends[:-1], ends)))
        if a.dim() == 2 and b.dim() == 3:
            out = torch.cat([a[s:e] @ b[g] for g, (s, e) in spans])
        elif a.dim() == 3 and b.dim() == 2:
            out = torch.cat([a[g] @ b[:, s:e] for g, (s, e) in spans], dim=1)
        else:
            out = torch.stack([a[:, s:e] @ b[s:e] for g, (s, e) in spans])
    out = out + bias if bias is not None else out
    return out if out_dtype is None else out.to(out_dtype)


def _float64_ops():
    """A dispatch mode in which every op computes in float64: a lower floating dtype asked for is
    float64, a lower-precision tensor beside a float64 one is promoted, and ops without a float64
    kernel run by their definition."""
    import torch
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    lower = (torch.float32, torch.float16, torch.bfloat16)

    def in_float64(args, kwargs):
        mixed = any(isinstance(v, torch.Tensor) and v.dtype == torch.float64 for v in pytree.tree_leaves((args, kwargs)))

        def promote(v):
            if isinstance(v, torch.dtype) and v in lower:
                return torch.float64
            return v.to(torch.float64) if mixed and isinstance(v, torch.Tensor) and v.dtype in lower else v

        return pytree.tree_map(promote, (args, kwargs))

    class Float64Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            args, kwargs = in_float64(args, kwargs or {})
            if func.overloadpacket is getattr(torch.ops.aten, "_grouped_mm", None):
                return _grouped_mm(*args, **kwargs)
            return func(*args, **kwargs)

    return Float64Ops()


def _to(value, dtype):
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _to(v, dtype) for k, v in value.items()}
    return value


def one_step(pristine, inputs, mode, layers=(), own_loss=False, dtype=None):
    """Loss, gradients and state after one step of a copy of the model under `mode` (in `dtype`
    when given: float64 for the precision evidence)."""
    import contextlib

    import numpy
    import torch
    import torch.utils.checkpoint as tc

    model = copy.deepcopy(pristine)
    scope = contextlib.nullcontext()
    if dtype is not None:
        model, inputs = model.to(dtype), _to(inputs, dtype)
        scope = _float64_ops()
    if mode in ("switch", "switch-reentrant"):
        on, off = _switch(model, True if mode == "switch-reentrant" else None)
        on()
    elif mode in ("torch", "torch-reentrant"):
        blocks = [model.get_submodule(path) for path in layers]
        if not blocks:
            raise Skip("no layer list that the forward calls")
        for b in blocks:
            f = b.forward
            if mode == "torch":
                b.forward = lambda *a, f=f, **k: tc.checkpoint(f, *a, use_reentrant=False, **k)
            else:
                b.forward = lambda *a, f=f, **k: tc.checkpoint(functools.partial(f, **k), *a, use_reentrant=True)
    # Gradient hooks where data-parallel training counts them (DDP's reducer hooks each parameter's
    # gradient accumulator): how often each fires.
    fires = {}
    for n, p in model.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda _p, n=n: fires.__setitem__(n, fires.get(n, 0) + 1))
    torch.manual_seed(2)
    random.seed(2)
    numpy.random.seed(2)  # speech models draw SpecAugment masks from NumPy
    default = torch.get_default_dtype()
    try:
        if dtype is not None:
            torch.set_default_dtype(dtype)
        with scope:
            out = model(**inputs)
            if own_loss:
                loss = out.loss
            else:
                ts = []
                float_tensors(out, ts)
                g = torch.Generator().manual_seed(3)
                loss = sum((t * torch.randn(t.shape, generator=g).to(t.dtype)).sum() for t in ts if t.requires_grad)
            loss.backward()
    finally:
        torch.set_default_dtype(default)
    if mode.startswith("switch"):
        off()  # the switch's own flags are not the step's state
    grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    return {"loss": loss.detach(), "grads": grads, "state": state_of(model), "fires": fires}


def differences(plain, other):
    """{name: largest difference} of the loss and the gradients that differ (inf: one side only)."""
    import torch

    out = {}
    if not torch.equal(plain["loss"], other["loss"]):
        out["loss"] = (plain["loss"].double() - other["loss"].double()).abs().max().item()
    for n, g in plain["grads"].items():
        h = other["grads"].get(n)
        if (g is None) != (h is None):
            out[n] = float("inf")
        elif g is not None and not torch.equal(g, h):
            out[n] = (g.double() - h.double()).abs().max().item()
    return out


def compare(plain, other):
    """equal, values (the loss or gradients differ, to be told rounding or real), or what differs
    beyond values (a gradient on one side only, state, or how often a parameter's gradient hook
    fires)."""
    import torch

    for n, g in plain["grads"].items():
        if (g is None) != (other["grads"].get(n) is None):
            return f"differs: gradient of {n} on one side only"
    for n, v in plain["state"].items():
        w = other["state"].get(n)
        same = torch.equal(v, w) if isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor) else v == w
        if not same:
            return f"differs: state {n}"
    more = sorted(n for n, k in other["fires"].items() if k != plain["fires"].get(n))
    if more:  # DDP's reducer refuses a gradient hook that fires twice in one backward
        return (f"differs: the gradient hooks of {len(more)} parameters fire {other['fires'][more[0]]} times "
                f"({plain['fires'].get(more[0], 0)} without checkpoints)")
    return "values" if differences(plain, other) else "equal"


# A float32 difference is rounding when float64 shrinks it by at least this much (rounding shrinks
# by the ratio of the precisions, ~2e-9; a lost or changed contribution keeps its size).
SHRINK = 1e-4


def by_precision(model, inputs, mode, layers, plain, other, own_loss):
    """Rounding or real, for steps whose values differ: the same two steps in float64."""
    import torch

    d32 = differences(plain, other)
    worst = max(d32, key=d32.get)
    try:
        d64 = differences(one_step(model, inputs, "plain", layers, own_loss, torch.float64),
                          one_step(model, inputs, mode, layers, own_loss, torch.float64))
    except Skip:
        raise
    except Exception as e:
        return f"undecided: the float64 rerun raises {type(e).__name__}; {worst} differs by {d32[worst]:.3g}"
    real = [n for n, d in d32.items() if not d64.get(n, 0.0) <= d * SHRINK]
    if not real:
        return "rounding"
    n = max(real, key=lambda k: d32[k])
    return f"differs: {'the loss' if n == 'loss' else 'gradient of ' + n} by {d32[n]:.3g} (float64: {d64.get(n, 0.0):.3g})"


STEP_MODES = {"model": "switch", "model-reentrant": "switch-reentrant", "torch": "torch",
              "torch-reentrant": "torch-reentrant"}


def truth(model, inputs, layers, modes=MODES, own_loss=False):
    plain = one_step(model, inputs, "plain", own_loss=own_loss)
    again = compare(plain, one_step(model, inputs, "plain", own_loss=own_loss))
    if again != "equal":  # then no comparison with it means anything; ckcheck must not pass
        return {mode: f"plain step not repeatable ({again})" for mode in modes}
    out = {}
    for mode in modes:
        try:
            other = one_step(model, inputs, STEP_MODES[mode], layers, own_loss)
            out[mode] = compare(plain, other)
            if out[mode] == "values":
                out[mode] = by_precision(model, inputs, STEP_MODES[mode], layers, plain, other, own_loss)
        except Skip as e:
            out[mode] = f"skip: {e}"
        except Exception as e:  # what a training script sees
            out[mode] = f"raises: {type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e).strip() else ''}"
    return out


# ---------------------------------------------------------------------------------------------
# ckcheck


def ckcheck_verdicts(model, inputs, blocks, modes=MODES, own_loss=False):
    """ckcheck's verdict in each mode: `torch` and `torch-reentrant` on the truth's layers (the same
    program), `model` (and `model-reentrant`) with the model's own switch, which decides where
    checkpoints go."""
    import ckcheck

    out = {}
    for mode in modes:
        try:
            options = {"loss": (lambda o: o.loss)} if own_loss else {}
            if mode == "model-reentrant":
                on, off = _switch(model, True)
                options.update(checkpoint="model", enable=on, disable=off)
            else:
                options.update(checkpoint=mode, sites=None if mode == "model" else blocks)
            r = ckcheck.run(model, dict(inputs), **options)
            failing = (ckcheck.Status.FAIL, ckcheck.Status.ERROR)
            bad = [f"{c.id} ({', '.join(sorted({f.cause.value for f in c.findings}))})"
                   for c in r.checks if c.status in failing]
            warned = sorted({f.cause.value for c in r.checks if c.status is ckcheck.Status.WARN for f in c.findings})
            out[mode] = {"verdict": r.verdict.value, "failing": bad, "warnings": warned}
        except ckcheck.UsageError as e:
            out[mode] = {"verdict": "refused", "failing": [str(e)[:160]], "warnings": []}
    return out


def agree(truth_text, verdict):
    """Strict: ckcheck passes exactly where PyTorch's checkpointed step equals the plain one (rounding,
    told by float64, allowed) and fails -- not refuses, not errs -- where it differs. Only where
    PyTorch itself raises, or the plain step does not repeat, is any verdict but pass right. None
    where the truth is unknown (skipped, or rounding undecided)."""
    from ckcheck import Verdict  # a verdict read back from the sweep's results is one of its words, or "refused"

    if truth_text.startswith(("skip", "undecided")):
        return None
    if truth_text in ("equal", "rounding"):
        return verdict == Verdict.PASS
    if truth_text.startswith(("raises", "plain step not repeatable")):
        return verdict != Verdict.PASS
    return verdict == Verdict.FAIL


def run_one(case):
    import torch

    torch.set_num_threads(1)
    try:
        model, inputs, what = build(case)
    except Skip as e:
        return {"case": case, "skip": str(e)}
    except Exception as e:
        return {"case": case, "skip": f"cannot be built offline: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"}
    modes, own_loss = modes_of(case), bool(variant_of(case)[1])
    try:
        layers = blocks_of(model, inputs)  # found once: the truth and ckcheck use the same
        t = truth(model, inputs, layers, modes, own_loss)
    except Exception as e:
        return {"case": case, "what": what, "skip": f"the plain step fails: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"}
    if all(v.startswith("skip") for v in t.values()):
        return {"case": case, "what": what, "skip": "nothing to compare"}
    v = ckcheck_verdicts(model, inputs, layers or None, modes, own_loss)
    return {"case": case, "what": what, "truth": t, "ckcheck": v,
            "agree": {m: agree(t[m], v[m]["verdict"]) for m in modes}}


def run_case_process(case, timeout):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True, text=True,
                           timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"case": case, "skip": f"timed out after {timeout} s"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1][:160]
        return {"case": case, "error": f"exit {p.returncode}: {tail}"}
    return json.loads(lines[-1])


def table(results):
    rows = ["| architecture | --checkpoint | truth (PyTorch alone) | ckcheck | failing checks (causes); warnings | agree |",
            "|---|---|---|---|---|---|"]
    for r in results:
        if "skip" in r or "error" in r:
            continue
        for m in r["agree"]:
            a, v = r["agree"][m], r["ckcheck"][m]
            said = "; ".join(v["failing"]) or "-"
            if v.get("warnings"):
                said += f"; warns {', '.join(v['warnings'])}"
            rows.append(f"| {r['what']} | {m} | {r['truth'][m]} | {v['verdict']} | {said} | "
                        f"{'-' if a is None else ('yes' if a else '**no**')} |")
    skipped = [f"- {r['case']}: {r.get('skip') or r.get('error')}" for r in results if "skip" in r or "error" in r]
    return "\n".join(rows + ["", f"Skipped ({len(skipped)}):"] + skipped)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", help="run one case (hf:TYPE or timm:NAME) and print its JSON")
    ap.add_argument("--subset", choices=["all", "ci"], default="all")
    ap.add_argument("--hf", type=int, default=-1, help="transformers architectures to try, spread over every kind "
                    "(0: none; default: all)")
    ap.add_argument("--timm", type=int, default=25, help="timm families to try, spread over the list (default 25)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per case")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--markdown", help="write the table, with a summary, to this Markdown file")
    ap.add_argument("--results", help="make the table from an earlier run's --json file instead of running")
    ap.add_argument("--resume", help="an interrupted run's --json file: its finished cases are not run again")
    ap.add_argument("--check", action="store_true", help="exit 1 when ckcheck and the truth disagree")
    ap.add_argument("--list", choices=["all", "ci"], help="print the cases of a subset, one per line, and exit")
    a = ap.parse_args()
    if a.list:
        print("\n".join(CI_SUBSET if a.list == "ci" else spread(hf_cases(), a.hf) + spread(timm_cases(), a.timm)))
        return 0
    if a.one:
        result = run_one(a.one)
        print(json.dumps(result))
        if not a.check:
            return 0
        if "agree" in result:
            return 1 if False in result["agree"].values() else 0
        if "ModuleNotFoundError" in str(result.get("skip", "")):
            return 77  # transformers or timm is not installed here: skipped
        return 1  # a checked case that compares nothing proves nothing
    t0 = time.time()
    if a.results:  # a table from an earlier run's --json
        with open(a.results) as f:
            results = json.load(f)
        cases = [r["case"] for r in results]
    else:
        cases = CI_SUBSET if a.subset == "ci" else spread(hf_cases(), a.hf) + spread(timm_cases(), a.timm)
        done = {}
        if a.resume and os.path.exists(a.resume):  # cases an interrupted run finished
            with open(a.resume) as f:
                done = {r["case"]: r for r in json.load(f)}
        todo = [c for c in cases if c not in done]
        with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
            futures = {pool.submit(run_case_process, c, a.timeout): c for c in todo}
            for future in concurrent.futures.as_completed(futures):
                done[futures[future]] = future.result()
                if a.json:  # after every case, so that an interrupted run can be resumed
                    with open(a.json + ".part", "w") as f:
                        json.dump([done[c] for c in cases if c in done], f, indent=1)
                    os.replace(a.json + ".part", a.json)
        results = [done[c] for c in cases]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    print(table(results))
    compared = [r for r in results if "agree" in r]
    disagree = [(r["case"], m) for r in compared for m in r["agree"] if r["agree"][m] is False]
    summary = (f"{len(cases)} attempted ({sum(c.startswith('hf:') for c in cases)} transformers, "
               f"{sum(c.startswith('timm:') for c in cases)} timm), {len(compared)} compared "
               f"({sum(1 for r in compared for m in r['agree'] if r['agree'][m] is not None)} verdicts), "
               f"{len(disagree)} disagreements ({time.time() - t0:.0f} s): {disagree}")
    print("\n" + summary)
    if a.markdown:
        import transformers
        import timm
        import torch

        with open(a.markdown, "w") as f:
            f.write(f"# The architecture sweep\n\nWritten by `scripts/arch_sweep.py --markdown` (torch {torch.__version__}, "
                    f"transformers {transformers.__version__}, timm {timm.__version__}; command: "
                    f"`{' '.join(['scripts/arch_sweep.py'] + sys.argv[1:])}`).\n\n{summary}\n\n"
                    f"Truth: one training step in PyTorch alone, compared bitwise with the plain step; where values "
                    f"differ, the same two steps in float64 tell `rounding` (every difference shrinks by {SHRINK:g} "
                    f"or more) from a real difference. Strict scoring: ckcheck agrees when it passes exactly where "
                    f"the truth is `equal` or `rounding` and fails (not refuses, not errs) where it differs; where "
                    f"PyTorch raises, any verdict but pass agrees. Cases `+router_logits` train with the model's own "
                    f"loss on labels (the load-balancing loss included) under both switch modes.\n\n{table(results)}\n")
    return 1 if a.check and disagree else 0


if __name__ == "__main__":
    sys.exit(main())
