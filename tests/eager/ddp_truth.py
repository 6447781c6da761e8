"""PyTorch alone, one rank of a DistributedDataParallel run (no ckcheck code): the truth the
data-parallel tests compare ckcheck's verdicts with.

python ddp_truth.py FIXTURE_FILE FACTORY CHECKPOINT OUT.json, with RANK, WORLD_SIZE and
MASTER_PORT set; CHECKPOINT is none, model (the model's own switch,
gradient_checkpointing_enable()), torch, torch-no-rng (preserve_rng_state=False) or
torch-reentrant (every block of model.blocks under torch.utils.checkpoint). Two training steps on
this rank's shard of the factory's batch; writes
{"error": the first error, "grads": {name: gradient as a list, or null}} of the first step.
"""

import datetime
import importlib.util
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint


def made_by(path, factory):
    """What the fixture file's factory returns, under the seed ckcheck gives it."""
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return getattr(module, factory)()


def join():
    """(rank, world size) of this process, in a Gloo group on 127.0.0.1."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    return rank, world


def main(path, factory, mode, out):
    made = made_by(path, factory)
    if isinstance(made, dict):
        model, x, options = made["model"], made["inputs"], made.get("ddp", {})
    else:
        (model, x), options = made, {}
    if mode == "model":
        model.gradient_checkpointing_enable()
    elif mode != "none":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = Checkpointed(block, mode == "torch-reentrant", mode != "torch-no-rng")
    rank, world = join()
    ddp = DistributedDataParallel(model, **options)
    shard = x.chunk(world)[rank]
    result = {"error": "", "grads": None}
    for step in range(2):
        try:
            ddp(shard).float().pow(2).mean().backward()
        except RuntimeError as e:
            result["error"] = result["error"] or str(e).splitlines()[0]
        if step == 0:
            result["grads"] = {n.replace(".block.", ".", 1): (p.grad.tolist() if p.grad is not None else None)
                               for n, p in model.named_parameters() if p.requires_grad}
        model.zero_grad(set_to_none=True)
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    # The interpreter's teardown can abort in Gloo's threads; the result is written.
    sys.stdout.flush()
    os._exit(0)


class Checkpointed(torch.nn.Module):
    def __init__(self, block, reentrant, preserve_rng_state=True):
        super().__init__()
        self.block = block
        self.reentrant = reentrant
        self.preserve_rng_state = preserve_rng_state

    def forward(self, h):
        return checkpoint(self.block, h, use_reentrant=self.reentrant, preserve_rng_state=self.preserve_rng_state)


if __name__ == "__main__":
    main(*sys.argv[1:])
