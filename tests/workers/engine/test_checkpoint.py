"""Checkpoint layout and exact resume of FSDPEngine, at world size 1 (in-process) and 2 (spawned ranks)."""

import json
import os

import pytest
import torch

from tests.workers.engine.helpers import (
    resume_is_exact,
    run_ranks,
    value_loss,
)
from verl.models import load_causal_lm, load_value_model
from verl.workers.engine import FSDPEngine, load_full_model_state_dict

FSDP_FP32 = {"dtype": "float32"}


def check_layout(folder, world_size):
    names = set(os.listdir(folder))
    for rank in range(world_size):
        for kind in ("model", "optim", "extra_state"):
            assert f"{kind}_world_size_{world_size}_rank_{rank}.pt" in names
    with open(os.path.join(folder, "fsdp_config.json")) as f:
        assert json.load(f) == {"FSDP_version": 2, "world_size": world_size}
    hf = set(os.listdir(os.path.join(folder, "huggingface")))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= hf
    assert not [n for n in names | hf if "tmp" in n or n.startswith(".")]


def test_resume_is_bit_identical_one_rank(single_rank, tiny_qwen2_dir, tiny_tokenizer_dir, tmp_path):
    folder = str(tmp_path / "global_step_2" / "actor")
    saved_full = resume_is_exact(0, load_causal_lm, tiny_qwen2_dir, folder, tiny_tokenizer_dir, FSDP_FP32)
    check_layout(folder, 1)

    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(os.path.join(folder, "huggingface"))
    assert exported.config.use_cache is True
    assert exported.lm_head.weight is exported.model.embed_tokens.weight
    for name, value in exported.state_dict().items():
        assert torch.equal(value, saved_full[name]), name


def test_value_model_checkpoint_one_rank(single_rank, tiny_llama_dir, tmp_path):
    folder = str(tmp_path / "critic")
    saved_full = resume_is_exact(0, load_value_model, tiny_llama_dir, folder, None, FSDP_FP32, loss_fn=value_loss)

    from transformers import AutoModelForTokenClassification

    exported = AutoModelForTokenClassification.from_pretrained(os.path.join(folder, "huggingface"))
    assert exported.config.architectures == ["LlamaForTokenClassification"]
    assert torch.equal(exported.score.weight, saved_full["score.weight"])


def test_load_errors_are_explicit(single_rank, tiny_qwen2_dir, tmp_path):
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir), fsdp_config=FSDP_FP32, optim_config={"lr": 1e-3})
    folder = str(tmp_path / "ckpt")
    engine.save_checkpoint(folder, save_contents=["model"])
    assert not os.path.exists(os.path.join(folder, "optim_world_size_1_rank_0.pt"))
    with pytest.raises(FileNotFoundError, match=r"saved without \['extra', 'optimizer'\]"):
        engine.load_checkpoint(folder)
    engine.load_checkpoint(folder, load_contents=["model"])

    with open(os.path.join(folder, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": 2}, f)
    with pytest.raises(ValueError, match="saved by 2 ranks but 1 are loading"):
        engine.load_checkpoint(folder, load_contents=["model"])
    with pytest.raises(FileNotFoundError, match="not an FSDP checkpoint"):
        engine.load_checkpoint(str(tmp_path))
    with pytest.raises(ValueError, match="unknown"):
        engine.save_checkpoint(folder, save_contents=["weights"])


def _two_rank_resume(rank, model_dir, folder, tokenizer_dir):
    resume_is_exact(rank, load_causal_lm, model_dir, folder, tokenizer_dir, FSDP_FP32)


def test_resume_is_bit_identical_two_ranks(tiny_qwen2_dir, tiny_tokenizer_dir, tmp_path):
    folder = str(tmp_path / "global_step_2" / "actor")
    run_ranks(_two_rank_resume, 2, tmp_path, tiny_qwen2_dir, folder, tiny_tokenizer_dir)
    check_layout(folder, 2)
    shard = torch.load(os.path.join(folder, "model_world_size_2_rank_1.pt"), weights_only=True)
    assert shard["shard_dims"]["lm_head.weight"] == 0 and shard["world_size"] == 2
    full = load_full_model_state_dict(folder)
    assert full["lm_head.weight"].shape[0] == shard["global_shapes"]["lm_head.weight"][0]
