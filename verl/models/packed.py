"""Padding-free (packed) forwards: the valid tokens of a padded batch run as one sequence.

A batch of B left-padded rows (B, T) holds sum(attention_mask) real tokens; a padded forward spends
its matmuls and attention on all B x T. Packed, the real tokens are laid end to end as one row (1, N)
with each token keeping its own position id, and attention is restricted to blocks of the same
sequence through cumulative sequence offsets ``cu_seqlens`` (B + 1,), as in flash-attention's
varlen interface:

    rows  [p p a b c]      valid  [0 0 1 1 1]    packed  [a b c d e]   positions [0 1 2 0 1]
          [p p p d e]             [0 0 0 1 1]    cu_seqlens [0 3 5]

The model runs with the attention implementation registered here under :data:`ATTN_IMPLEMENTATION`:
given ``cu_seq_lens_q`` (forwarded by Hugging Face models to their attention function) it computes
causal attention within each sequence, through ``torch.nn.attention.varlen.varlen_attn`` (the
flash-attention kernel shipped with PyTorch) on CUDA in bf16/fp16, else with one SDPA call per
sequence. Without ``cu_seq_lens_q`` it is plain SDPA with the usual padding mask, so the same model
object also serves padded forwards and ``generate``. Gradient checkpointing recomputes layers with the
same keyword arguments, so backward sees the same sequence boundaries.

Results equal the padded forward at every valid position up to floating-point summation order (the
tests compare them in fp32 at 1e-5).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "verl_packed_sdpa"
# The same function, for vision encoders: transformers hands ``cu_seqlens`` to an implementation whose name says
# "flash" (``is_flash_attention_requested``) and loops over windows for any other.
VISION_ATTN_IMPLEMENTATION = "verl_packed_flash_varlen"

__all__ = ["ATTN_IMPLEMENTATION", "VISION_ATTN_IMPLEMENTATION", "Packed", "pack", "packed_attention", "register",
           "use_varlen_in_vision_tower"]


@dataclass
class Packed:
    """The valid tokens of a padded (B, T) batch, laid end to end.

    ``input_ids``: (1, N); ``position_ids``: (1, N), or (3, 1, N) for M-RoPE models (vision-language, whose
    batches hold (B, 3, T) positions, see :mod:`verl.models.vision`); ``cu_seqlens``: (B + 1,) int32 offsets of each row's tokens;
    ``max_seqlen``: the longest row; ``index``: (B, T) int64, the packed position of each valid token
    (-1 at padding); ``valid``: (B, T) bool.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    index: torch.Tensor
    valid: torch.Tensor

    def model_kwargs(self) -> dict:
        """Keyword arguments that make a Hugging Face model with :data:`ATTN_IMPLEMENTATION` attend per sequence."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": None,
                "cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": _bucket(self.max_seqlen), "max_length_k": _bucket(self.max_seqlen)}

    def response_positions(self, response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """For the last ``response_length`` columns: the (B, R) mask of valid response tokens and, for
        each of them in row-major order, the packed position of the token before it (whose hidden
        state predicts it)."""
        valid = self.valid[:, -response_length:]
        return valid, self.index[:, -response_length:][valid] - 1


def _bucket(length: int) -> int:
    """``length`` rounded up to a power of two. The varlen kernel needs only an upper bound of the longest
    sequence (it sizes its grid by it; blocks past a sequence's end exit at once), and the compiled layers
    receive it as a Python int: should the compiler specialise on it, a run sees a few distinct values
    (one per doubling) instead of one per micro-batch. (With the rounding, TORCH_LOGS=recompiles showed
    one recompile in a reference PPO run on the H200, for grad mode.)"""
    return 1 << max(0, int(length) - 1).bit_length()


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> Packed:
    """Pack the tokens where ``attention_mask`` is 1 (see :class:`Packed`). Rows keep their order; a row's
    valid tokens must be contiguous (left or right padding), as the trainer's batches are."""
    valid = attention_mask.bool()
    lengths = valid.sum(-1)
    flat = valid.reshape(-1)
    index = torch.where(valid, flat.cumsum(0).view_as(valid) - 1, -1)
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    take = flat.nonzero().squeeze(-1)
    if position_ids.dim() == 3:  # M-RoPE (B, 3, T): each token keeps its three positions -> (3, 1, N)
        packed_positions = position_ids.transpose(0, 1).reshape(position_ids.shape[1], -1)[:, take].unsqueeze(1)
    else:
        packed_positions = position_ids.reshape(-1)[take].unsqueeze(0)
    return Packed(input_ids=input_ids.reshape(-1)[take].unsqueeze(0), position_ids=packed_positions,
                  cu_seqlens=cu_seqlens, max_seqlen=int(lengths.max()) if len(lengths) else 0,
                  index=index, valid=valid)


_VARLEN: tuple | None | bool = False  # False: not looked up yet (register() looks it up, outside any compile)


def _varlen():
    """PyTorch's varlen flash attention, how to ask it for causal and for full (bidirectional) masking (the
    keyword changed between releases), and whether it takes ``enable_gqa``; None where this torch has none.
    Looked up once; a module global rather than ``functools.cache``, which the compiled layers would trace
    through with a warning in every run."""
    global _VARLEN
    if _VARLEN is False:
        _VARLEN = _find_varlen()
    return _VARLEN


def _find_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        masks = {True: {"window_size": (-1, 0)}, False: {"window_size": (-1, -1)}}
    else:
        masks = {True: {"is_causal": True}, False: {"is_causal": False}}
    return varlen_attn, masks, "enable_gqa" in params


def _per_sequence(query, key, value, cu_seqlens, scaling, dropout, causal):
    """(N, Hq, D) attention within each sequence (causal or full), one SDPA call per sequence."""
    bounds = cu_seqlens.tolist()
    out = torch.empty_like(query)
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
            out[start:end] = F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scaling, dropout_p=dropout,
                enable_gqa=q.shape[0] != k.shape[0]).transpose(0, 1)
    return out


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                     **kwargs):
    """The attention function of :data:`ATTN_IMPLEMENTATION` and :data:`VISION_ATTN_IMPLEMENTATION` (Hugging Face's
    attention-interface signature: ``query`` (B, Hq, S, D), ``key``/``value`` (B, Hkv, S, D); returns
    ((B, S, Hq, D), None)). Causal unless the caller passes ``is_causal=False`` or the module's ``is_causal`` is
    False (a vision encoder's attention)."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      sliding_window=sliding_window, **kwargs)
    if sliding_window is not None:
        raise ValueError("packed forwards (use_remove_padding) do not support sliding-window attention; "
                                  "set use_remove_padding=false for this model")
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got a batch of {query.shape[0]}")
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (N, H, D)
    varlen = _varlen()
    if varlen is not None and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and dropout == 0.0:
        varlen_attn, masks, gqa = varlen
        options = masks[bool(causal)]
        if q.shape[1] != k.shape[1]:
            if gqa:
                options = {**options, "enable_gqa": True}
            else:
                groups = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        longest = kwargs.get("max_length_q")  # callers of the flash-attention interface pass it; else derive it
        max_len = int(longest) if longest is not None else int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        out = varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens, cu_seqlens, max_len, max_len,
                          scale=scaling, **options)
    else:
        out = _per_sequence(q, k, v, cu_seqlens, scaling, dropout, bool(causal))
    return out.unsqueeze(0), None


def _packed_mask(*args, attention_mask=None, **kwargs):
    """Padding masks as SDPA takes them; none at all for packed rows (their attention reads cu_seqlens)."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


