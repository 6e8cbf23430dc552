"""The decoder forward over the Hugging Face module's own weights (:mod:`~verl.workers.rollout.native.weights`
says which families and what each needs).

- :func:`prefill`: left-padded prompts ``(B, T)``, causal SDPA with a padding mask, keys/values
  written into the slot cache (each prompt into every slot that samples from it), logits of the last
  position only.
- :func:`decode`: one token per slot for slots ``[0, b)``, keys/values appended in the cache, SDPA
  over the cache with a per-slot length mask. Grouped-query attention without repeating the cache:
  the ``g`` query heads sharing a kv head become ``g`` query rows of that head.
- :func:`extend`: the next tokens of sequences already in the cache (multi-turn episodes).

All follow transformers' op order (RMSNorm, RoPE with its ``inv_freq`` and ``attention_scaling``, the gated
MLP), so greedy outputs match ``generate``. Sliding-window layers see the same cache with a narrower mask (keys
more than ``window - 1`` columns back are hidden): the slots keep every column, which costs memory but no
correctness. Gemma 2's soft-capped attention scores cannot go through SDPA; they take an explicit
``softmax(cap * tanh(q k^T / cap))`` path (on GPU too).

Mixture-of-experts layers (:func:`_moe`) route each token to its top-k experts, sort the ``tokens * k``
(token, expert) assignments by expert and run each expert's two GEMMs over its contiguous rows in one grouped matmul
(``torch.nn.functional.grouped_mm``, or a loop over the experts that received rows where it is missing or the
dimensions break its 16-byte alignment). Every shape is fixed by the token count and the group boundaries stay on
the device, so the decode step remains one CUDA graph where the grouped matmul needs no host sync:
:func:`decode_capturable` says where that holds (bf16 on Hopper/Blackwell, torch's fused kernel); elsewhere torch's
grouped matmul reads the boundaries on the host and decode runs eagerly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl.models.logprob import place_image_features
from verl.workers.rollout.native import triton_ops
from verl.workers.rollout.native.weights import (SUPPORTED_MODEL_TYPES, DecoderWeights, LayerWeights,
                                                 UnsupportedModelError)

__all__ = ["DecoderWeights", "SUPPORTED_MODEL_TYPES", "UnsupportedModelError", "decode", "decode_capturable", "extend",
           "prefill"]

# torch >= 2.10 names it grouped_mm; 2.8/2.9 only have the private op.
GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _norm(w: DecoderWeights, x: torch.Tensor, weight: torch.Tensor,
          residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of ``x``, plus ``residual`` when given (rounded after the norm, then after the add)."""
    if w.gemma:  # (1 + weight) * x, all in float32, rounded once at the end; ``weight`` is bind()'s 1 + weight
        if x.dtype != torch.float32 and triton_ops.enabled(x):  # one kernel instead of the casts, norm and add
            return triton_ops.scaled_rms_norm(x, weight, w.eps, residual)
        y = F.rms_norm(x.float(), (x.shape[-1],), weight, w.eps).to(x.dtype)
    else:
        y = F.rms_norm(x, (x.shape[-1],), weight, w.eps)
    return y if residual is None else residual + y


def _embed(w: DecoderWeights, tokens: torch.Tensor) -> torch.Tensor:
    x = F.embedding(tokens, w.embed)
    return x if w.embed_scale is None else x * w.embed_scale


