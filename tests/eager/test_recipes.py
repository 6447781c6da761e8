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


class _Block(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


class _Float8Net(torch.nn.Module):
    """Blocks whose Linears torchao converts to float8 training (emulated: runs on the CPU), a head
    left in full precision, as torchao's recipes leave the output layer."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(2))
        self.head = torch.nn.Linear(64, 16)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def float8_net():
    float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    model = _Float8Net()
    float8.convert_to_float8_training(model, config=float8.Float8LinearConfig(emulate=True),
                                      module_filter_fn=lambda module, fqn: fqn != "head")
    return model


def float8_truth_differs(reentrant):
    """PyTorch alone: every block under torch.utils.checkpoint against none, same weights and input."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(4))

    def grads(checkpointed):
        model = float8_net()
        h = x
        for block in model.blocks:
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=reentrant) if checkpointed else block(h)
        model.head(h).square().sum().backward()
        return [p.grad for p in model.parameters()]

    return any(a is None or b is None or not torch.equal(a, b) for a, b in zip(grads(False), grads(True))), x


@pytest.mark.parametrize("checkpoint, reentrant", [("torch", False), ("torch-reentrant", True)])
def test_float8_training_is_judged_as_pytorch_alone_judges_it(checkpoint, reentrant):
    differs, x = float8_truth_differs(reentrant)
    model = float8_net()
    assert type(model.blocks[0].a).__name__ == "Float8Linear"
    report = ckcheck.run(model, (x,), checkpoint=checkpoint, loss=lambda out: out.square().sum())
    assert report.passed is not differs, report.console
    if differs:  # the reentrant checkpoint on an input that does not require grad: the first block's gradients lost
        assert ckcheck.Cause.MISSING_GRAD in {f.cause for f in report.findings}, report.console