@functools.cache
def register() -> str:
    """Register :data:`ATTN_IMPLEMENTATION` and :data:`VISION_ATTN_IMPLEMENTATION` with transformers (once per
    process); returns the former's name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _varlen()
    for name in (ATTN_IMPLEMENTATION, VISION_ATTN_IMPLEMENTATION):
        AttentionInterface.register(name, packed_attention)
        AttentionMaskInterface.register(name, _packed_mask)
    return ATTN_IMPLEMENTATION


def use_varlen_in_vision_tower(tower: torch.nn.Module | None) -> None:
    """Give a vision encoder (Qwen2-VL / Qwen2.5-VL's) :data:`VISION_ATTN_IMPLEMENTATION`, so that each block's
    attention over its windows (or whole images) is one varlen call on ``cu_seqlens`` instead of a loop of one
    SDPA call per window: about 300 windows of 64 patches per 20 images of 448 x 448 pixels, times 28 windowed
    blocks, each call a launch and a Python round trip, forward, recomputed and backward. transformers passes
    ``cu_seqlens`` to implementations named like flash attention; where a version does not, its per-window loop
    still calls :func:`packed_attention` without them, which is then plain SDPA. A model without a tower that
    :func:`verl.models.vision.vision_tower` finds (``None``) keeps its implementation."""
    if tower is None:
        return
    register()
    tower.config._attn_implementation = VISION_ATTN_IMPLEMENTATION
