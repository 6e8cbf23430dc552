import logging
import math

import pytest

from verl.utils import flops_counter
from verl.utils.flops_counter import FlopsCounter, get_device_flops

# H 8, 2 heads of head_dim 4, 1 kv head, 2 layers, I 16, V 10. Per layer: q,o 2*8*8 = 128 + k,v 2*8*4 = 64
# -> attention 192; SwiGLU MLP 3*8*16 = 384; 576 per layer, 1152 for both; embedding + lm_head 2*10*8 = 160.
TINY = {"model_type": "qwen2", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
        "num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 10}
SEQLENS = [3, 5]  # 8 tokens, Σs² = 9 + 25 = 34
DENSE = 6 * (1152 + 160) * 8 + 6 * 34 * 4 * 2 * 2  # 62976 + 3264 = 66240 FLOPs
# MoE MLP (moe_intermediate_size 4, top-2 of 4 experts): 3*8*4*2 = 192 + router 8*4 = 32 = 224 per layer.
MOE_FIELDS = {"moe_intermediate_size": 4, "num_experts_per_tok": 2, "num_experts": 4}
MOE = 6 * ((224 + 192) * 2 + 160) * 8 + 6 * 34 * 4 * 2 * 2  # 47616 + 3264 = 50880


def tflops(config, seqlens=SEQLENS, **kwargs):
    return FlopsCounter(config, device_name="CPU").estimate_flops(seqlens, 1.0, **kwargs)[0]


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "qwen3", "mistral", "minicpmv", "seed_oss", "mimo"])
def test_dense_decoders_by_hand(model_type):
    assert tflops({**TINY, "model_type": model_type}) == pytest.approx(DENSE / 1e12)
    assert DENSE == 66240


def test_achieved_is_per_second_and_promised_is_the_device_peak():
    achieved, promised = FlopsCounter(TINY, device_name="NVIDIA H100 80GB HBM3").estimate_flops(SEQLENS, 1e-6)
    assert achieved == pytest.approx(DENSE / 1e-6 / 1e12) and promised == 989.0


def test_explicit_head_dim_is_used():
    # head_dim 6 != 8 / 2: attention weights 8*6*(2*2 + 2*1) = 288, + MLP 384 = 672 per layer; N = 1344 + 160.
    # One sequence of 2: 6*1504*2 = 18048; attention 6 * 2² * 6 * 2 heads * 2 layers = 576.
    assert tflops({**TINY, "model_type": "qwen3", "head_dim": 6}, [2]) == pytest.approx((18048 + 576) / 1e12)
    assert tflops({**TINY, "head_dim": None}) == pytest.approx(DENSE / 1e12)  # None: hidden / heads


@pytest.mark.parametrize("model_type", ["qwen2_moe", "qwen3_moe"])
def test_moe_counts_active_experts_and_router(model_type):
    assert tflops({**TINY, **MOE_FIELDS, "model_type": model_type}) == pytest.approx(MOE / 1e12)
    assert MOE == 50880


