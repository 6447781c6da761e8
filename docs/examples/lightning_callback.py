"""A Lightning run that checks its checkpointed step once, before the first optimizer step.

    python docs/examples/lightning_callback.py              # trains
    python docs/examples/lightning_callback.py --reentrant  # stopped before the first update

Exit status 0 when the run trained, 1 when ckcheck stopped it (the report is printed)."""

import sys

import lightning.pytorch as L
import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

import ckcheck
from ckcheck.lightning import CkcheckCallback


class LitMoE(L.LightningModule):
    def __init__(self, reentrant):
        super().__init__()
        self.model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
            vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            num_experts=4, num_experts_per_tok=2, output_router_logits=True, use_cache=False))
        self.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main(reentrant):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": x, "labels": x.clone()} for x in ids]
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[CkcheckCallback()])
    try:
        trainer.fit(LitMoE(reentrant), torch.utils.data.DataLoader(data, batch_size=2))
    except ckcheck.CheckpointMismatch as stopped:
        print(stopped.report.console)
        return 1
    print(f"trained {trainer.global_step} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(reentrant="--reentrant" in sys.argv))
