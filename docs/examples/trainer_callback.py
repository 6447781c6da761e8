"""A Hugging Face Trainer run checked by ckcheck before its first optimizer step.

    python docs/examples/trainer_callback.py              # trains: the non-reentrant switch is exact
    python docs/examples/trainer_callback.py --reentrant  # stopped: the router's load-balancing gradient is lost

A tiny Qwen2-MoE with router logits on (random weights, CPU, a few seconds). Exit status 0 when the
run trained, 1 when ckcheck stopped it (the report is printed)."""

import sys
import tempfile

import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Trainer, TrainingArguments

import ckcheck
from ckcheck.trainer import CkcheckCallback


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def main(reentrant):
    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, output_router_logits=True, use_cache=False))
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=2, max_steps=2, use_cpu=True,
                             report_to=[], save_strategy="no", disable_tqdm=True, activation_checkpointing=True,
                             activation_checkpointing_kwargs={"use_reentrant": reentrant})
    callback = CkcheckCallback()  # on_failure="warn" to log and go on
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback])
    try:
        trainer.train()
    except ckcheck.CheckpointMismatch as stopped:
        print(stopped.report.console)
        return 1
    print(f"trained {trainer.state.global_step} steps; ckcheck: {callback.report.verdict}, "
          f"the check cost {callback.report.cost['plain_steps']:.1f} plain steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(reentrant="--reentrant" in sys.argv))
