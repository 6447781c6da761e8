"""Sharded training in PyTorch's FSDP2: `ckcheck run --parallel fsdp --world-size N`, fully_shard on
each block and the root, with and without FSDP2's mixed precision. What PyTorch does comes from
fsdp_truth.py, PyTorch's FSDP2 alone on two processes; every detection has its negative control.
Gloo on 127.0.0.1 only.
"""

import os
import sys

import pytest

from conftest import FIXTURES, fixture
from test_parallel import _whole_and_shards, pytorch_truth

sys.path.insert(0, FIXTURES)

MODELS = fixture("parallel.py")
TRUTH = os.path.join(os.path.dirname(__file__), "fsdp_truth.py")


def pytorch_fsdp(tmp_path, factory, checkpoint, precision="off", world=2):
    """PyTorch alone: each rank's {"error", "grads"} under FSDP2 with every block checkpointed."""
    return pytorch_truth(tmp_path, TRUTH, [factory, checkpoint, precision], world)


def fsdp_run(ckcheck, factory, checkpoint, *extra, world=2):
    return ckcheck("run", "--model", f"{MODELS}:{factory}", "--checkpoint", checkpoint, "--parallel", "fsdp",
                   "--world-size", world, "--timeout", 300, *extra)


def test_transformer_under_fsdp2_with_a_non_reentrant_checkpoint_passes(ckcheck, tmp_path):
    # PyTorch: FSDP2's full gradients with every block checkpointed equal the plain ones, bitwise.
    plain, ckpt = pytorch_fsdp(tmp_path, "transformer", "none"), pytorch_fsdp(tmp_path, "transformer", "torch")
    assert plain[0]["grads"] == ckpt[0]["grads"] and not ckpt[0]["error"]
    r = fsdp_run(ckcheck, "transformer", "torch")
    assert r.code == 0, r.out + r.err
    assert r.report["config"]["parallel"] == "fsdp" and r.report["config"]["world_size"] == 2
    assert "PyTorch's FSDP2 (fully_shard) over gloo" in r.out
    assert r.check("data-parallel")["status"] == "pass" and "averaged over 2 ranks" in r.check("data-parallel")["summary"]
    assert r.check("hooks")["status"] == "pass" and r.check("gradients")["status"] == "pass"


def test_a_hugging_face_models_own_switch_checkpoints_in_the_sharded_copy(ckcheck, tmp_path):
    # PyTorch: with FSDP2 on its layers, GPT-2's own switch still runs a checkpoint per layer
    # (transformers checkpoints the outermost class's forward: FSDP2's subclass of each layer).
    gpt2 = fixture("tiny_gpt2.py")
    truth = pytorch_truth(tmp_path, TRUTH, ["make_model", "model", "off"], models=gpt2)
    assert truth[0]["checkpoint_calls"] == 2 and not truth[0]["error"], truth[0]["error"]
    r = ckcheck("run", "--model", f"{gpt2}:make_model", "--parallel", "fsdp", "--world-size", 2, "--timeout", 300)
    assert r.code == 0, r.out + r.err
    # The checkpointed step under FSDP2 ran and recomputed both layers, as PyTorch's does.
    assert "2 checkpointed units reproduce their forwards" in r.check("determinism")["summary"], r.out
    assert "inputs of 2 checkpointed calls" in r.check("input-mutation")["summary"], r.out
    assert r.check("gradients")["status"] == "pass" and r.check("rank-rng")["status"] == "pass", r.out


def test_a_checkpoint_around_fsdp2_units_is_not_blamed_for_fsdp2s_own_ops(ckcheck, tmp_path):
    # PyTorch: timm's own switch checkpoints each block from the ViT's forward, around the block's
    # FSDP2 unit, so the unit's all-gather runs inside the checkpoint in the forward and not in the
    # recompute; under bf16 mixed precision the step trains without error and with the gradients of
    # the same model with the switch off, bitwise.
    vision = fixture("vision.py")
    plain = pytorch_truth(tmp_path, TRUTH, ["timm_vit", "none", "bf16"], models=vision)
    switched = pytorch_truth(tmp_path, TRUTH, ["timm_vit", "enable", "bf16"], models=vision)
    assert not switched[0]["error"] and plain[0]["grads"] == switched[0]["grads"], switched[0]["error"]
    r = ckcheck("run", "--model", f"{vision}:timm_vit", "--checkpoint", "model", "--parallel", "fsdp",
                "--mixed-precision", "bf16", "--world-size", 2, "--timeout", 300)
    assert r.code == 0, r.out + r.err
    assert r.check("autocast")["status"] == "pass" and "FSDP2's mixed precision (bf16)" in r.check("autocast")["summary"]
    # The negative control, a recompute in another dtype, is test_a_recompute_in_another_dtype_under_mixed_precision_is_found.


