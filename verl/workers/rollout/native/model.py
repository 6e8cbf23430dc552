"""The decoder forward of Qwen2/Qwen2.5, Qwen3 and Llama over the Hugging Face module's own weights.

:class:`DecoderWeights` keeps references to the module's parameter tensors (no copy); ``bind`` walks
the module again, which is how a generation call picks up weights that FSDP unsharded into fresh
storage or that an optimizer step changed in place. Two forwards read them:

- :func:`prefill`: left-padded prompts ``(B, T)``, causal SDPA with a padding mask, keys/values
  written into the slot cache (each prompt into every slot that samples from it), logits of the last
  position only.
- :func:`decode`: one token per slot for slots ``[0, b)``, keys/values appended in the cache, SDPA
  over the cache with a per-slot length mask. Grouped-query attention without repeating the cache:
  the ``g`` query heads sharing a kv head become ``g`` query rows of that head.

Both follow transformers' op order (RMSNorm, RoPE with its ``inv_freq`` and ``attention_scaling``,
SwiGLU), so greedy outputs match ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl.workers.rollout.native import triton_ops

__all__ = ["DecoderWeights", "UnsupportedModelError", "decode", "extend", "prefill"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# RoPE variants whose frequencies do not depend on the sequence length (dynamic/longrope do).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedModelError(ValueError):
    """The native engine cannot run this model; the message says to use ``rollout.name=hf``."""


def _unsupported(what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"rollout.name=native does not support {what}; it runs {', '.join(SUPPORTED_MODEL_TYPES)} decoders (RMSNorm, "
        "RoPE, SwiGLU, full attention). Set actor_rollout_ref.rollout.name=hf to generate with transformers instead.")


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    q: torch.Tensor
    q_bias: torch.Tensor | None
    k: torch.Tensor
    k_bias: torch.Tensor | None
    v: torch.Tensor
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate: torch.Tensor
    gate_bias: torch.Tensor | None
    up: torch.Tensor
    up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


def _tensor(t, where: str) -> torch.Tensor | None:
    if t is None:
        return None
    if type(t).__name__ == "DTensor" or (hasattr(t, "full_tensor") and hasattr(t, "placements")):
        raise RuntimeError(f"{where} is still sharded (a DTensor): the native rollout must run inside the "
                           "training engine's gathered_params() block, which unshards the weights")
    return t.detach()


class DecoderWeights:
    """References to a supported HF causal LM's weights plus the model constants the forward needs."""

    def __init__(self, module: torch.nn.Module):
        config = getattr(module, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise _unsupported(f"model_type {model_type!r} ({type(module).__name__})")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise _unsupported(f"hidden_act {config.hidden_act!r}")
        layer_types = getattr(config, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
            raise _unsupported("sliding-window attention layers")
        rotary = module.model.rotary_emb
        rope_type = getattr(rotary, "rope_type", "default")
        if rope_type not in STATIC_ROPE_TYPES:
            raise _unsupported(f"rope type {rope_type!r}")
        self.model_type = model_type
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        if rotary.inv_freq.numel() * 2 != self.head_dim:
            raise _unsupported("partial rotary embeddings")
        self.hidden_size = config.hidden_size
        self.eps = float(config.rms_norm_eps)
        self.rope_inv_freq = rotary.inv_freq.detach().float().clone()
        self.rope_scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.module = module
        # The last few tables made (a generation call uses one: its cache length). Captured CUDA graphs read a
        # table by address, so the engine keys its graphs on the table too (see rope_pointers).
        self._rope_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.layers: list[LayerWeights] = []

    def bind(self) -> None:
        """(Re)read the module's current parameter tensors (references only). Called at the start of
        every generation: the weights are sharded outside the worker's ``gathered_params()`` block."""
        module = self.module
        self.embed = _tensor(module.get_input_embeddings().weight, "the input embedding")
        self.lm_head = _tensor(module.get_output_embeddings().weight, "lm_head")
        self.norm = _tensor(module.model.norm.weight, "model.norm")
        self.layers = []
        for i, layer in enumerate(module.model.layers):
            attn, mlp = layer.self_attn, layer.mlp

            def w(part, name, i=i):
                return _tensor(part.weight, f"layers.{i}.{name}")

            def b(part, name, i=i):
                return _tensor(getattr(part, "bias", None), f"layers.{i}.{name}.bias")

            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            self.layers.append(LayerWeights(
                input_norm=w(layer.input_layernorm, "input_layernorm"), q=w(attn.q_proj, "q_proj"),
                q_bias=b(attn.q_proj, "q_proj"), k=w(attn.k_proj, "k_proj"), k_bias=b(attn.k_proj, "k_proj"),
                v=w(attn.v_proj, "v_proj"), v_bias=b(attn.v_proj, "v_proj"), o=w(attn.o_proj, "o_proj"),
                o_bias=b(attn.o_proj, "o_proj"), q_norm=None if q_norm is None else w(q_norm, "q_norm"),
                k_norm=None if k_norm is None else w(k_norm, "k_norm"),
                post_norm=w(layer.post_attention_layernorm, "post_attention_layernorm"),
                gate=w(mlp.gate_proj, "gate_proj"), gate_bias=b(mlp.gate_proj, "gate_proj"),
                up=w(mlp.up_proj, "up_proj"), up_bias=b(mlp.up_proj, "up_proj"), down=w(mlp.down_proj, "down_proj"),
                down_bias=b(mlp.down_proj, "down_proj")))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def tensors(self) -> list[torch.Tensor]:
        out = [self.embed, self.lm_head, self.norm]
        for layer in self.layers:
            out.extend(t for t in vars(layer).values() if t is not None)
        return out

    def pointers(self) -> tuple[int, ...]:
        """Storage addresses of every weight: CUDA graphs captured over other addresses are stale."""
        return tuple(t.data_ptr() for t in self.tensors())

    def rope_pointers(self, max_len: int) -> tuple[int, int]:
        return tuple(t.data_ptr() for t in self.rope(max_len))

    def rope(self, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin tables ``(max_len, head_dim)``: rotate_half(x) * sin equals
        roll(x, head_dim/2) * cat(-sin, sin) because both halves of the RoPE angles are equal."""
        key = (max_len, self.device, self.dtype)
        if key in self._rope_cache:
            self._rope_cache[key] = self._rope_cache.pop(key)  # most recently used last
        else:
            while len(self._rope_cache) >= 4:
                self._rope_cache.pop(next(iter(self._rope_cache)))
            positions = torch.arange(max_len, device=self.device, dtype=torch.float32)
            freqs = positions[:, None] * self.rope_inv_freq.to(self.device)[None, :]
            cos = torch.cat((freqs, freqs), dim=-1).cos() * self.rope_scaling
            sin = freqs.sin() * self.rope_scaling
            sin = torch.cat((-sin, sin), dim=-1)
            self._rope_cache[key] = (cos.to(self.dtype), sin.to(self.dtype))
        return self._rope_cache[key]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


def _projections(w: DecoderWeights, lw: LayerWeights, h: torch.Tensor):
    """q ``(..., H, D)``, k and v ``(..., Hkv, D)`` before RoPE (Qwen3's q/k norms applied)."""
    q = F.linear(h, lw.q, lw.q_bias).unflatten(-1, (w.num_heads, w.head_dim))
    k = F.linear(h, lw.k, lw.k_bias).unflatten(-1, (w.num_kv_heads, w.head_dim))
    v = F.linear(h, lw.v, lw.v_bias).unflatten(-1, (w.num_kv_heads, w.head_dim))
    if lw.q_norm is not None:
        q = _rms_norm(q, lw.q_norm, w.eps)
        k = _rms_norm(k, lw.k_norm, w.eps)
    return q, k, v


def _attention_inputs(w: DecoderWeights, lw: LayerWeights, h: torch.Tensor, cos, sin):
    """q ``(..., H, D)``, k and v ``(..., Hkv, D)`` with RoPE (and Qwen3's q/k norms) applied."""
    q, k, v = _projections(w, lw, h)
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


def _add_linear(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x + h @ weight.T (+ bias)``; one GEMM with the residual as its C operand where possible."""
    if bias is None and x.dim() == 2:
        return torch.addmm(x, h, weight.t())
    return x + F.linear(h, weight, bias)


def _mlp_residual(x: torch.Tensor, lw: LayerWeights, eps: float, fused: bool = False) -> torch.Tensor:
    h = _rms_norm(x, lw.post_norm, eps)
    gate = F.linear(h, lw.gate, lw.gate_bias)
    up = F.linear(h, lw.up, lw.up_bias)
    act = triton_ops.silu_mul(gate, up) if fused else F.silu(gate) * up
    return _add_linear(x, act, lw.down, lw.down_bias)


def prefill(w: DecoderWeights, cache, input_ids: torch.Tensor, valid: torch.Tensor, first_col: int,
            slots: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """Run left-padded prompts and store their keys/values; returns last-position logits ``(B, V)``.

    ``input_ids``/``valid`` ``(B, T)`` are columns ``[first_col, first_col + T)`` of the padded
    prompts; they land at the same columns of the cache. ``slots[j]`` receives prompt ``sources[j]``.
    """
    T = input_ids.shape[1]
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    cos_table, sin_table = w.rope(cache.max_len)  # the decode steps' table: one per cache shape
    cos, sin = cos_table[positions][:, :, None], sin_table[positions][:, :, None]
    causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
    # Padding queries attend to themselves only, so no row of the mask is empty.
    mask = ((causal & valid[:, None, :]) | torch.eye(T, dtype=torch.bool, device=input_ids.device))[:, None]
    unpadded = bool(valid.all())
    groups = w.num_heads // w.num_kv_heads
    fused = triton_ops.enabled(input_ids)
    x = F.embedding(input_ids, w.embed)
    for i, lw in enumerate(w.layers):
        q, k, v = _attention_inputs(w, lw, _rms_norm(x, lw.input_norm, w.eps), cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cache.store_prompt(i, slots, k[sources], v[sources], first_col)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if unpadded else mask, is_causal=unpadded)
        x = x + F.linear(out.transpose(1, 2).flatten(2), lw.o, lw.o_bias)
        x = _mlp_residual(x, lw, w.eps, fused)
    last = _rms_norm(x[:, -1], w.norm, w.eps)
    return F.linear(last, w.lm_head)


def decode(w: DecoderWeights, cache, tokens: torch.Tensor, write_pos: torch.Tensor, start: torch.Tensor,
           slot_ids: torch.Tensor) -> torch.Tensor:
    """One step for slots ``[0, b)``: feed ``tokens`` at cache column ``write_pos``, attend to columns
    ``[start, write_pos]``; returns logits ``(b, V)``. Shapes and addresses are fixed for a given
    ``b``, so this is what a CUDA graph captures."""
    b = tokens.shape[0]
    cos_table, sin_table = w.rope(cache.max_len)
    positions = write_pos - start
    columns = cache.columns[None, :]
    visible = (columns >= start[:, None]) & (columns <= write_pos[:, None])
    bias = torch.zeros(visible.shape, dtype=w.dtype, device=tokens.device)
    bias = bias.masked_fill(~visible, float("-inf"))[:, None, None, :]
    groups = w.num_heads // w.num_kv_heads
    fused = triton_ops.enabled(tokens)  # the Triton kernels serve CUDA tensors only
    fuse_rope = fused and triton_ops.rope_supported(w.head_dim)
    if not fuse_rope:
        cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]
        # Row of the flattened (slots * kv_heads * max_len, head_dim) cache that each new key goes to.
        heads = torch.arange(w.num_kv_heads, device=tokens.device)
        rows = ((slot_ids[:, None] * w.num_kv_heads + heads) * cache.max_len + write_pos[:, None]).flatten()
    x = F.embedding(tokens, w.embed)
    for i, lw in enumerate(w.layers):
        keys, values = cache.k[i], cache.v[i]
        if fuse_rope:
            q, k, v = _projections(w, lw, _rms_norm(x, lw.input_norm, w.eps))
            # RoPE of q and k, and the cache write of k and v, in one kernel.
            q = triton_ops.rope_kv_write(q, k, v, cos_table, sin_table, positions, write_pos, slot_ids, keys, values)
        else:
            q, k, v = _attention_inputs(w, lw, _rms_norm(x, lw.input_norm, w.eps), cos, sin)
            keys.view(-1, w.head_dim).index_copy_(0, rows, k.reshape(-1, w.head_dim))
            values.view(-1, w.head_dim).index_copy_(0, rows, v.reshape(-1, w.head_dim))
        q = q.view(b, w.num_kv_heads, groups, w.head_dim)
        out = F.scaled_dot_product_attention(q, keys[:b], values[:b], attn_mask=bias)
        x = _add_linear(x, out.reshape(b, -1), lw.o, lw.o_bias)
        x = _mlp_residual(x, lw, w.eps, fused)
    return F.linear(_rms_norm(x, w.norm, w.eps), w.lm_head)


def extend(w: DecoderWeights, cache, tokens: torch.Tensor, lengths: torch.Tensor, write_pos: torch.Tensor,
           start: torch.Tensor, slots: torch.Tensor, span: int | None = None) -> torch.Tensor:
    """Append tokens to sequences already in the cache (the next part of a multi-turn episode), reusing
    their cached keys/values: row ``i`` feeds ``tokens[i, :lengths[i]]`` (right-padded ``(B, L)``) at
    cache columns ``write_pos[i] + j`` of slot ``slots[i]``, attending to columns ``[start[i], write_pos[i]
    + j]``. ``span`` (at least ``max(write_pos + lengths)``) limits the columns read. Returns the logits
    after each row's last token ``(B, V)``."""
    B, L = tokens.shape
    device = tokens.device
    span = cache.max_len if span is None else min(int(span), cache.max_len)
    steps = torch.arange(L, device=device)
    valid = steps[None] < lengths[:, None]
    columns = (write_pos[:, None] + steps[None]).clamp(max=cache.max_len - 1)
    cos_table, sin_table = w.rope(cache.max_len)
    positions = columns - start[:, None]
    cos, sin = cos_table[positions][:, :, None], sin_table[positions][:, :, None]
    read = cache.columns[None, None, :span]
    visible = (read >= start[:, None, None]) & (read <= columns[:, :, None])
    groups = w.num_heads // w.num_kv_heads
    # Queries ordered (step, group) per kv head, so the cached keys are read without repeating them.
    mask = visible[:, None, :, None, :].expand(B, 1, L, groups, span).reshape(B, 1, L * groups, span)
    heads = torch.arange(w.num_kv_heads, device=device)
    rows = ((slots[:, None, None] * w.num_kv_heads + heads[None, None]) * cache.max_len + columns[:, :, None])[valid]
    fused = triton_ops.enabled(tokens)
    x = F.embedding(tokens, w.embed)
    for i, lw in enumerate(w.layers):
        q, k, v = _attention_inputs(w, lw, _rms_norm(x, lw.input_norm, w.eps), cos, sin)
        keys, values = cache.k[i], cache.v[i]
        keys.view(-1, w.head_dim).index_copy_(0, rows.flatten(), k[valid].reshape(-1, w.head_dim))
        values.view(-1, w.head_dim).index_copy_(0, rows.flatten(), v[valid].reshape(-1, w.head_dim))
        q = q.view(B, L, w.num_kv_heads, groups, w.head_dim).permute(0, 2, 1, 3, 4).flatten(2, 3)
        out = F.scaled_dot_product_attention(q, keys[slots, :, :span], values[slots, :, :span], attn_mask=mask)
        out = out.view(B, w.num_kv_heads, L, groups, w.head_dim).permute(0, 2, 1, 3, 4).reshape(B, L, -1)
        x = x + F.linear(out, lw.o, lw.o_bias)
        x = _mlp_residual(x, lw, w.eps, fused)
    last = _rms_norm(x[torch.arange(B, device=device), lengths - 1], w.norm, w.eps)
    return F.linear(last, w.lm_head)