def embed_with_images(w: DecoderWeights, input_ids: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
    """Token embeddings ``(B, T, H)`` with the image features ``(tokens, H)`` in place of the image placeholder
    tokens (:func:`verl.models.logprob.place_image_features`)."""
    return place_image_features(_embed(w, input_ids), input_ids, w.image_token_id, features)


def _logits(w: DecoderWeights, x: torch.Tensor) -> torch.Tensor:
    logits = F.linear(_norm(w, x, w.norm), w.lm_head)
    if w.final_softcap is None:
        return logits
    if logits.dtype != torch.float32 and triton_ops.enabled(logits):  # one pass over the logits instead of three
        return triton_ops.softcap(logits, w.final_softcap)
    return torch.tanh(logits / w.final_softcap) * w.final_softcap


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return torch.addcmul(x * cos, x.roll(r // 2, dims=-1), sin)
    # Partial rotary: the first r features rotate, the rest pass through.
    head, tail = x[..., :r], x[..., r:]
    return torch.cat((torch.addcmul(head * cos, head.roll(r // 2, dims=-1), sin), tail), dim=-1)


def _projections(w: DecoderWeights, lw: LayerWeights, h: torch.Tensor):
    """q ``(..., H, D)``, k and v ``(..., Hkv, D)`` before RoPE (q/k norms applied)."""
    if lw.qkv is not None:
        q, k, v = F.linear(h, lw.qkv).split(w.qkv_sizes, dim=-1)
    else:
        q, k, v = F.linear(h, lw.q, lw.q_bias), F.linear(h, lw.k, lw.k_bias), F.linear(h, lw.v, lw.v_bias)
    q = q.unflatten(-1, (w.num_heads, w.head_dim))
    k = k.unflatten(-1, (w.num_kv_heads, w.head_dim))
    v = v.unflatten(-1, (w.num_kv_heads, w.head_dim))
    if lw.q_norm is not None:
        q = _norm(w, q, lw.q_norm)
        k = _norm(w, k, lw.k_norm)
    return q, k, v


def _attention_inputs(w: DecoderWeights, lw: LayerWeights, h: torch.Tensor, cos, sin):
    """q ``(..., H, D)``, k and v ``(..., Hkv, D)`` with RoPE (and q/k norms) applied."""
    q, k, v = _projections(w, lw, h)
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


def _attend(w: DecoderWeights, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            causal: bool = False) -> torch.Tensor:
    """Attention of ``q (..., Tq, D)`` over ``k``/``v`` ``(..., S, D)``; ``mask`` is boolean (True: seen) or
    additive. Soft-capped scores as transformers' eager attention computes them: scale, cap, mask, float32
    softmax."""
    if w.attn_softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=w.attn_scale)
    cap = w.attn_softcap
    scores = torch.tanh(torch.matmul(q, k.transpose(-1, -2)) * w.attn_scale / cap) * cap
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.matmul(scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype), v)


def _add_linear(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x + h @ weight.T (+ bias)``; one GEMM with the residual as its C operand where possible."""
    if bias is None and x.dim() == 2:
        return torch.addmm(x, h, weight.t())
    return x + F.linear(h, weight, bias)


def _attn_residual(w: DecoderWeights, x: torch.Tensor, out: torch.Tensor, lw: LayerWeights) -> torch.Tensor:
    if lw.attn_out_norm is None:
        return _add_linear(x, out, lw.o, lw.o_bias)
    return _norm(w, F.linear(out, lw.o, lw.o_bias), lw.attn_out_norm, residual=x)


def _gated(w: DecoderWeights, gate: torch.Tensor, up: torch.Tensor, fused: bool = False) -> torch.Tensor:
    if w.gelu:
        if fused and gate.dtype != torch.float32:  # float32 runs (exact comparisons) keep torch's tanh
            return triton_ops.gelu_tanh_mul(gate, up)
        return F.gelu(gate, approximate="tanh") * up
    return triton_ops.silu_mul(gate, up) if fused else F.silu(gate) * up


def _dense_act(w: DecoderWeights, lw: LayerWeights, h: torch.Tensor, fused: bool) -> torch.Tensor:
    """The dense MLP's activations ``act(gate(h)) * up(h)``, before its down projection."""
    if lw.gate_up is not None:
        gate, up = F.linear(h, lw.gate_up).chunk(2, dim=-1)
    else:
        gate, up = F.linear(h, lw.gate, lw.gate_bias), F.linear(h, lw.up, lw.up_bias)
    return _gated(w, gate, up, fused)


def _mlp_residual(w: DecoderWeights, x: torch.Tensor, lw: LayerWeights, fused: bool = False) -> torch.Tensor:
    h = _norm(w, x, lw.mlp_norm)
    if lw.router is not None:
        return x + _moe(w, lw, h, fused)
    act = _dense_act(w, lw, h, fused)
    if lw.mlp_out_norm is None:
        return _add_linear(x, act, lw.down, lw.down_bias)
    return _norm(w, F.linear(act, lw.down, lw.down_bias), lw.mlp_out_norm, residual=x)


def _grouped_mm_fits(weight: torch.Tensor) -> bool:
    """Whether torch's grouped matmul takes ``weight (E, out, in)`` and its inputs: every row stride of its operands
    must be a multiple of 16 bytes."""
    return GROUPED_MM is not None and all(d * weight.element_size() % 16 == 0 for d in weight.shape[1:])


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``x (S, in)`` sorted by group, rows ``[ends[e - 1], ends[e])`` times ``weight[e].T`` (``weight (E, out, in)``);
    returns ``(S, out)``."""
    if _grouped_mm_fits(weight):
        return GROUPED_MM(x, weight.transpose(1, 2), offs=ends)
    out = x.new_empty(x.shape[0], weight.shape[1])
    start = 0
    for e, end in enumerate(ends.tolist()):  # a host sync: such steps cannot be captured
        if end > start:
            out[start:end] = F.linear(x[start:end], weight[e])
        start = end
    return out


def _moe(w: DecoderWeights, lw: LayerWeights, h: torch.Tensor, fused: bool) -> torch.Tensor:
    """The mixture-of-experts MLP of normed hidden states ``h (..., H)``, as transformers' Qwen MoE blocks compute
    it: router softmax in float32, top-k (renormalised when ``norm_topk_prob``), rounded to the hidden dtype; each
    expert's output times its weight, summed per token; plus the shared expert scaled by its sigmoid gate."""
    shape = h.shape
    h = h.reshape(-1, shape[-1])
    probs = F.linear(h, lw.router).softmax(dim=-1, dtype=torch.float32)
    top, experts = probs.topk(w.top_k, dim=-1)
    if w.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    top = top.to(h.dtype)
    # Assignments sorted by expert (stable: each expert's rows in token order); group ends found on the device.
    flat = experts.flatten()
    order = flat.argsort(stable=True)
    num_experts = lw.router.shape[0]
    ends = torch.searchsorted(flat[order], torch.arange(num_experts, device=h.device), right=True, out_int32=True)
    gate, up = _grouped_linear(h[order // w.top_k], lw.experts_gate_up, ends).chunk(2, dim=-1)
    out = _grouped_linear(_gated(w, gate, up), lw.experts_down, ends) * top.flatten()[order, None]
    # Back to (token, k) order, then each token's k expert outputs summed.
    out = torch.empty_like(out).index_copy_(0, order, out).view(-1, w.top_k, shape[-1]).sum(dim=1)
    if lw.shared_expert_gate is not None:
        shared = F.linear(_dense_act(w, lw, h, fused), lw.down, lw.down_bias)
        out = out + torch.sigmoid(F.linear(h, lw.shared_expert_gate)) * shared
    return out.view(shape)


def decode_capturable(w: DecoderWeights) -> bool:
    """Whether a decode step can be captured as a CUDA graph: always for dense models; for mixtures of experts only
    where torch's grouped matmul runs its fused kernel (bf16 on compute capability 9.x/10.x, aligned dimensions),
    which reads the group boundaries on the device. Its fallback, and ours, loop over the groups on the host."""
    layers = [lw for lw in w.layers if lw.router is not None]
    if not layers:
        return True
    if w.dtype != torch.bfloat16 or w.device.type != "cuda":
        return False
    if torch.cuda.get_device_capability(w.device)[0] not in (9, 10):
        return False
    return all(_grouped_mm_fits(lw.experts_gate_up) and _grouped_mm_fits(lw.experts_down) for lw in layers)


def _layer_ropes(w: DecoderWeights, max_len: int, positions: torch.Tensor, unsqueeze: int):
    """Per RoPE variant, cos and sin at ``positions`` with a heads axis inserted at ``unsqueeze``."""
    return {kind: (cos[positions].unsqueeze(unsqueeze), sin[positions].unsqueeze(unsqueeze))
            for kind, (cos, sin) in w.rope(max_len).items()}


def _mrope(w: DecoderWeights, max_len: int, positions: torch.Tensor, unsqueeze: int):
    """M-RoPE's cos and sin at ``positions (3, B, T)`` (temporal, height, width): feature ``d`` of the rotary
    takes the coordinate of its frequency's section (``w.mrope_section``, over the ``rotary_dim / 2``
    frequencies, the same for both halves), as transformers' Qwen2-VL rotary embedding composes them."""
    (cos, sin), = w.rope(max_len).values()
    sections = torch.repeat_interleave(torch.arange(3), torch.tensor(w.mrope_section)).to(positions.device)
    pick = torch.cat([sections, sections]).expand(1, *positions.shape[1:], -1)
    cos, sin = (table[positions].gather(0, pick)[0].unsqueeze(unsqueeze) for table in (cos, sin))
    return {"default": (cos, sin)}


def prefill(w: DecoderWeights, cache, input_ids: torch.Tensor, valid: torch.Tensor, first_col: int,
            slots: torch.Tensor, sources: torch.Tensor, embeds: torch.Tensor | None = None,
            rope_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Run left-padded prompts and store their keys/values; returns last-position logits ``(B, V)``.

    ``input_ids``/``valid`` ``(B, T)`` are columns ``[first_col, first_col + T)`` of the padded
    prompts; they land at the same columns of the cache. ``slots[j]`` receives prompt ``sources[j]``.
    A vision-language model passes ``embeds (B, T, H)`` (the token embeddings with its images' features in
    place of their placeholder tokens) and the M-RoPE ``rope_positions (3, B, T)``.
    """
    T = input_ids.shape[1]
    device = input_ids.device
    if rope_positions is None:
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        ropes = _layer_ropes(w, cache.max_len, positions, 2)  # the decode steps' tables: one per cache shape
    else:
        ropes = _mrope(w, cache.max_len, rope_positions, 2)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    # Padding queries attend to themselves only, so no row of the mask is empty.
    eye = torch.eye(T, dtype=torch.bool, device=device)
    seen = causal & valid[:, None, :]
    masks = {None: (seen | eye)[:, None]}
    steps = torch.arange(T, device=device)
    for window in set(w.windows) - {None}:
        near = (steps[:, None] - steps[None, :]) < window
        masks[window] = ((seen & near) | eye)[:, None]
    unpadded = bool(valid.all()) and w.attn_softcap is None
    groups = w.num_heads // w.num_kv_heads
    fused = triton_ops.enabled(input_ids)
    x = _embed(w, input_ids) if embeds is None else embeds
    for i, lw in enumerate(w.layers):
        cos, sin = ropes[w.layer_rope[i]]
        q, k, v = _attention_inputs(w, lw, _norm(w, x, lw.input_norm), cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cache.store_prompt(i, slots, k[sources], v[sources], first_col)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        window = w.windows[i]
        plain = unpadded and window is None
        out = _attend(w, q, k, v, None if plain else masks[window], causal=plain)
        x = _attn_residual(w, x, out.transpose(1, 2).flatten(2), lw)
        x = _mlp_residual(w, x, lw, fused)
    return _logits(w, x[:, -1])


def decode_bias(columns: torch.Tensor, start: torch.Tensor, write_pos: torch.Tensor, window: int | None,
                dtype: torch.dtype) -> torch.Tensor:
    """The additive mask ``(b, 1, 1, max_len)`` of a decode step's attention over the cache's ``columns``: 0 at
    ``[start, write_pos]`` (with ``window``: its last ``window`` columns only), -inf elsewhere."""
    columns = columns[None, :]
    seen = (columns >= start[:, None]) & (columns <= write_pos[:, None])
    if window is not None:
        seen &= columns > write_pos[:, None] - window
    bias = torch.zeros(seen.shape, dtype=dtype, device=columns.device)
    return bias.masked_fill(~seen, float("-inf"))[:, None, None, :]


def _fused_attention(w: DecoderWeights, t: torch.Tensor) -> bool:
    """Whether decode steps over ``t``'s device take the fused attention (which reads each row's visible columns
    only; the torch path reads every column and masks)."""
    groups = w.num_heads // w.num_kv_heads
    return triton_ops.enabled(t) and triton_ops.decode_attention_supported(w.head_dim, groups, w.dtype)


def decode_shared_chunk(w: DecoderWeights, n: int) -> int:
    """How many of the ``n`` samples of a prompt :func:`decode` reads the prompt's keys and values once for (their
    slots hold identical copies of it): ``triton_ops.shared_prefix_chunk`` where the fused attention runs, else 0
    (the torch path reads each row's own copy)."""
    if not _fused_attention(w, w.embed):
        return 0
    return triton_ops.shared_prefix_chunk(n, w.num_heads // w.num_kv_heads, w.head_dim)


def decode(w: DecoderWeights, cache, tokens: torch.Tensor, write_pos: torch.Tensor, start: torch.Tensor,
           slot_ids: torch.Tensor, rope_delta: torch.Tensor | None = None,
           shared: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> torch.Tensor:
    """One step for slots ``[0, b)``: feed ``tokens`` at cache column ``write_pos``, attend to columns
    ``[start, write_pos]`` (sliding layers: the last ``window`` of them); returns logits ``(b, V)``. Shapes and
    addresses are fixed for a given ``b``, so this is what a CUDA graph captures. The token's RoPE position is
    ``write_pos - start``, plus ``rope_delta`` for M-RoPE (a prompt's images take fewer positions than tokens).
    ``shared``: the chunks of rows whose slots hold the same prompt (``triton_ops.decode_attention``), which the
    fused attention reads once per chunk; where the torch path runs it is not needed and not read."""
    b = tokens.shape[0]
    tables = w.rope(cache.max_len)
    positions = write_pos - start if rope_delta is None else write_pos - start + rope_delta
    groups = w.num_heads // w.num_kv_heads
    fused = triton_ops.enabled(tokens)  # the Triton kernels serve CUDA tensors only
    fuse_attention = _fused_attention(w, tokens)
    biases = {} if fuse_attention else {window: decode_bias(cache.columns, start, write_pos, window, w.dtype)
                                        for window in set(w.windows)}
    fuse_rope = fused and triton_ops.rope_supported(w.head_dim) and w.rotary_dim == w.head_dim
    if not fuse_rope:
        ropes = {kind: (cos[positions][:, None], sin[positions][:, None]) for kind, (cos, sin) in tables.items()}
        # Row of the flattened (slots * kv_heads * max_len, head_dim) cache that each new key goes to.
        heads = torch.arange(w.num_kv_heads, device=tokens.device)
        rows = ((slot_ids[:, None] * w.num_kv_heads + heads) * cache.max_len + write_pos[:, None]).flatten()
    x = _embed(w, tokens)
    for i, lw in enumerate(w.layers):
        keys, values = cache.k[i], cache.v[i]
        if fuse_rope:
            q, k, v = _projections(w, lw, _norm(w, x, lw.input_norm))
            cos_table, sin_table = tables[w.layer_rope[i]]
            # RoPE of q and k, and the cache write of k and v, in one kernel.
            q = triton_ops.rope_kv_write(q, k, v, cos_table, sin_table, positions, write_pos, slot_ids, keys, values)
        else:
            cos, sin = ropes[w.layer_rope[i]]
            q, k, v = _attention_inputs(w, lw, _norm(w, x, lw.input_norm), cos, sin)
            keys.view(-1, w.head_dim).index_copy_(0, rows, k.reshape(-1, w.head_dim))
            values.view(-1, w.head_dim).index_copy_(0, rows, v.reshape(-1, w.head_dim))
        q = q.view(b, w.num_kv_heads, groups, w.head_dim)
        if fuse_attention:
            out = triton_ops.decode_attention(q, keys, values, start, write_pos, w.windows[i], w.attn_scale,
                                              w.attn_softcap, shared=shared)
        else:
            out = _attend(w, q, keys[:b], values[:b], biases[w.windows[i]])
        x = _attn_residual(w, x, out.reshape(b, -1), lw)
        x = _mlp_residual(w, x, lw, fused)
    return _logits(w, x)


def extend(w: DecoderWeights, cache, tokens: torch.Tensor, lengths: torch.Tensor, write_pos: torch.Tensor,
           start: torch.Tensor, slots: torch.Tensor, span: int | None = None) -> torch.Tensor:
    """Append tokens to sequences already in the cache (the next part of a multi-turn episode), reusing
    their cached keys/values: row ``i`` feeds ``tokens[i, :lengths[i]]`` (right-padded ``(B, L)``) at
    cache columns ``write_pos[i] + j`` of slot ``slots[i]``, attending to columns ``[start[i], write_pos[i]
    + j]`` (sliding layers: the last ``window`` of them). ``span`` (at least ``max(write_pos + lengths)``)
    limits the columns read. Returns the logits after each row's last token ``(B, V)``."""
    B, L = tokens.shape
    device = tokens.device
    span = cache.max_len if span is None else min(int(span), cache.max_len)
    steps = torch.arange(L, device=device)
    valid = steps[None] < lengths[:, None]
    columns = (write_pos[:, None] + steps[None]).clamp(max=cache.max_len - 1)
    ropes = _layer_ropes(w, cache.max_len, columns - start[:, None], 2)
    read = cache.columns[None, None, :span]
    visible = (read >= start[:, None, None]) & (read <= columns[:, :, None])
    groups = w.num_heads // w.num_kv_heads
    # Queries ordered (step, group) per kv head, so the cached keys are read without repeating them.
    masks = {}
    for window in set(w.windows):
        seen = visible if window is None else visible & (read > columns[:, :, None] - window)
        masks[window] = seen[:, None, :, None, :].expand(B, 1, L, groups, span).reshape(B, 1, L * groups, span)
    heads = torch.arange(w.num_kv_heads, device=device)
    rows = ((slots[:, None, None] * w.num_kv_heads + heads[None, None]) * cache.max_len + columns[:, :, None])[valid]
    fused = triton_ops.enabled(tokens)
    x = _embed(w, tokens)
    for i, lw in enumerate(w.layers):
        cos, sin = ropes[w.layer_rope[i]]
        q, k, v = _attention_inputs(w, lw, _norm(w, x, lw.input_norm), cos, sin)
        keys, values = cache.k[i], cache.v[i]
        keys.view(-1, w.head_dim).index_copy_(0, rows.flatten(), k[valid].reshape(-1, w.head_dim))
        values.view(-1, w.head_dim).index_copy_(0, rows.flatten(), v[valid].reshape(-1, w.head_dim))
        q = q.view(B, L, w.num_kv_heads, groups, w.head_dim).permute(0, 2, 1, 3, 4).flatten(2, 3)
        out = _attend(w, q, keys[slots, :, :span], values[slots, :, :span], masks[w.windows[i]])
        out = out.view(B, w.num_kv_heads, L, groups, w.head_dim).permute(0, 2, 1, 3, 4).reshape(B, L, -1)
        x = _attn_residual(w, x, out, lw)
        x = _mlp_residual(w, x, lw, fused)
    return _logits(w, x[torch.arange(B, device=device), lengths - 1])
