import logging
import math

import pytest

from verl.utils import flops_counter
from verl.utils.flops_counter import FlopsCounter, get_device_peak_tflops

TINY = {"model_type": "qwen2", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
        "num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 10}


def test_tiny_dense_model_by_hand():
    # head_dim 4. Per layer: q,o 2 * 8*8 = 128, k,v 2 * 8*4 = 64, mlp 3 * 8*16 = 384 -> 576;
    # 2 layers 1152 + lm_head 10*8 = 80 -> N = 1232.
    # seqlens 3, 5: 6 * 1232 * 8 tokens = 59136; attention 6 * (9 + 25) * 4 * 2 heads * 2 layers = 3264.
    counter = FlopsCounter(TINY, device_name="NVIDIA H100 80GB HBM3")
    achieved, promised = counter.estimate_flops([3, 5], delta_time_s=1e-6)
    assert achieved == pytest.approx((59136 + 3264) / 1e-6 / 1e12)
    assert promised == 989.0


def test_value_head_replaces_the_lm_head():
    # The critic's head is 8 x 1 instead of 10 x 8: N = 1152 + 8 = 1160; 6 * 1160 * 8 = 55680, attention 3264.
    achieved, _ = FlopsCounter(TINY, device_name="cpu", value_head=True).estimate_flops([3, 5], delta_time_s=1.0)
    assert achieved == pytest.approx((55680 + 3264) / 1e12)
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen2Config(**{k: v for k, v in TINY.items() if k != "model_type"})
    assert FlopsCounter(hf, device_name="cpu", value_head=True).estimate_flops([3, 5], 1.0)[0] == pytest.approx(
        achieved)
    assert hf.vocab_size == 10  # the caller's config is left alone


def test_explicit_head_dim_is_used():
    # qwen3 with head_dim 6 != 8 / 2: q,o 2 * 8*12 = 192, k,v 2 * 8*6 = 96, mlp 384 -> 672 per layer;
    # N = 2*672 + 80 = 1424. One sequence of 2: 6*1424*2 = 17088; attention 6 * 4 * 6 * 2 * 2 = 576.
    counter = FlopsCounter({**TINY, "model_type": "qwen3", "head_dim": 6}, device_name="cpu")
    achieved, promised = counter.estimate_flops([2], delta_time_s=1.0)
    assert achieved == pytest.approx((17088 + 576) / 1e12)
    assert promised == math.inf  # CPU: MFU reads 0


def test_real_hf_configs_match_dict_configs():
    transformers = pytest.importorskip("transformers")
    kwargs = {k: v for k, v in TINY.items() if k != "model_type"}
    expected, _ = FlopsCounter(TINY, device_name="cpu").estimate_flops([3, 5], 1.0)
    for cls in (transformers.Qwen2Config, transformers.LlamaConfig, transformers.MistralConfig):
        got, _ = FlopsCounter(cls(**kwargs), device_name="cpu").estimate_flops([3, 5], 1.0)
        assert got == pytest.approx(expected), cls.__name__


def test_unknown_model_type_gives_zero_and_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(flops_counter, "_warned_model_types", set())
    with caplog.at_level(logging.WARNING, logger="verl"):
        first = FlopsCounter({**TINY, "model_type": "mystery"}, device_name="cpu")
        FlopsCounter({**TINY, "model_type": "mystery"}, device_name="cpu")
    assert first.estimate_flops([10], 1.0)[0] == 0.0
    assert sum("mystery" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("name,tflops", [
    ("NVIDIA H200", 989.0), ("NVIDIA H20", 148.0), ("NVIDIA GH200 480GB", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A10G", 70.0), ("NVIDIA A10", 125.0),
    ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0), ("NVIDIA GeForce RTX 4090", 165.0),
    ("cpu", math.inf), ("Some Future GPU", math.inf),
])
def test_device_table(name, tflops):
    assert get_device_peak_tflops(name) == tflops


def test_bad_time():
    with pytest.raises(ValueError, match="delta_time_s"):
        FlopsCounter(TINY, device_name="cpu").estimate_flops([1], 0.0)
