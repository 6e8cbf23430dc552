"""Token sampling for the native engine: greedy, temperature, top-k, top-p; log-probs of the choice.

Draws use the Gumbel-max trick, ``argmax(logits + G)`` with ``G = -log(E)``, ``E ~ Exp(1)``: one
pass of random numbers and an argmax, no softmax normalisation and no ``multinomial`` over the
vocabulary. Top-k takes ``topk`` (sorted) and samples among its k values; top-p keeps, in sorted
order, the tokens whose preceding probability mass is below ``top_p`` (transformers'
``TopPLogitsWarper`` rule, the first token always kept) and needs a full sort only without top-k.
The returned log-prob is ``log_softmax(logits / T)`` at the sampled token, before any filtering,
as the ``hf`` engine records it.
"""

from __future__ import annotations

import torch

from verl.workers.rollout.base import SamplingParams

__all__ = ["sample"]


def _gumbel_argmax(scores: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    noise = torch.empty_like(scores).exponential_(generator=generator).log_()
    return (scores - noise).argmax(dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
           seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``(b,)`` and their log-probs ``(b,)`` from logits ``(b, V)`` (computed in float32).

    On CUDA, pure sampling (no top-k/top-p) with a ``seed`` runs one Triton pass over the logits
    (``triton_ops.sample``: Gumbel-max with Philox noise keyed by ``seed``, plus the log-softmax of the
    choice) instead of the torch ops below; ``generator`` is then not advanced."""
    if (seed is not None and logits.is_cuda and not params.greedy and params.top_k <= 0 and params.top_p >= 1.0):
        from verl.workers.rollout.native import triton_ops

        if triton_ops.enabled(logits):
            return triton_ops.sample(logits, params.temperature, seed)
    logits = logits.float()
    scaled = logits if params.temperature == 1.0 else logits / params.temperature
    if params.greedy:
        tokens = scaled.argmax(dim=-1)
    elif params.top_k > 0 or params.top_p < 1.0:
        if params.top_k > 0:
            values, indices = scaled.topk(min(params.top_k, scaled.shape[-1]), dim=-1)
        else:
            values, indices = scaled.sort(dim=-1, descending=True)
        if params.top_p < 1.0:
            probs = values.softmax(dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            values = values.masked_fill(mass_before >= params.top_p, float("-inf"))
        tokens = indices.gather(-1, _gumbel_argmax(values, generator)[:, None]).squeeze(-1)
    else:
        tokens = _gumbel_argmax(scaled, generator)
    log_probs = scaled.gather(-1, tokens[:, None]).squeeze(-1) - scaled.logsumexp(dim=-1)
    return tokens, log_probs