def test_world_size_four_and_the_factorys_fsdp_options(ckcheck):
    r = fsdp_run(ckcheck, "transformer_reshard_kept", "torch", world=4)
    assert r.code == 0, r.out + r.err
    assert r.check("data-parallel")["status"] == "pass" and "over 4 ranks" in r.check("data-parallel")["summary"]


def test_reentrant_checkpoint_on_a_frozen_input_lora_model_loses_the_adapters_gradients(ckcheck, tmp_path):
    # PyTorch: under FSDP2 the reentrant checkpoint gives the adapters no gradient (their blocks'
    # inputs need none); the non-reentrant one gives them.
    reentrant = pytorch_fsdp(tmp_path, "lora", "torch-reentrant")
    assert reentrant[0]["grads"]["blocks.0.proj.down.weight"] is None
    assert pytorch_fsdp(tmp_path, "lora", "torch")[0]["grads"]["blocks.0.proj.down.weight"] is not None

    r = fsdp_run(ckcheck, "lora", "torch-reentrant")
    assert r.code == 1, r.out + r.err
    hooks, grads = r.check("hooks"), r.check("gradients")
    assert hooks["status"] == "fail" and grads["status"] == "fail"
    assert "blocks.0.proj.down.weight" in {f["tensor"] for f in hooks["findings"]}
    assert all(f["cause"] == "hook-count" and "FSDP2 never reduced" in f["message"] for f in hooks["findings"])
    assert {f["cause"] for f in grads["findings"]} == {"missing-grad"}
    # The negative control: the same model under the non-reentrant checkpoint.
    ok = fsdp_run(ckcheck, "lora", "torch")
    assert ok.code == 0 and ok.check("hooks")["status"] == "pass", ok.out + ok.err


def test_a_recompute_in_another_dtype_under_mixed_precision_is_found(ckcheck, tmp_path):
    # PyTorch: the planted blocks recompute in float32 where FSDP2's bf16 parameters ran their
    # forward, and torch.utils.checkpoint stops on the saved tensors' dtypes; in float32 training,
    # or with the recompute in the forward's dtype, the step is fine.
    planted = pytorch_fsdp(tmp_path, "upcast_in_recompute", "torch", "bf16")
    assert "CheckpointError" in planted[0]["error"], planted[0]["error"]
    assert not pytorch_fsdp(tmp_path, "upcast_in_recompute", "torch", "off")[0]["error"]
    assert not pytorch_fsdp(tmp_path, "same_dtype_in_recompute", "torch", "bf16")[0]["error"]

    r = fsdp_run(ckcheck, "upcast_in_recompute", "torch", "--mixed-precision", "bf16")
    assert r.code == 1, r.out + r.err
    assert "parameters in bf16" in r.out
    dtype = r.check("autocast")
    assert dtype["status"] == "fail", dtype
    assert {f["cause"] for f in dtype["findings"]} == {"recompute-dtype"}
    assert {f["site"] for f in dtype["findings"]} <= {"blocks.0", "blocks.1"}
    assert "float" in dtype["findings"][0]["message"] or "Float" in dtype["findings"][0]["message"]
    assert r.check("gradients")["status"] == "fail"
    assert {f["cause"] for f in r.check("gradients")["findings"]} == {"recompute-dtype"}
    # The negative controls: no mixed precision, and a recompute in its forward's dtype.
    off = fsdp_run(ckcheck, "upcast_in_recompute", "torch")
    assert off.code == 0, off.out + off.err
    same = fsdp_run(ckcheck, "same_dtype_in_recompute", "torch", "--mixed-precision", "bf16")
    assert same.code == 0, same.out + same.err
    assert same.check("autocast")["status"] == "pass" and "mixed precision (bf16)" in same.check("autocast")["summary"]
    assert "mixed precision bf16" in same.check("data-parallel")["summary"]


def test_batchnorm_statistics_per_shard_fail_data_parallel(ckcheck):
    # PyTorch: the halves' gradients do not average to the whole batch's (per-shard statistics).
    import torch

    whole, averaged = _whole_and_shards("convnet_batchnorm")
    assert not all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(whole, averaged))
    r = fsdp_run(ckcheck, "convnet_batchnorm", "torch", "--checks", "gradients,data-parallel")
    assert r.code == 1 and r.check("data-parallel")["status"] == "fail", r.out + r.err
    assert r.check("gradients")["status"] == "pass"


@pytest.mark.parametrize("args, message", [
    (["--mixed-precision", "bf16"], "add --parallel fsdp"),
    (["--parallel", "ddp", "--world-size", "2", "--mixed-precision", "bf16"], "add --parallel fsdp"),
    (["--parallel", "fsdp"], "add --world-size N"),
])
def test_usage_errors(ckcheck, args, message):
    r = ckcheck("run", "--model", f"{MODELS}:transformer", *args)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and message in lines[0], r.err


