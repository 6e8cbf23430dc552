import json

import pytest
import torch

from verl.models import load_causal_lm, load_value_model, resolve_dtype


def test_causal_lm_loads_in_requested_dtype_with_overrides(tiny_qwen2_dir):
    model = load_causal_lm(tiny_qwen2_dir, dtype="bf16", override_config={"attention_dropout": 0.25})
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config.attention_dropout == 0.25
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_gradient_checkpointing_turns_cache_off(tiny_llama_dir):
    model = load_causal_lm(tiny_llama_dir, use_gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    assert model.config.use_cache is False


def test_missing_path_names_the_config_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"actor_rollout_ref\.model\.path.*local folders"):
        load_causal_lm(str(tmp_path / "nope"), config_key="actor_rollout_ref.model.path")
    with pytest.raises(ValueError, match=r"critic\.model\.path is not set"):
        load_value_model(None)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_causal_lm(str(tmp_path))


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_model"}))
    with pytest.raises(ValueError, match="does not recognise"):
        load_causal_lm(str(tmp_path))

    from transformers import ViTConfig

    vit = tmp_path / "vit"
    ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(vit)
    with pytest.raises(ValueError, match="no AutoModelForCausalLM"):
        load_causal_lm(str(vit))


def test_value_model_takes_the_backbone_and_a_fresh_deterministic_head(tiny_qwen2_dir, tmp_path):
    lm = load_causal_lm(tiny_qwen2_dir)
    critic = load_value_model(tiny_qwen2_dir)
    again = load_value_model(tiny_qwen2_dir)

    assert critic.score.weight.shape == (1, lm.config.hidden_size)
    assert critic.dropout.p == 0.0
    assert critic.config.architectures == ["Qwen2ForTokenClassification"]
    for name, p in lm.model.named_parameters():
        torch.testing.assert_close(critic.model.get_parameter(name), p, rtol=0, atol=0)
    torch.testing.assert_close(critic.score.weight, again.score.weight, rtol=0, atol=0)
    assert critic.score.weight.std() < 0.05 and critic.score.bias.abs().max() == 0

    # A checkpoint that already is a value model keeps its head.
    with torch.no_grad():
        critic.score.weight.fill_(0.5)
    critic.save_pretrained(tmp_path / "critic")
    reloaded = load_value_model(str(tmp_path / "critic"))
    assert torch.all(reloaded.score.weight == 0.5)


def test_resolve_dtype():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("fp32") is torch.float32
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="Unknown dtype"):
        resolve_dtype("int3")
