"""Token sampling for the native engine: greedy, temperature, top-k, top-p; log-probs of the choice.

The filters keep whole ties, judged on the raw logits: top-k keeps every token whose logit is at least
the k-th largest (as transformers' ``TopKLogitsWarper``); top-p then keeps every token whose strictly
larger tokens carry less than ``top_p`` of the (top-k renormalised) probability, so the most likely
token always stays and a tie straddling the boundary is kept whole (transformers' ``TopPLogitsWarper``
cuts a tie at an arbitrary point of its sort instead). Draws use the Gumbel-max trick,
``argmax(logits + G)`` with ``G = -log(E)``, ``E ~ Exp(1)``: no softmax normalisation and no
``multinomial`` over the vocabulary. The returned log-prob is ``log_softmax(logits / T)`` at the
sampled token, before any filtering, as the ``hf`` engine records it.

On CUDA with Triton, sampling with a ``seed`` runs ``triton_ops.sample`` instead: the same filters
found by a radix search over the logits (no sort), one draw by inverse CDF.
"""

from __future__ import annotations

import torch

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.native import triton_ops

__all__ = ["filter_logits", "sample"]


def filter_logits(logits: torch.Tensor, scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``scaled`` (``logits / T``, ``(b, V)``) with the tokens that top-k then top-p remove set to -inf."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    if 0 < top_k < logits.shape[-1]:
        keep = logits >= logits.topk(top_k, dim=-1).values[:, -1:]
    if top_p < 1.0:
        masked = scaled.masked_fill(~keep, float("-inf"))
        if 0 < top_k < logits.shape[-1]:  # sort only what top-k kept (ties may make it more than k)
            values, order = masked.topk(int(keep.sum(dim=-1).max()), dim=-1)
        else:
            values, order = masked.sort(dim=-1, descending=True)
        probs = values.softmax(dim=-1)
        last = ((probs.cumsum(dim=-1) - probs) < top_p).sum(dim=-1, keepdim=True).clamp(min=1) - 1
        keep &= logits >= logits.gather(-1, order.gather(-1, last))
    return scaled.masked_fill(~keep, float("-inf"))


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
           seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``(b,)`` and their log-probs ``(b,)`` from logits ``(b, V)`` (computed in float32).

    On CUDA with Triton and a ``seed``, non-greedy sampling runs ``triton_ops.sample`` (Philox noise keyed
    by ``seed``; ``generator`` is then not advanced)."""
    if seed is not None and not params.greedy and triton_ops.enabled(logits):
        return triton_ops.sample(logits, params.temperature, params.top_k, params.top_p, seed)
    logits = logits.float()
    scaled = logits if params.temperature == 1.0 else logits / params.temperature
    if params.greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        scores = filter_logits(logits, scaled, params.top_k, params.top_p)  # Gumbel-max: argmax(scores - log(E))
        tokens = (scores - torch.empty_like(scores).exponential_(generator=generator).log_()).argmax(dim=-1)
    log_probs = scaled.gather(-1, tokens[:, None]).squeeze(-1) - scaled.logsumexp(dim=-1)
    return tokens, log_probs