def test_unknown_fsdp_options_are_refused(ckcheck, tmp_path):
    factory = tmp_path / "bad.py"
    factory.write_text("import torch\n"
                       "def make():\n"
                       "    return {'model': torch.nn.Linear(4, 4), 'inputs': torch.randn(2, 4),\n"
                       "            'fsdp': {'reshard': True}}\n")
    r = ckcheck("run", "--model", f"{factory}:make", "--parallel", "fsdp", "--world-size", "2", "--timeout", 60)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "unknown keys ['reshard']" in lines[0], r.err


def test_several_steps_compare_with_one_process_taking_the_same_updates(ckcheck):
    # One process on the whole batch takes SGD steps world_size times smaller (its gradient is the
    # ranks' sum), so later steps start from the ranks' parameters; BatchNorm's per-shard
    # statistics still fail (the negative control).
    r = fsdp_run(ckcheck, "transformer", "torch", "--steps", 3)
    assert r.code == 0 and r.check("data-parallel")["status"] == "pass", r.out + r.err
    bn = fsdp_run(ckcheck, "convnet_batchnorm", "torch", "--steps", 3, "--checks", "gradients,data-parallel")
    assert bn.code == 1 and bn.check("data-parallel")["status"] == "fail", bn.out + bn.err


def test_a_reentrant_checkpoints_forward_is_traced_inside_its_autograd_function(ckcheck):
    # PyTorch's reentrant checkpoint runs the forward inside CheckpointFunction, one level deeper
    # than the recompute: the dtype comparison takes the outermost operators of each. Before, the
    # forward looked empty and a correct step failed.
    ok = fsdp_run(ckcheck, "transformer", "torch-reentrant", "--mixed-precision", "bf16")
    assert ok.code == 0 and ok.check("autocast")["status"] == "pass", ok.out + ok.err
    amp = ckcheck("run", "--model", f"{MODELS}:transformer", "--checkpoint", "torch-reentrant", "--amp", "bf16")
    assert amp.code == 0 and amp.check("autocast")["status"] == "pass", amp.out + amp.err


def test_what_fully_shard_refuses_is_one_line_and_small_parameters_shard(ckcheck, tmp_path):
    factory = tmp_path / "scalars.py"
    factory.write_text("import torch\n"
                       "from torch import nn\n"
                       "class Net(nn.Module):\n"
                       "    def __init__(self, shape):\n"
                       "        super().__init__()\n"
                       "        self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in range(2))\n"
                       "        self.scale = nn.Parameter(torch.full(shape, 0.5))\n"
                       "    def forward(self, x):\n"
                       "        for b in self.blocks:\n"
                       "            x = x + self.scale * torch.tanh(b(x))\n"
                       "        return x\n"
                       "def scalar():\n"
                       "    return Net(()), torch.randn(8, 3)\n"
                       "def one_element():\n"
                       "    return Net((1,)), torch.randn(8, 3)\n")
    # PyTorch: fully_shard refuses a 0-dim parameter; ckcheck says so in one line.
    r = ckcheck("run", "--model", f"{factory}:scalar", "--checkpoint", "torch", "--parallel", "fsdp",
                "--world-size", 2, "--timeout", 60)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "fully_shard cannot shard the model" in lines[0], r.err
    # Parameters with fewer rows than ranks (empty shards on some) train and compare.
    ok = ckcheck("run", "--model", f"{factory}:one_element", "--checkpoint", "torch", "--parallel", "fsdp",
                 "--world-size", 4, "--timeout", 300)
    assert ok.code == 0 and ok.check("data-parallel")["status"] == "pass", ok.out + ok.err


def test_bench_measures_memory_per_rank_through_fsdp2(ckcheck):
    r = ckcheck("bench", "--model", f"{MODELS}:transformer", "--checkpoint", "torch", "--parallel", "fsdp",
                "--world-size", 2, "--policies", "none,every:1", "--steps", 1, "--warmup", 1, "--timeout", 300)
    assert r.code == 0, r.out + r.err
    assert r.report["parallel"] == "fsdp" and r.report["world_size"] == 2, r.report
    assert "1/2 of" in r.report["parallel_note"]
    state = r.report["parameter_bytes"] + r.report["gradient_bytes"]
    assert r.report["rank_state_bytes"] == (state + 1) // 2
    assert r.report["recommendation"] is None
    policies = {p["policy"]: p for p in r.report["policies"]}
    for p in policies.values():
        assert len(p["rank_peak_bytes"]) == 2 and min(p["rank_peak_bytes"]) > 0, p
    # Checkpointing every block lowers each rank's peak under FSDP2, as it lowers one process's.
    assert max(policies["every:1"]["rank_peak_bytes"]) < min(policies["none"]["rank_peak_bytes"])
    assert policies["every:1"]["peak_bytes"] < policies["none"]["peak_bytes"]


@pytest.mark.parametrize("args, message", [
    (["--world-size", "2"], "--world-size applies to bench --parallel"),
    (["--parallel", "fsdp"], "add --world-size N"),
])
def test_bench_usage_errors(ckcheck, args, message):
    r = ckcheck("bench", "--model", f"{MODELS}:transformer", *args)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and message in lines[0], r.err
