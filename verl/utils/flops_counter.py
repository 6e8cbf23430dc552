"""Model FLOPs of a training step, for the ``perf/mfu/*`` metrics.

For a dense decoder (qwen2, qwen3, llama, mistral) one training pass (forward + backward, the
backward costing twice the forward) over sequences of lengths s_1..s_B costs

    6 · N · Σ s_i                                   (matmuls with the weights)
  + 6 · Σ s_i² · head_dim · num_heads · num_layers  (attention scores and weighted sum)

- N counts the weights that take part in a matmul per token: per layer the q, k, v, o projections
  and the gate/up/down MLP, plus the lm_head (vocab × hidden). The input embedding is a lookup, not
  a matmul, so it is left out even when tied; norms and biases are negligible and left out too.
- Attention: QKᵀ and PV are 2·s²·d multiply-adds each per head in the forward, but causal kernels
  (SDPA, flash) compute only the lower triangle, so forward = 2·s²·d, and × 3 for fwd + bwd.

This is the "model FLOPs" convention (recomputation by gradient checkpointing is not counted), so
MFU = achieved / peak stays comparable whatever memory-saving options are on. The original verl
counts the embedding as well as the lm_head and the full (non-causal) attention square, so for the
same run its MFU reads somewhat higher than ours.

The trainer computes ``perf/mfu/actor = achieved · ppo_epochs / promised / world_size``, with the
sequence lengths of the whole step's batch and the update time; ``perf/mfu/critic`` likewise with the
critic's model (its head is hidden × 1), ``critic.ppo_epochs`` and the critic update's time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from verl.utils.logging_utils import get_logger

logger = get_logger(__name__)

# Peak dense bf16 tensor-core TFLOPS (no sparsity), matched as a whole word in the device name.
# Longer names come first so that e.g. "GH200" is not read as "H200".
# V100 and T4 have no bf16: their fp16 peak.
DEVICE_PEAK_TFLOPS: dict[str, float] = {
    "GB200": 2500.0, "B200": 2250.0, "B100": 1750.0, "GH200": 989.0, "H200": 989.0, "H100": 989.0, "H800": 989.0,
    "H20": 148.0, "A100": 312.0, "A800": 312.0, "A40": 149.7, "A30": 165.0, "A10G": 70.0, "A10": 125.0,
    "L40S": 362.0, "L40": 181.0, "L20": 119.5, "L4": 121.0, "RTX 4090": 165.0, "RTX 3090": 71.0,
    "V100": 125.0, "T4": 65.0, "MI300X": 1307.0, "MI325X": 1307.0,
}

_warned_model_types: set[str] = set()
_warned_devices: set[str] = set()


def get_device_peak_tflops(device_name: str | None = None) -> float:
    """Peak dense bf16 TFLOPS of ``device_name`` (default: the current CUDA device).

    Returns ``inf`` on CPU and for a GPU missing from :data:`DEVICE_PEAK_TFLOPS` (with a one-time
    warning), so MFU reads 0 rather than an invented number.
    """
    if device_name is None:
        if not torch.cuda.is_available():
            return math.inf
        device_name = torch.cuda.get_device_name()
    for key, tflops in DEVICE_PEAK_TFLOPS.items():
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, re.IGNORECASE):
            return tflops
    if device_name.lower() != "cpu" and device_name not in _warned_devices:
        _warned_devices.add(device_name)
        logger.warning("No peak TFLOPS known for device %r; perf/mfu/* will read 0. Add it to "
                       "verl.utils.flops_counter.DEVICE_PEAK_TFLOPS.", device_name)
    return math.inf


def _cfg(config: Any, name: str, default: Any = None) -> Any:
    value = config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)
    return default if value is None else value


def _dense_decoder_flops(config: Any, batch_seqlens: Sequence[int]) -> float:
    """FLOPs of one fwd+bwd pass of a dense GQA decoder; see the module docstring."""
    hidden = _cfg(config, "hidden_size")
    heads = _cfg(config, "num_attention_heads")
    kv_heads = _cfg(config, "num_key_value_heads", heads)
    layers = _cfg(config, "num_hidden_layers")
    intermediate = _cfg(config, "intermediate_size")
    vocab = _cfg(config, "vocab_size")
    head_dim = _cfg(config, "head_dim", hidden // heads)

    attn_weights = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o: heads; k and v: kv_heads
    mlp_weights = 3 * hidden * intermediate
    n_dense = layers * (attn_weights + mlp_weights) + vocab * hidden

    tokens = sum(batch_seqlens)
    seqlen_sq = sum(s * s for s in batch_seqlens)
    return 6.0 * n_dense * tokens + 6.0 * seqlen_sq * head_dim * heads * layers


FLOPS_ESTIMATORS: dict[str, Callable[[Any, Sequence[int]], float]] = dict.fromkeys(
    ("qwen2", "qwen3", "llama", "mistral"), _dense_decoder_flops)


class FlopsCounter:
    """Achieved TFLOPS of a training pass from a Hugging Face config (an object or a dict).

    ``device_name`` overrides the CUDA device name used to look up the peak (``"cpu"`` on CPU);
    ``value_head`` counts a one-output head in place of the lm_head (the critic).
    Model types without an estimator in :data:`FLOPS_ESTIMATORS` report 0 achieved TFLOPS, with a
    one-time warning per type.
    """

    def __init__(self, hf_config: Any, device_name: str | None = None, value_head: bool = False):
        if value_head:  # a critic: its head maps hidden -> 1 value instead of hidden -> vocabulary
            config = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
            hf_config = {**config, "vocab_size": 1}
        self.config = hf_config
        self.model_type = _cfg(hf_config, "model_type", "")
        self.estimator = FLOPS_ESTIMATORS.get(self.model_type)
        if self.estimator is None and self.model_type not in _warned_model_types:
            _warned_model_types.add(self.model_type)
            logger.warning("No FLOPs estimator for model_type %r (known: %s); perf/mfu/* will read 0.",
                           self.model_type, ", ".join(sorted(FLOPS_ESTIMATORS)))
        self.promised_tflops = get_device_peak_tflops(device_name)

    def estimate_flops(self, batch_seqlens: Sequence[int], delta_time_s: float) -> tuple[float, float]:
        """``(achieved_tflops, promised_tflops)`` for one fwd+bwd pass over sequences of lengths
        ``batch_seqlens`` (valid tokens, prompt + response) that took ``delta_time_s`` seconds.

        ``promised_tflops`` is the per-device peak (``inf`` on CPU or an unknown device).
        """
        if not delta_time_s > 0:
            raise ValueError(f"estimate_flops: delta_time_s must be > 0 seconds, got {delta_time_s}")
        if self.estimator is None:
            return 0.0, self.promised_tflops
        seqlens = [int(s) for s in batch_seqlens]
        return self.estimator(self.config, seqlens) / delta_time_s / 1e12, self.promised_tflops
