"""An Accelerate training loop that checks its checkpointed step once, before the first update.

    python docs/examples/accelerate_loop.py              # trains
    python docs/examples/accelerate_loop.py --reentrant  # stopped before the first update

Exit status 0 when the loop trained, 1 when ckcheck stopped it (the report is printed)."""

import sys

import torch
from accelerate import Accelerator
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

import ckcheck


def main(reentrant):
    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, output_router_logits=True, use_cache=False))
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": x, "labels": x.clone()} for x in ids]
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=2))
    for step, batch in enumerate(loader):
        if step == 0:
            try:
                ckcheck.check_step(model, batch, loss=lambda out: out.loss)  # raises CheckpointMismatch
            except ckcheck.CheckpointMismatch as stopped:
                print(stopped.report.console)
                return 1
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print(f"trained {step + 1} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(reentrant="--reentrant" in sys.argv))