def test_deepseek_v3_mla_by_hand():
    config = {"model_type": "deepseek_v3", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 3,
              "first_k_dense_replace": 1, "vocab_size": 10, "intermediate_size": 16, "moe_intermediate_size": 4,
              "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "q_lora_rank": None,
              "kv_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 1, "v_head_dim": 3}
    # q head dim 2 + 1 = 3. Attention weights: q 8*2*3 = 48; kv down 8*(4 + 1) = 40;
    # k_nope/v up 2*(3 - 1 + 3)*4 = 40; o 2*3*8 = 48 -> 176.
    # MoE layer: router 8*4 = 32 + 3*8*4*(2 routed + 1 shared) = 288 -> 320; dense layer MLP 3*8*16 = 384.
    # N = (320 + 176)*2 MoE layers + (384 + 176)*1 dense layer + 160 = 992 + 560 + 160 = 1712.
    # Attention: 3 * Σs² 34 * 3 layers * (3 + 3) * 2 heads = 3672.
    assert tflops(config) == pytest.approx((6 * 1712 * 8 + 3672) / 1e12)
    # With q LoRA rank 2 the q projection is 8*2 + 2*3*2 = 28 instead of 48: attention weights 156;
    # N = (320 + 156)*2 + (384 + 156) + 160 = 1652.
    assert tflops({**config, "q_lora_rank": 2}) == pytest.approx((6 * 1652 * 8 + 3672) / 1e12)


def test_gemma3_sliding_window_layers():
    # Window 4: a sliding layer counts 3*min(3, 4) + 5*min(5, 4) = 29 in place of Σs² = 34.
    # Layers sliding then full: (29 + 34) * 6 * 4 * 2 heads = 3024; weights as the dense model: 62976.
    expected = (62976 + 3024) / 1e12
    gemma = {**TINY, "model_type": "gemma3_text", "sliding_window": 4}
    assert tflops({**gemma, "layer_types": ["sliding_attention", "full_attention"]}) == pytest.approx(expected)
    # No layer_types: every sliding_window_pattern-th layer is full (pattern 2: layer 0 sliding, layer 1 full).
    assert tflops({**gemma, "sliding_window_pattern": 2}) == pytest.approx(expected)
    # Defaults (window 1024, pattern 6): both layers sliding, but no sequence is longer than the window.
    assert tflops({**TINY, "model_type": "gemma3_text"}) == pytest.approx(DENSE / 1e12)
    # sliding_window None: full attention everywhere.
    assert tflops({**gemma, "sliding_window": None, "sliding_window_pattern": 2}) == pytest.approx(DENSE / 1e12)


def test_gpt_oss_moe_and_sliding_window():
    config = {**TINY, "model_type": "gpt_oss", "intermediate_size": 4, "num_local_experts": 4,
              "num_experts_per_tok": 2, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4}
    # Router 8*4 + 3*8*4*2 = 224 per layer, as the MoE above: 47616; attention (29 + 34) * 6 * 4 * 2 = 3024.
    assert tflops(config) == pytest.approx((47616 + 3024) / 1e12)


def test_apertus_two_matrix_mlp_and_qk_norms():
    # MLP 2*8*16 = 256, attention 192, q/k norms 8 + 1*4 = 12 -> 460 per layer; N = 920 + 160 = 1080.
    config = {**TINY, "model_type": "apertus"}
    assert tflops(config) == pytest.approx((6 * 1080 * 8 + 3264) / 1e12)


VISION = {"hidden_size": 4, "num_heads": 2, "depth": 1, "intermediate_size": 6, "in_channels": 3, "patch_size": 2,
          "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 8, "deepstack_visual_indexes": [0]}
# Patch embedding 4*3*2*2*2 = 96; block 2*4*6 + 4*4*4 = 112; merger (8 + 4*2²) * (4*2²) = 384, twice (the
# merger and one deepstack merger) = 768; N_vit = 976. One image of 4 patches: 6*976*4 = 23424, attention
# 12 * 4² * head_dim 2 * 2 heads * depth 1 = 768.
VIT = 23424 + 768


def test_qwen3_vl_counts_the_vision_tower_when_given_images():
    config = {"model_type": "qwen3_vl", "text_config": TINY, "vision_config": VISION}
    assert tflops(config) == pytest.approx(DENSE / 1e12)
    assert tflops(config, images_seqlens=[4]) == pytest.approx((DENSE + VIT) / 1e12)
    moe = {"model_type": "qwen3_vl_moe", "text_config": {**TINY, **MOE_FIELDS}, "vision_config": VISION}
    assert tflops(moe, images_seqlens=[4]) == pytest.approx((MOE + VIT) / 1e12)


def test_qwen2_vl_reads_its_text_config_and_ignores_images():
    config = {"model_type": "qwen2_5_vl", "text_config": TINY}
    assert tflops(config, images_seqlens=[4]) == pytest.approx(DENSE / 1e12)


def test_real_hf_configs_match_dict_configs():
    transformers = pytest.importorskip("transformers")
    kwargs = {k: v for k, v in TINY.items() if k != "model_type"}
    for cls in (transformers.Qwen2Config, transformers.LlamaConfig, transformers.MistralConfig,
                transformers.Qwen3Config):
        assert tflops(cls(**kwargs, head_dim=4)) == pytest.approx(DENSE / 1e12), cls.__name__
    vl = transformers.Qwen2_5_VLConfig(text_config=kwargs)
    assert tflops(vl) == pytest.approx(DENSE / 1e12)
    gemma = transformers.Gemma3TextConfig(**kwargs, head_dim=4, sliding_window=4,
                                          layer_types=["sliding_attention", "full_attention"])
    assert tflops(gemma) == pytest.approx((62976 + 3024) / 1e12)


def test_unknown_model_type_gives_zero_and_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(flops_counter, "_warned_model_types", set())
    with caplog.at_level(logging.WARNING, logger="verl"):
        first = FlopsCounter({**TINY, "model_type": "mystery"}, device_name="CPU")
        FlopsCounter({**TINY, "model_type": "mystery"}, device_name="CPU")
    assert first.estimate_flops([10], 1.0) == (0.0, 0.448)
    assert sum("mystery" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("name,tflops_peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("NVIDIA H20", 148.0), ("NVIDIA H800", 989.0),
    ("NVIDIA GB200", 2500.0), ("NVIDIA B200", 2250.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.05),
    ("NVIDIA L40", 181.05), ("AMD Instinct MI300X", 1336.0), ("Ascend910B2", 354.0), ("CPU", 0.448),
    ("NVIDIA A10G", math.inf), ("cpu", math.inf),
])
def test_device_table(name, tflops_peak):
    assert get_device_flops(device_name=name) == pytest.approx(tflops_peak)


def test_device_flops_units():
    assert get_device_flops("B", "NVIDIA A100") == 312e12  # "B": plain FLOP/s
    assert get_device_flops("G", "NVIDIA A100") == pytest.approx(312e3)
    assert get_device_flops("P", "NVIDIA A100") == pytest.approx(0.312)
    with pytest.raises(ValueError, match="unit"):
        get_device_flops("X", "NVIDIA A100")


def test_bad_time_and_missing_fields():
    with pytest.raises(ValueError, match="delta_time"):
        FlopsCounter(TINY, device_name="CPU").estimate_flops([1], 0.0)
    with pytest.raises(KeyError, match="intermediate_size"):
        tflops({k: v for k, v in TINY.items() if k != "intermediate_size"})
