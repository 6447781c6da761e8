"""PyTorch alone, one rank of a Gloo group (no ckcheck code): the first block's output of a fixture's
model, in training mode, on the same input on every rank, after the rank seeds its default
generator with its rank (as data-parallel training seeds each rank). Ranks whose outputs are equal
drew the same random numbers.

python rank_draws_truth.py FIXTURE_FILE FACTORY OUT.json, with RANK, WORLD_SIZE and MASTER_PORT set;
writes {"error": "", "output": [...]}.
"""

import json
import sys

import torch
import torch.distributed as dist

from ddp_truth import join, made_by  # this folder is the script's


def main(path, factory, out):
    model, x = made_by(path, factory)
    rank, _ = join()
    torch.manual_seed(rank)
    model.train()
    with torch.no_grad():
        y = model.blocks[0](x)
    with open(out, "w") as f:
        json.dump({"error": "", "output": y.flatten().tolist()}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
