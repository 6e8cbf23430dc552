"""LoRA adapters: injection, the adapter-off reference, the merge for generation, export and errors."""

import json
import os

import pytest
import torch

pytest.importorskip("peft")

from verl.models.loader import load_causal_lm, load_value_model  # noqa: E402
from verl.models.lora import (  # noqa: E402
    LoraSettings,
    adapters_disabled,
    apply_lora,
    lora_config_dict,
    merge_into_gathered_weights,
    merged_state_dict,
    trainable_names,
    write_adapter_folder,
)

INPUT = torch.tensor([[5, 17, 42, 7, 99, 3, 12, 8]])


def _settings(**kwargs):
    return LoraSettings(**{"rank": 4, "alpha": 8, **kwargs})


def _randomise_factors(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def _logits(model):
    with torch.no_grad():
        return model(input_ids=INPUT).logits


def test_only_the_factors_train_and_a_fresh_adapter_changes_nothing(tiny_qwen2_dir):
    base = load_causal_lm(tiny_qwen2_dir)
    model = apply_lora(load_causal_lm(tiny_qwen2_dir), _settings())
    names = trainable_names(model)
    assert names and all("lora_A" in n or "lora_B" in n for n in names)
    # 2 layers x (q, k, v, o, gate, up, down); the tied lm_head takes none.
    assert len([n for n in names if "lora_A" in n]) == 2 * 7
    torch.testing.assert_close(_logits(model), _logits(base))  # lora_B starts at zero


def test_reference_is_the_base_model_with_the_adapter_off(tiny_qwen2_dir):
    base = load_causal_lm(tiny_qwen2_dir)
    model = apply_lora(load_causal_lm(tiny_qwen2_dir), _settings())
    _randomise_factors(model)
    assert not torch.allclose(_logits(model), _logits(base), atol=1e-3)
    trainable = trainable_names(model)
    with adapters_disabled(model):
        torch.testing.assert_close(_logits(model), _logits(base), rtol=0, atol=0)
        assert trainable_names(model) == trainable  # the flag only: FSDP2 must keep seeing trainable factors
    assert not torch.allclose(_logits(model), _logits(base), atol=1e-3)  # switched back on


def test_merging_equals_the_low_rank_terms(tiny_qwen2_dir):
    model = apply_lora(load_causal_lm(tiny_qwen2_dir), _settings())
    _randomise_factors(model)
    expected = _logits(model)
    # scaling = alpha / rank = 2: W + 2·B·A by hand for one layer.
    q = model.model.layers[0].self_attn.q_proj
    by_hand = q.base_layer.weight + 2.0 * q.lora_B["default"].weight @ q.lora_A["default"].weight
    merge_into_gathered_weights(model)
    torch.testing.assert_close(q.base_layer.weight, by_hand)
    with adapters_disabled(model):  # merged weights alone now give the adapted model
        torch.testing.assert_close(_logits(model), expected, rtol=1e-5, atol=1e-5)


def test_merged_state_dict_and_peft_adapter_folder_reproduce_the_model(tiny_qwen2_dir, tmp_path):
    from peft import PeftModel

    model = apply_lora(load_causal_lm(tiny_qwen2_dir), _settings(target_modules=["q_proj", "v_proj", "down_proj"]))
    _randomise_factors(model)
    expected = _logits(model)
    state = model.state_dict()
    config = lora_config_dict(model)

    plain = load_causal_lm(tiny_qwen2_dir)
    merged = merged_state_dict(state, config)
    assert set(merged) == set(plain.state_dict())  # the original parameter names
    plain.load_state_dict(merged)
    torch.testing.assert_close(_logits(plain), expected, rtol=1e-5, atol=1e-5)

    folder = tmp_path / "adapter"
    write_adapter_folder(str(folder), {n: t for n, t in state.items() if "lora_" in n}, config, tiny_qwen2_dir)
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == tiny_qwen2_dir
    peft_model = PeftModel.from_pretrained(load_causal_lm(tiny_qwen2_dir), str(folder))
    torch.testing.assert_close(_logits(peft_model), expected, rtol=1e-5, atol=1e-5)

    # And back: lora_adapter_path starts a run from that folder (rank and targets taken from it).
    settings = LoraSettings.from_config({"lora_rank": 0, "lora_adapter_path": str(folder)}, "actor_rollout_ref.model")
    assert settings.rank == 4 and settings.alpha == 8
    resumed = apply_lora(load_causal_lm(tiny_qwen2_dir), settings)
    torch.testing.assert_close(_logits(resumed), expected, rtol=1e-5, atol=1e-5)


def test_value_model_trains_its_new_head_in_full(tiny_qwen2_dir):
    model = apply_lora(load_value_model(tiny_qwen2_dir), _settings(), value_head=True)
    names = trainable_names(model)
    assert {"score.weight"} <= names and not any("score.lora" in n for n in names)
    assert all("lora_" in n or n.startswith("score.") for n in names)


def test_config_errors_name_the_key(tiny_qwen2_dir, tmp_path):
    section = "critic.model"
    with pytest.raises(ValueError, match=r"critic.model.target_modules=\['attn_proj'\] cannot wrap"):
        apply_lora(load_causal_lm(tiny_qwen2_dir), _settings(target_modules=["attn_proj"], section=section))
    with pytest.raises(ValueError, match="critic.model.lora_rank=-1"):
        LoraSettings.from_config({"lora_rank": -1}, section)
    with pytest.raises(FileNotFoundError, match="critic.model.lora_adapter_path=.*no such folder"):
        LoraSettings.from_config({"lora_rank": 4, "lora_adapter_path": str(tmp_path / "nope")}, section)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="holds no adapter_config.json"):
        LoraSettings.from_config({"lora_rank": 4, "lora_adapter_path": str(tmp_path / "empty")}, section)
    assert LoraSettings.from_config({"lora_rank": 0}, section) is None


def test_a_first_forward_with_the_adapter_off_leaves_it_trainable_under_fsdp(tiny_qwen2_dir, single_rank):
    """FSDP2 reads requires_grad once, at the model's first forward, to decide which parameters it
    reduces in fp32. With the rollout not calling the model, that first forward is the reference pass,
    adapter off: were the factors frozen then (peft's enable_adapters(False) does that), their gradients
    would later be reduced and stored in bf16 (an error on CUDA)."""
    from verl.workers.engine import FSDPEngine

    model = apply_lora(load_causal_lm(tiny_qwen2_dir), _settings())
    engine = FSDPEngine(model, fsdp_config={"dtype": "bfloat16"}, optim_config={"lr": 1e-3, "total_training_steps": 1})
    with adapters_disabled(engine.module), torch.no_grad():
        engine.module(input_ids=INPUT)
    engine.module(input_ids=INPUT).logits.float().mean().backward()
    grads = [p.grad for n, p in engine.module.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads)
