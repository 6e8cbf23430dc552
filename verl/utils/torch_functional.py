"""Masked statistics, logit helpers and padding helpers shared by the losses, estimators and datasets.

Masks are 0/1 (or bool) tensors broadcastable to ``values``; a mask of other non-negative numbers weighs
each element by its entry, as the original's masked statistics do. Positions where the mask is 0 never
contribute, even if they hold ``inf`` or ``nan`` (padding often does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as nnf

# Rows of low-precision logits upcast to float32 at once in `logprobs_from_logits`: bounds the
# temporary copy to about 64 MiB whatever the vocabulary size.
_FP32_CHUNK_ELEMENTS = 1 << 24


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ values·mask over ``axis`` (all elements when None)."""
    weighted = values if mask.dtype == torch.bool else values * mask.to(values.dtype)
    masked = torch.where(mask.bool(), weighted, torch.zeros((), dtype=weighted.dtype, device=values.device))
    return masked.sum() if axis is None else masked.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask over ``axis``; 0 where the mask is empty."""
    count = masked_sum(torch.ones_like(values), mask, axis)
    return masked_sum(values, mask, axis) / torch.where(count > 0, count, torch.ones_like(count))


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked elements: Σ mask·(x − mean)² / Σ mask, times n / (n − 1) (Bessel) when
    ``unbiased``, n = Σ mask.

    Raises ValueError when the mask selects no element, or only one and ``unbiased`` is set.
    """
    n = float(masked_sum(torch.ones_like(values), mask).item())
    if n == 0:
        raise ValueError("masked_var: the mask selects no element, so the variance is undefined.")
    if unbiased and n == 1:
        raise ValueError("masked_var: the mask selects a single element; the unbiased variance needs at least two "
                         "(pass unbiased=False to get 0).")
    variance = masked_mean((values - masked_mean(values, mask)) ** 2, mask)
    return variance * (n / (n - 1)) if unbiased else variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean) / sqrt(var + 1e-8) with mean and unbiased var over the masked elements.

    With ``shift_mean=False`` the mean is added back, so only the scale changes. Values at masked-out
    positions are transformed the same way; callers zero them if they need to.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """``x`` clamped elementwise to [tensor_min, tensor_max] (tensors broadcastable to ``x``)."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def get_response_mask(response_id: torch.Tensor, eos_token: int | list[int] = 2, dtype=torch.int64) -> torch.Tensor:
    """1 for the tokens of each response up to and including its first end-of-sequence token (any of
    ``eos_token``), 0 after it: ``[[5, 7, eos, 0, 0]]`` -> ``[[1, 1, 1, 0, 0]]``."""
    eos = torch.isin(response_id, torch.as_tensor(eos_token, device=response_id.device)).int()
    return ((eos.cumsum(dim=-1) - eos) == 0).to(dtype)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: H = logsumexp(z) − Σ softmax(z)·z.

    z is first shifted by its row maximum (H does not change), so both terms stay small and do not
    cancel catastrophically for large logits. Computed in the dtype of ``logits``; upcast first if
    you need float32 accuracy from bf16 logits.
    """
    shifted = logits - logits.amax(dim=-1, keepdim=True).detach()
    probs = torch.softmax(shifted, dim=-1)
    return torch.logsumexp(shifted, dim=-1) - (probs * shifted).sum(dim=-1)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """:func:`entropy_from_logits` of (N, V) logits in float32, ``chunk_size`` rows at a time."""
    entropy = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], chunk_size):
        entropy[start:start + chunk_size] = entropy_from_logits(logits[start:start + chunk_size].float())
    return entropy


