"""PyTorch alone, one rank of an FSDP2 run (no ckcheck code): the truth the sharded tests compare
ckcheck's verdicts with.

python fsdp_truth.py FIXTURE_FILE FACTORY CHECKPOINT PRECISION OUT.json, with RANK, WORLD_SIZE and
MASTER_PORT set; CHECKPOINT is none, torch or torch-reentrant (each block of model.blocks under
torch.utils.checkpoint, inside its fully_shard unit) or model (the Hugging Face model's own switch
on, each of its checkpointing layers sharded, the checkpoints they call counted as
"checkpoint_calls") or enable (the factory's own "enable" switch on, each of model.blocks sharded:
timm's set_grad_checkpointing checkpoints from the root's forward, around the sharded blocks); PRECISION is off or bf16 (MixedPrecisionPolicy
with the parameters in bf16, gradients reduced in float32). fully_shard on each block, then the
root. One training step on this rank's shard of the factory's batch; writes {"error": the first
error, "grads": {name: the full gradient as a list, or null}}.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ddp_truth import Checkpointed, join, made_by  # this folder is the script's


def _counted(checkpoint, calls):
    def call(*args, **kwargs):
        calls[0] += 1
        return checkpoint(*args, **kwargs)

    return call


def main(path, factory, mode, precision, out):
    made = made_by(path, factory)
    model, x = (made["model"], made["inputs"]) if isinstance(made, dict) else made
    rank, world = join()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16" \
        else MixedPrecisionPolicy()
    calls = [0]
    if mode == "model":
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        blocks = [m for m in model.modules() if hasattr(type(m), "gradient_checkpointing")]
        for block in blocks:  # the checkpoint each layer calls, counted (transformers documents this attribute)
            block._gradient_checkpointing_func = _counted(block._gradient_checkpointing_func, calls)
    elif mode == "enable":
        made["enable"]()
        blocks = list(model.blocks)
    else:
        blocks = list(model.blocks)
        for i, block in enumerate(blocks):
            if mode != "none":
                blocks[i] = model.blocks[i] = Checkpointed(block, mode == "torch-reentrant")
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    result = {"error": "", "grads": None}
    try:
        if isinstance(x, dict):
            y = model(**{k: v.chunk(world)[rank] for k, v in x.items()})
        else:
            y = model(x.chunk(world)[rank])
        (y.loss if hasattr(y, "loss") else y.float().pow(2).mean()).backward()
    except Exception as e:  # what the user's training loop would see
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    grads = {}
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):  # a failed backward may leave a plain tensor
            g = g.full_tensor()
        grads[n.replace(".block.", ".", 1)] = g.tolist() if g is not None else None
    result["grads"] = grads
    result["checkpoint_calls"] = calls[0]
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
