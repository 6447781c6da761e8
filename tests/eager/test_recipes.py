"""The fine-tuning recipes users run, checked as they are set up: QLoRA -- a 4-bit nf4 base
(bitsandbytes Linear4bit, on the CPU) prepared with PEFT's prepare_model_for_kbit_training and LoRA
adapters with dropout -- under the switch those helpers turn on. Truth from PyTorch alone: the LoRA
gradients with the switch on against off, from the same random state. ckcheck checks the switch
with the settings the recipe gave it (not the switch's defaults)."""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

import ckcheck  # noqa: E402


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    """A tiny Llama with random weights, saved where from_pretrained can quantize it (no hub)."""
    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, use_cache=False)).save_pretrained(folder)
    return folder


def qlora(folder, checkpointing=True, **ckpt_kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = transformers.LlamaForCausalLM.from_pretrained(folder, device_map="cpu", quantization_config=(
            transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                            bnb_4bit_compute_dtype=torch.float32)))
        base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=checkpointing,
                                                    gradient_checkpointing_kwargs=ckpt_kwargs)
        torch.manual_seed(1)
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj", "v_proj"],
                                                          init_lora_weights=False))
    model.train()
    return model


def batch():
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    return {"input_ids": ids, "labels": ids.clone()}


def lora_grads(model):
    torch.manual_seed(3)
    model(**batch()).loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def truth_differs(folder, **ckpt_kwargs):
    plain, ckpt = lora_grads(qlora(folder, checkpointing=False)), lora_grads(qlora(folder, **ckpt_kwargs))
    assert plain.keys() == ckpt.keys() and plain
    return any(plain[n] is None or ckpt[n] is None or not torch.equal(plain[n], ckpt[n]) for n in plain)


def test_qlora_passes_under_the_switch_its_recipe_turns_on(saved_llama):
    assert not truth_differs(saved_llama, use_reentrant=False)
    model = qlora(saved_llama, use_reentrant=False)
    assert type(model.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"
    report = ckcheck.run(model, batch(), loss=lambda out: out.loss)
    assert report.passed, report.console
    assert report.config["checkpoint"] == "model" and "checked as it came" in report.model["checkpoint_reason"]


def test_qlora_with_the_rng_left_unreplayed_fails_with_rng(saved_llama):
    assert truth_differs(saved_llama, use_reentrant=False, preserve_rng_state=False)
    report = ckcheck.run(qlora(saved_llama, use_reentrant=False, preserve_rng_state=False), batch(),
                         loss=lambda out: out.loss)
    assert report.verdict is ckcheck.Verdict.FAIL
    assert ckcheck.Cause.RNG in {f.cause for f in report.findings}, report.console
