"""Masked statistics and logit helpers shared by the PPO losses and advantage estimators.

Masks are 0/1 (or bool) tensors broadcastable to ``values``. Positions where the mask is 0 never
contribute, even if they hold ``inf`` or ``nan`` (padding often does).
"""

from __future__ import annotations

import torch

# Rows of low-precision logits upcast to float32 at once in `logprobs_from_logits`: bounds the
# temporary copy to about 64 MiB whatever the vocabulary size.
_FP32_CHUNK_ELEMENTS = 1 << 24


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask over ``axis`` (all elements when None)."""
    masked = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return masked.sum() if axis is None else masked.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask over ``axis``; 0 where the mask is empty."""
    count = masked_sum(torch.ones_like(values), mask, axis)
    return masked_sum(values, mask, axis) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked elements: Σ mask·(x − mean)² / (n − 1) (or / n when not unbiased).

    Raises ValueError when the mask selects no element, or only one and ``unbiased`` is set.
    """
    n = int(masked_sum(torch.ones_like(values), mask).item())
    if n == 0:
        raise ValueError("masked_var: the mask selects no element, so the variance is undefined.")
    if unbiased and n == 1:
        raise ValueError("masked_var: the mask selects a single element; the unbiased variance needs at least two "
                         "(pass unbiased=False to get 0).")
    mean = masked_mean(values, mask)
    sq_dev = masked_sum((values - mean) ** 2, mask)
    return sq_dev / (n - 1) if unbiased else sq_dev / n


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean) / sqrt(var + 1e-8) with mean and unbiased var over the masked elements.

    With ``shift_mean=False`` the mean is added back, so only the scale changes. Values at masked-out
    positions are transformed the same way; callers zero them if they need to.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: H = logsumexp(z) − Σ softmax(z)·z.

    z is first shifted by its row maximum (H does not change), so both terms stay small and do not
    cancel catastrophically for large logits. Computed in the dtype of ``logits``; upcast first if
    you need float32 accuracy from bf16 logits.
    """
    shifted = logits - logits.amax(dim=-1, keepdim=True).detach()
    probs = torch.softmax(shifted, dim=-1)
    return torch.logsumexp(shifted, dim=-1) - (probs * shifted).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] = z_label − logsumexp(z), for logits (..., V) and labels (...).

    float32/float64 logits are used as they are, without a log-softmax copy. Half-precision logits
    are upcast to float32 a chunk of rows at a time (never the whole tensor at once) and the result
    is float32, because a bf16 log-prob is too coarse for PPO ratios.
    """
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, labels.unsqueeze(-1).long()).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)

    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1).long()
    if flat_labels.numel() == 0:
        return torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
    rows_per_chunk = max(1, _FP32_CHUNK_ELEMENTS // vocab)
    pieces = []
    for start in range(0, flat_logits.shape[0], rows_per_chunk):
        chunk = flat_logits[start : start + rows_per_chunk].float()
        chunk_labels = flat_labels[start : start + rows_per_chunk]
        picked = chunk.gather(-1, chunk_labels.unsqueeze(-1)).squeeze(-1)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))
    return torch.cat(pieces).reshape(labels.shape)
