#!/usr/bin/env python3
"""Scripts small models whose state lives outside parameters and buffers, or whose modules are
frozen in eval mode, or whose sites take optional tensors -- each a class of real model that
ckcheck must judge right -- and saves them in OUT_DIR:

  counter_outside.pt  a step counter (int attribute) at the root, outside every site, anneals a
                      temperature: correct; the plain step must repeat from restored state
  lazy_init.pt        ActNorm-style blocks that initialise their scale from the first batch,
                      flagged by a bool attribute: correct
  ema_attribute.pt    blocks.1 keeps a running average in a plain tensor attribute (a forgotten
                      register_buffer), updated in its forward: updated twice when checkpointed
  counter_inside.pt   blocks.1 counts its calls in an int attribute and scales by it: stateful
  frozen_bn.pt        conv blocks with BatchNorm frozen in eval mode (fine-tuning): correct as
                      saved; with every module in train mode the statistics update twice
  parent_updated.pt   the root updates, after the forward, a buffer that b reads (delayed scaling
                      factors, running offsets): the recompute reads the new value
  needs_grad.pt       blocks.1's forward needs grad mode (as code that takes derivatives inside
                      its forward does) and raises without it: under a checkpoint whose forward
                      runs without grad the step throws, and the verdict is error naming the site
  two_inplace.pt      site b takes two tensors and changes both in place: every one is named
  encoder.pt          nn.TransformerEncoder (2 layers, dropout) called with a causal mask and a
                      padding mask: its layers take Optional[Tensor] arguments
  kind_KIND.pt        one per kind of state (parameter, buffer, attribute, scalar, container, mode):
                      blocks.1 updates that state once per call without changing what it computes,
                      so the checkpointed step differs from the plain one in that state alone

Exits 77 (the tests count it as skipped) when torch cannot be imported.
"""
import os
import sys
from typing import List, Optional

try:
    import torch
    from torch import nn
except Exception as e:  # noqa: BLE001 - any import failure means: no Python side here
    print(f"skipping: {e}")
    sys.exit(77)


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Stack(nn.Module):
    """input -> embed -> blocks.0 .. blocks.{n-1} -> head."""

    def __init__(self, blocks, width=16):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class CounterOutside(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = Stack([Block(16) for _ in range(3)])
        self.step: int = 0

    def forward(self, x):
        self.step += 1
        temperature = 1.0 / (1.0 + 0.5 * self.step)
        return self.net(x) * temperature


class ActNormBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.initialized: bool = False
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x):
        if not self.initialized:
            with torch.no_grad():
                self.scale.copy_(1.0 / (x.std(0) + 1e-6))
            self.initialized = True
        return x + torch.tanh(self.fc(x * self.scale))


class EmaBlock(Block):
    def __init__(self, width: int):
        super().__init__(width)
        self.ema = torch.zeros(width)  # a plain attribute, not a buffer

    def forward(self, x):
        with torch.no_grad():
            self.ema = 0.9 * self.ema + 0.1 * x.mean(0)
        return x + torch.tanh(self.fc(x))


class CountingBlock(Block):
    def __init__(self, width: int):
        super().__init__(width)
        self.calls: int = 0

    def forward(self, x):
        self.calls += 1
        return x + torch.tanh(self.fc(x)) * (1.0 + 0.1 * self.calls)


class ConvBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return x + torch.relu(self.bn(self.conv(x)))


class FrozenBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList([ConvBlock(8) for _ in range(2)])
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h.mean((2, 3)))


class ShiftedBlock(Block):
    def __init__(self, width: int):
        super().__init__(width)
        self.register_buffer("shift", torch.zeros(width))

    def forward(self, x):
        # The shift is not saved for the backward (fc keeps its own input): the plain step is fine.
        return x + torch.tanh(self.fc(x + self.shift))


class ParentUpdated(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.a = Block(16)
        self.b = ShiftedBlock(16)
        self.c = Block(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        y = self.head(self.c(self.b(self.a(self.embed(x)))))
        with torch.no_grad():
            self.b.shift.add_(0.5)  # next step's offset, written into the buffer b reads
        return y


class NeedsGradBlock(Block):
    def forward(self, x):
        if not torch.is_grad_enabled():
            raise RuntimeError("NeedsGradBlock: the forward takes derivatives and needs grad mode")
        return x + torch.tanh(self.fc(x))


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, y):
        x.mul_(2)
        y.add_(1)
        return torch.tanh(self.fc(x)) * y


class TwoInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.gate = nn.Linear(8, 16)
        self.b = TwoInputs()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.b(self.embed(x), self.gate(x)))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 50)

    def forward(self, ids):
        s = ids.size(1)
        causal = torch.triu(torch.full((s, s), float("-inf")), 1)
        padding = ids == 0
        return self.head(self.encoder(self.embed(ids), mask=causal, src_key_padding_mask=padding))


class KindBlock(nn.Module):
    history: List[int]
    calls: int

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(16, 16)
        self.child = nn.Identity()
        self.steps = nn.Parameter(torch.zeros(()), requires_grad=False)
        self.register_buffer("seen", torch.zeros(()))
        self.total = torch.zeros(())
        self.calls = 0
        self.history = []

    def forward(self, x):
        with torch.no_grad():
            if self.kind == "parameter":
                self.steps.add_(1)
            elif self.kind == "buffer":
                self.seen.add_(1)
            elif self.kind == "attribute":
                self.total = self.total + 1
            elif self.kind == "scalar":
                self.calls += 1
            elif self.kind == "container":
                self.history.append(len(self.history))
            elif self.kind == "mode":
                self.child.training = not self.child.training
        return x + torch.tanh(self.fc(x))


STATE_KINDS = ["parameter", "buffer", "attribute", "scalar", "container", "mode"]


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    models = {
        "counter_outside": CounterOutside(),
        "lazy_init": Stack([ActNormBlock(16) for _ in range(3)]),
        "ema_attribute": Stack([Block(16), EmaBlock(16), Block(16)]),
        "counter_inside": Stack([Block(16), CountingBlock(16), Block(16)]),
        "frozen_bn": FrozenBn(),
        "parent_updated": ParentUpdated(),
        "needs_grad": Stack([Block(16), NeedsGradBlock(16), Block(16)]),
        "two_inplace": TwoInplace(),
        "encoder": Encoder(),
        **{f"kind_{k}": Stack([KindBlock("none"), KindBlock(k)]) for k in STATE_KINDS},
    }
    for name, model in models.items():
        model.train()
        if name == "frozen_bn":
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()  # frozen statistics, as fine-tuning recipes do
        torch.jit.script(model).save(os.path.join(out, name + ".pt"))
    print("saved", sorted(os.listdir(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