def gather_from_labels(data: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """``data[..., label]`` for data (..., V) and labels (...)."""
    return data.gather(-1, label.unsqueeze(-1).long()).squeeze(-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """log softmax(logits)[label] = z_label − logsumexp(z), for logits (..., V) and labels (...).

    float32/float64 logits are used as they are, without a log-softmax copy. Half-precision logits
    are upcast to float32 a chunk of rows at a time (never the whole tensor at once) and the result
    is float32, because a bf16 log-prob is too coarse for PPO ratios. ``inplace_backward`` (the
    original's flash-attn cross-entropy option) changes nothing here.
    """
    if logits.dtype in (torch.float32, torch.float64):
        return gather_from_labels(logits, labels) - torch.logsumexp(logits, dim=-1)

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
        pieces.append(gather_from_labels(chunk, chunk_labels) - torch.logsumexp(chunk, dim=-1))
    return torch.cat(pieces).reshape(labels.shape)


def log_probs_from_logits_response(input_ids: torch.Tensor, logits: torch.Tensor, response_length: int) -> torch.Tensor:
    """Log-probs of the last ``response_length`` tokens of ``input_ids`` (B, S) from the logits (B, S, V) of
    ``model(input_ids)``: the logits at position t predict token t + 1."""
    return logprobs_from_logits(logits[:, -response_length - 1:-1], input_ids[:, -response_length:])


def compute_grad_norm(model: torch.nn.Module) -> float:
    """Σ grad² over the model's parameters: the squared L2 norm of the gradient (no square root)."""
    return sum(float(p.grad.detach().float().square().sum()) for p in model.parameters() if p.grad is not None)


# ------------------------------------------------------------------------------------------------ padding
def pad_2d_list_to_length(response: list[list], pad_token_id, max_length: int | None = None) -> torch.Tensor:
    """Rows of different lengths as one tensor, right-padded with ``pad_token_id`` to the longest row
    (or to ``max_length`` when that is longer)."""
    width = max(max(len(row) for row in response), max_length or 0)
    return torch.tensor([list(row) + [pad_token_id] * (width - len(row)) for row in response])


def pad_sequence_to_length(tensors: torch.Tensor, max_seq_len: int, pad_token_id,
                           left_pad: bool = False) -> torch.Tensor:
    """(B, S) padded on the last axis to ``max_seq_len`` with ``pad_token_id`` (on the left with
    ``left_pad``); unchanged when S >= max_seq_len."""
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    return nnf.pad(tensors, (missing, 0) if left_pad else (0, missing), "constant", pad_token_id)


def postprocess_data(input_ids: torch.Tensor, attention_mask: torch.Tensor, max_length: int, pad_token_id: int,
                     left_pad: bool = True, truncation: str = "error") -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` (B, S) brought to ``max_length`` columns: padded (left by default,
    ids with ``pad_token_id``, mask with 0), or when longer cut by ``truncation``: ``"left"`` keeps the
    last ``max_length`` tokens, ``"right"`` the first, ``"middle"`` the first half and the last half;
    ``"error"`` raises."""
    if truncation not in ("left", "right", "middle", "error"):
        raise ValueError(f"postprocess_data: truncation must be left, right, middle or error, got {truncation!r}")
    if input_ids.ndim != 2:
        raise ValueError(f"postprocess_data: input_ids must be (batch, sequence), got shape {tuple(input_ids.shape)}")
    length = input_ids.shape[-1]
    if length < max_length:
        return (pad_sequence_to_length(input_ids, max_length, pad_token_id, left_pad),
                pad_sequence_to_length(attention_mask, max_length, 0, left_pad))
    if length == max_length:
        return input_ids, attention_mask
    if truncation == "error":
        # NotImplementedError is the original's type for this case: user code written against it catches that.
        raise NotImplementedError(f"sequence length {length} is larger than max_length {max_length} "
                                  "(pass truncation='left', 'right' or 'middle' to cut it)")
    head, tail = truncation_split(max_length, truncation)
    return (torch.cat([input_ids[:, :head], input_ids[:, length - tail:]], dim=-1),
            torch.cat([attention_mask[:, :head], attention_mask[:, length - tail:]], dim=-1))


def truncation_split(max_length: int, mode: str) -> tuple[int, int]:
    """``(head, tail)``: how many of the first and of the last tokens a sequence longer than ``max_length`` keeps
    when cut by ``mode``: ``left`` keeps the last ``max_length``, ``right`` the first, ``middle`` the first half
    and the last half (the removed tokens come from the middle)."""
    splits = {"left": (0, max_length), "right": (max_length, 0),
              "middle": (max_length // 2, max_length - max_length // 2)}
    if mode not in splits:
        raise ValueError(f"truncation={mode!r} cannot cut a sequence; use one of left, right, middle")
    return splits[mode]


def tokenize_and_postprocess_data(prompt: str, tokenizer, max_length: int, pad_token_id: int, left_pad: bool = True,
                                  truncation: str = "error") -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt`` tokenized without special tokens, then :func:`postprocess_data`: (1, max_length) each."""
    encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    return postprocess_data(encoded["input_ids"], encoded["attention_mask"], max_length, pad_token_id, left_pad,
                            truncation)


def remove_pad_token(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The token ids of each left-padded row without its padding (the last Σ mask tokens)."""
    return [ids[len(ids) - int(mask.sum()):].tolist() for ids, mask in zip(input_ids, attention_mask)]
