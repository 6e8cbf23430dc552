"""Triton kernels for the decode step on CUDA: fused RoPE + key/value cache write, fused SiLU-and-multiply,
and one-pass sampling (Gumbel-max + log-softmax of the choice) over the vocabulary.

Only imported for CUDA tensors (:func:`enabled`); CPU keeps the plain torch code of ``model.py`` and
``sampling.py``. Each kernel rounds where the torch ops it replaces round (to the activation dtype after
each op), so bf16 results agree with the torch path up to fused multiply-adds. ``VERL_NATIVE_TRITON=0``
turns them off (the torch path runs everywhere).
"""

from __future__ import annotations

import os

import torch

_STATE: dict = {}


def enabled(t: torch.Tensor) -> bool:
    """Whether the Triton kernels serve this (CUDA) tensor."""
    if not t.is_cuda or os.environ.get("VERL_NATIVE_TRITON", "1") == "0":
        return False
    if "ok" not in _STATE:
        try:
            import triton  # noqa: F401

            _build()
            _STATE["ok"] = True
        except ImportError:  # no triton: fall back to torch
            _STATE["ok"] = False
    return _STATE["ok"]


def _build() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def rope_kv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, wpos_ptr, slot_ptr, qo_ptr, kc_ptr, vc_ptr,
                       max_len, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BH: tl.constexpr,
                       BKV: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        pos = tl.load(pos_ptr + row)
        wpos = tl.load(wpos_ptr + row)
        slot = tl.load(slot_ptr + row)
        d = tl.arange(0, D)
        dr = (d + D // 2) % D  # roll(x, D/2)[i] = x[(i - D/2) mod D] = x[(i + D/2) mod D]
        cos = tl.load(cos_ptr + pos * D + d).to(tl.float32)[None, :]
        sin = tl.load(sin_ptr + pos * D + d).to(tl.float32)[None, :]
        dtype = qo_ptr.dtype.element_ty
        # queries
        h = tl.arange(0, BH)[:, None]
        hm = h < H
        qb = q_ptr + row * (H * D) + h * D
        x = tl.load(qb + d[None, :], mask=hm, other=0.0).to(tl.float32)
        xr = tl.load(qb + dr[None, :], mask=hm, other=0.0).to(tl.float32)
        a = (x * cos).to(dtype).to(tl.float32)
        tl.store(qo_ptr + row * (H * D) + h * D + d[None, :], (a + xr * sin).to(dtype), mask=hm)
        # keys (rotated) and values into the cache row of (slot, head, wpos)
        g = tl.arange(0, BKV)[:, None]
        gm = g < HKV
        kb = k_ptr + row * (HKV * D) + g * D
        x = tl.load(kb + d[None, :], mask=gm, other=0.0).to(tl.float32)
        xr = tl.load(kb + dr[None, :], mask=gm, other=0.0).to(tl.float32)
        a = (x * cos).to(dtype).to(tl.float32)
        dst = ((slot * HKV + g) * max_len + wpos) * D + d[None, :]
        tl.store(kc_ptr + dst, (a + xr * sin).to(dtype), mask=gm)
        vals = tl.load(v_ptr + row * (HKV * D) + g * D + d[None, :], mask=gm, other=0.0)
        tl.store(vc_ptr + dst, vals, mask=gm)

    @triton.jit
    def silu_mul_kernel(g_ptr, u_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
        dtype = o_ptr.dtype.element_ty
        s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
        tl.store(o_ptr + offs, (s * u).to(dtype), mask=m)

    @triton.jit(do_not_specialize=["seed"])
    def sample_kernel(x_ptr, stride, tok_ptr, lp_ptr, temperature, seed, V: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = x_ptr + row.to(tl.int64) * stride
        lanes = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        idx = tl.zeros([BLOCK], tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + lanes
            valid = offs < V
            x = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32) / temperature
            m_new = tl.maximum(m, x)
            live = m_new > float("-inf")
            s = tl.where(live, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
            m = m_new
            u = tl.rand(seed, row * V + offs)
            score = tl.where(valid, x - tl.log(-tl.log(u)), float("-inf"))
            better = score > best
            best = tl.where(better, score, best)
            idx = tl.where(better, offs, idx)
        mx = tl.max(m, axis=0)
        total = tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - mx), 0.0), axis=0)
        top = tl.max(best, axis=0)
        choice = tl.min(tl.where(best == top, idx, V), axis=0)
        choice = tl.minimum(choice, V - 1)
        chosen = tl.load(base + choice).to(tl.float32) / temperature
        tl.store(tok_ptr + row, choice.to(tl.int64))
        tl.store(lp_ptr + row, chosen - (mx + tl.log(total)))

    _STATE.update(rope_kv=rope_kv_kernel, silu_mul=silu_mul_kernel, sample=sample_kernel,
                  next_pow2=triton.next_power_of_2)


def rope_supported(head_dim: int) -> bool:
    return head_dim >= 2 and head_dim & (head_dim - 1) == 0


def rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
                  positions: torch.Tensor, write_pos: torch.Tensor, slot_ids: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor) -> torch.Tensor:
    """RoPE on ``q (b, H, D)`` and ``k (b, Hkv, D)`` at ``positions``; rotated keys and ``v`` are written into
    ``keys``/``values`` ``(slots, Hkv, max_len, D)`` at ``(slot_ids[i], :, write_pos[i])``. Returns rotated q."""
    b, H, D = q.shape
    HKV = k.shape[1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    assert keys.is_contiguous() and values.is_contiguous() and cos_table.is_contiguous() and sin_table.is_contiguous()
    out = torch.empty_like(q)
    np2 = _STATE["next_pow2"]
    _STATE["rope_kv"][(b,)](q, k, v, cos_table, sin_table, positions, write_pos, slot_ids, out, keys, values,
                            keys.shape[2], H=H, HKV=HKV, D=D, BH=np2(H), BKV=np2(HKV), num_warps=2)
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with torch's roundings (silu rounded to the dtype, then the product)."""
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    n = gate.numel()
    block = 2048
    _STATE["silu_mul"][(triton_cdiv(n, block),)](gate, up, out, n, BLOCK=block, num_warps=8)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sample(logits: torch.Tensor, temperature: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``(b,)`` drawn from ``softmax(logits / temperature)`` by Gumbel-max with Philox noise keyed by
    ``seed``, and ``log_softmax(logits / temperature)`` at them, in one pass over ``logits (b, V)``."""
    b, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    tokens = torch.empty(b, dtype=torch.long, device=logits.device)
    log_probs = torch.empty(b, dtype=torch.float32, device=logits.device)
    if b:
        _STATE["sample"][(b,)](logits, logits.stride(0), tokens, log_probs, float(temperature), int(seed),
                               V=V, BLOCK=2048, num_warps=8)
    return tokens, log_probs
