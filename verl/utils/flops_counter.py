"""Model FLOPs of a training step, for the ``perf/mfu/*`` metrics, with the original verl's formulas.

One training pass (forward + backward, the backward costing twice the forward) over sequences of
lengths s_1..s_B (valid tokens, prompt + response) is counted as

    6 · N · Σ s_i                                     (matmuls with the weights)
  + 6 · Σ s_i² · head_dim · num_heads · num_layers    (attention: QKᵀ and PV over the full square)

- N, per family (H hidden, I intermediate, V vocabulary, L layers, head_dim d, heads h, kv heads g):
  - dense decoders: L · (3·H·I + H·d·(2h + 2g)) + 2·V·H. The 2·V·H counts the input embedding and the
    lm_head alike (the original's convention, so that MFU figures compare with its logs).
  - MoE (qwen2_moe, qwen3_moe, gpt_oss): the active weights only, the top-k experts and the router:
    3·H·I_moe·k + H·E per layer in place of 3·H·I.
  - deepseek_v3: MLA projections, ``first_k_dense_replace`` dense layers, k routed + shared experts;
    its attention term is 3 · Σ s² · L · (d_qk + d_v) · h.
  - gemma3_text and gpt_oss: a sliding-window layer counts s · min(s, window) in place of s².
  - qwen3_vl, qwen3_vl_moe: the text model from ``text_config``, plus the vision tower over
    ``images_seqlens`` (patches per image): 6·N_vit·Σ patches + 12·Σ p²·d_vit·heads_vit·depth.
- Model FLOPs, not hardware FLOPs: recomputation by gradient checkpointing is not counted.

The trainer reports ``perf/mfu/actor = achieved · ppo_epochs / promised / world_size`` (likewise
``perf/mfu/critic``, whose model is counted from its config as it stands, lm_head included, as the
original does), with the step batch's sequence lengths and the update's time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from verl.utils.logging_utils import get_logger

logger = get_logger(__name__)

# Peak dense bf16 FLOP/s per device, matched as a substring of the device name, longer-sorting keys
# first (reverse alphabetical order, as the original matches them: "H200" before "H20").
# Unknown devices get inf, so MFU reads 0 rather than an invented number.
DEVICE_FLOPS: dict[str, float] = {
    "CPU": 448e9, "GB200": 2.5e15, "B200": 2.25e15, "MI300X": 1336e12, "H100": 989e12, "H800": 989e12,
    "H200": 989e12, "A100": 312e12, "A800": 312e12, "L40S": 362.05e12, "L40": 181.05e12, "A40": 149.7e12,
    "L20": 119.5e12, "H20": 148e12, "910B": 354e12, "Ascend910": 354e12, "RTX 3070 Ti": 21.75e12,
}
_UNITS = ("B", "K", "M", "G", "T", "P")  # "B" is plain FLOP/s; each further unit is 1000 times larger

_MISSING = object()
Estimator = Callable[..., float]
_warned_model_types: set[str] = set()


def get_device_flops(unit: str = "T", device_name: str | None = None) -> float:
    """Peak dense bf16 FLOP/s of ``device_name`` (default: the current CUDA device, else ``"CPU"``), in
    ``unit``: "B" (FLOP/s), "K", "M", "G", "T" (default, TFLOP/s) or "P". ``inf`` for a device missing from
    :data:`DEVICE_FLOPS`."""
    if unit not in _UNITS:
        raise ValueError(f"get_device_flops: unit must be one of {', '.join(_UNITS)}, got {unit!r}")
    if device_name is None:
        device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    flops = next((value for key, value in sorted(DEVICE_FLOPS.items(), reverse=True) if key in device_name),
                 float("inf"))
    return flops / 1000 ** _UNITS.index(unit)


# ------------------------------------------------------------------------------------------------ config access
def _attr(config: Any, name: str, default: Any = _MISSING) -> Any:
    """``config.name`` for a Hugging Face config object or a dict; ``default`` when it is absent (a value
    set to None stays None, as ``getattr`` gives it)."""
    value = config.get(name, _MISSING) if isinstance(config, dict) else getattr(config, name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise KeyError(f"FlopsCounter: the {_attr(config, 'model_type', 'model')} config has no {name!r}")
        return default
    return value


def _text(config: Any) -> Any:
    """The language model's config: ``text_config`` for the vision-language wrappers that keep it there
    (qwen2_vl and qwen2_5_vl in transformers 5, glm4v), else the config itself."""
    if _attr(config, "hidden_size", None) is None and _attr(config, "text_config", None) is not None:
        return _attr(config, "text_config")
    return config


def _head_dim(config: Any) -> int:
    return _attr(config, "head_dim", None) or _attr(config, "hidden_size") // _attr(config, "num_attention_heads")


def _gqa_weights(config: Any) -> int:
    """q, k, v, o projection weights of one grouped-query attention layer."""
    heads, kv_heads = _attr(config, "num_attention_heads"), _attr(config, "num_key_value_heads")
    return _attr(config, "hidden_size") * _head_dim(config) * (2 * heads + 2 * kv_heads)


def _embedding_and_head(config: Any) -> int:
    return 2 * _attr(config, "vocab_size") * _attr(config, "hidden_size")


def _square_sum(seqlens: Sequence[int], window: int | None = None) -> int:
    """Σ s², or Σ s · min(s, window) for a sliding-window layer."""
    return sum(s * (min(s, window) if window else s) for s in seqlens)


def _full_attention(config: Any, seqlens: Sequence[int]) -> float:
    layers, heads = _attr(config, "num_hidden_layers"), _attr(config, "num_attention_heads")
    return 6 * _square_sum(seqlens) * _head_dim(config) * heads * layers


def _windowed_attention(config: Any, seqlens: Sequence[int], layer_types: Sequence[str] | None,
                        window: int | None) -> float:
    """Attention with some layers sliding-window (``layer_types[i] == "sliding_attention"``); all full
    without ``layer_types``."""
    heads = _attr(config, "num_attention_heads")
    if not layer_types:
        return _full_attention(config, seqlens)
    squares = sum(_square_sum(seqlens, window if kind == "sliding_attention" else None) for kind in layer_types)
    return 6 * squares * _head_dim(config) * heads


# ------------------------------------------------------------------------------------------------ families
def _dense_flops(config: Any, seqlens: Sequence[int], images_seqlens=None) -> float:
    """llama, qwen2/3, mistral and the other SwiGLU decoders (3 MLP matrices)."""
    config = _text(config)
    mlp = 3 * _attr(config, "hidden_size") * _attr(config, "intermediate_size")
    n = (mlp + _gqa_weights(config)) * _attr(config, "num_hidden_layers") + _embedding_and_head(config)
    return 6 * n * sum(seqlens) + _full_attention(config, seqlens)


def _moe_flops(config: Any, seqlens: Sequence[int], images_seqlens=None) -> float:
    """qwen2_moe, qwen3_moe: top-k routed experts and the router; shared experts are not counted."""
    hidden = _attr(config, "hidden_size")
    moe = (3 * hidden * _attr(config, "moe_intermediate_size") * _attr(config, "num_experts_per_tok")
           + hidden * _attr(config, "num_experts"))
    n = (moe + _gqa_weights(config)) * _attr(config, "num_hidden_layers") + _embedding_and_head(config)
    return 6 * n * sum(seqlens) + _full_attention(config, seqlens)


def _deepseek_v3_flops(config: Any, seqlens: Sequence[int], images_seqlens=None) -> float:
    """Multi-head latent attention, ``first_k_dense_replace`` dense layers, routed + shared experts."""
    hidden, heads, layers = (_attr(config, k) for k in ("hidden_size", "num_attention_heads", "num_hidden_layers"))
    rope_dim, v_dim, kv_rank = (_attr(config, k) for k in ("qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))
    q_dim = _attr(config, "qk_nope_head_dim") + rope_dim
    q_rank = _attr(config, "q_lora_rank", None)
    attn = hidden * heads * q_dim if q_rank is None else hidden * q_rank + heads * q_dim * q_rank
    attn += hidden * (kv_rank + rope_dim)  # kv down-projection and the shared rope key
    attn += heads * (q_dim - rope_dim + v_dim) * kv_rank  # k_nope and v up-projections
    attn += heads * v_dim * hidden  # o
    experts = _attr(config, "num_experts_per_tok") + (_attr(config, "n_shared_experts", 0) or 0)
    moe = hidden * _attr(config, "n_routed_experts") + 3 * hidden * _attr(config, "moe_intermediate_size") * experts
    dense_layers = _attr(config, "first_k_dense_replace")
    n = ((moe + attn) * (layers - dense_layers)
         + (3 * hidden * _attr(config, "intermediate_size") + attn) * dense_layers + _embedding_and_head(config))
    return 6 * n * sum(seqlens) + 3 * _square_sum(seqlens) * layers * (q_dim + v_dim) * heads


def _gemma3_flops(config: Any, seqlens: Sequence[int], images_seqlens=None) -> float:
    """Gemma 3 text: GeGLU MLP (3 matrices); sliding-window layers by ``layer_types``, or else every
    ``sliding_window_pattern``-th layer (default 6) full and the others sliding (window default 1024)."""
    layers = _attr(config, "num_hidden_layers")
    mlp = 3 * _attr(config, "hidden_size") * _attr(config, "intermediate_size")
    n = (mlp + _gqa_weights(config)) * layers + _embedding_and_head(config)
    layer_types = _attr(config, "layer_types", None)
    window = _attr(config, "sliding_window", 1024)
    pattern = _attr(config, "sliding_window_pattern", 6)
    if layer_types is None and window is not None and pattern is not None:
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if layer_types:  # only the first num_hidden_layers entries describe layers
        layer_types = [layer_types[i] if i < len(layer_types) else "full_attention" for i in range(layers)]
    return 6 * n * sum(seqlens) + _windowed_attention(config, seqlens, layer_types, window)


def _apertus_flops(config: Any, seqlens: Sequence[int], images_seqlens=None) -> float:
    """Apertus: xIELU MLP with up and down projections only (2 matrices), q/k norms counted as weights."""
    hidden, layers = _attr(config, "hidden_size"), _attr(config, "num_hidden_layers")
    mlp = 2 * hidden * _attr(config, "intermediate_size")
    qk_norms = hidden + _attr(config, "num_key_value_heads") * _head_dim(config)
    n = (mlp + _gqa_weights(config) + qk_norms) * layers + _embedding_and_head(config)
    return 6 * n * sum(seqlens) + _full_attention(config, seqlens)


def _gpt_oss_flops(config: Any, seqlens: Sequence[int], images_seqlens=None) -> float:
    """gpt-oss: top-k of ``num_local_experts`` experts (3 matrices of ``intermediate_size``) and the router;
    sliding-window layers by ``layer_types`` (window default 128)."""
    hidden = _attr(config, "hidden_size")
    moe = (hidden * _attr(config, "num_local_experts")
           + 3 * hidden * _attr(config, "intermediate_size") * _attr(config, "num_experts_per_tok"))
    n = (moe + _gqa_weights(config)) * _attr(config, "num_hidden_layers") + _embedding_and_head(config)
    attention = _windowed_attention(config, seqlens, _attr(config, "layer_types", None),
                                    _attr(config, "sliding_window", 128))
    return 6 * n * sum(seqlens) + attention


def _qwen3_vit_flops(vision: Any, images_seqlens: Sequence[int]) -> float:
    """The Qwen3-VL vision tower over images of ``images_seqlens`` patches: patch embedding (a conv),
    ``depth`` blocks (4·D² attention, 2·D·I plain MLP), the patch merger and one merger per deepstack
    layer; full (non-causal) attention in every block."""
    dim, heads, depth = _attr(vision, "hidden_size"), _attr(vision, "num_heads"), _attr(vision, "depth")
    patch = _attr(vision, "patch_size")
    patch_embed = dim * _attr(vision, "in_channels") * _attr(vision, "temporal_patch_size") * patch * patch
    merged = dim * _attr(vision, "spatial_merge_size") ** 2
    merger = (_attr(vision, "out_hidden_size") + merged) * merged
    mergers = 1 + len(_attr(vision, "deepstack_visual_indexes"))
    n = patch_embed + (2 * dim * _attr(vision, "intermediate_size") + 4 * dim * dim) * depth + merger * mergers
    return 6 * n * sum(images_seqlens) + 12 * _square_sum(images_seqlens) * (dim // heads) * heads * depth


def _with_qwen3_vit(text_flops: Estimator) -> Estimator:
    """Qwen3-VL: ``text_flops`` of ``text_config`` plus, given ``images_seqlens``, the vision tower."""

    def flops(config: Any, seqlens: Sequence[int], images_seqlens=None) -> float:
        total = text_flops(_attr(config, "text_config"), seqlens)
        vision = _attr(config, "vision_config", None)
        if images_seqlens is not None and vision is not None:
            total += _qwen3_vit_flops(vision, images_seqlens)
        return total

    return flops


# model_type -> FLOPs of one fwd+bwd pass: fn(config, batch_seqlens, images_seqlens). The model types the
# original supports; any other reports 0 achieved FLOP/s (with one warning per type).
FLOPS_ESTIMATORS: dict[str, Estimator] = {
    **dict.fromkeys(("llama", "qwen2", "qwen2_vl", "qwen2_5_vl", "qwen3", "minicpmv", "minicpmo", "mistral",
                     "seed_oss", "glm4v", "mimo"), _dense_flops),
    "qwen2_moe": _moe_flops, "qwen3_moe": _moe_flops, "deepseek_v3": _deepseek_v3_flops,
    "gemma3_text": _gemma3_flops, "apertus": _apertus_flops, "gpt_oss": _gpt_oss_flops,
    "qwen3_vl": _with_qwen3_vit(_dense_flops), "qwen3_vl_moe": _with_qwen3_vit(_moe_flops),
}


class FlopsCounter:
    """Achieved TFLOP/s of a training pass, from a Hugging Face config (an object or a dict).

    ``device_name`` picks the peak of another device than the current one (tests, benchmarks).

    Example::

        counter = FlopsCounter(hf_config)
        achieved_tflops, promised_tflops = counter.estimate_flops(batch_seqlens, delta_time)
    """

    def __init__(self, config: Any, device_name: str | None = None):
        self.config = config
        self.model_type = _attr(config, "model_type", "")
        self.estimator = FLOPS_ESTIMATORS.get(self.model_type)
        if self.estimator is None and self.model_type not in _warned_model_types:
            _warned_model_types.add(self.model_type)
            logger.warning("No FLOPs formula for model_type %r (known: %s); perf/mfu/* will read 0.",
                           self.model_type, ", ".join(sorted(FLOPS_ESTIMATORS)))
        self.device_name = device_name

    def estimate_flops(self, batch_seqlens: Sequence[int], delta_time: float,
                       images_seqlens: Sequence[int] | None = None) -> tuple[float, float]:
        """``(achieved, promised)`` in TFLOP/s for one fwd+bwd pass over sequences of ``batch_seqlens``
        valid tokens that took ``delta_time`` seconds. ``images_seqlens``: patches per image of the batch
        (vision-language models that count their vision tower; others ignore it). ``promised`` is the
        device's peak (:func:`get_device_flops`)."""
        if not delta_time > 0:
            raise ValueError(f"estimate_flops: delta_time must be > 0 seconds, got {delta_time}")
        promised = get_device_flops(device_name=self.device_name)
        if self.estimator is None:
            return 0.0, promised
        seqlens = [int(s) for s in batch_seqlens]
        images = None if images_seqlens is None else [int(s) for s in images_seqlens]
        return self.estimator(self.config, seqlens, images) / delta_time / 1e12, promised
