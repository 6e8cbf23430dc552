"""Triton kernels for the decode step on CUDA: fused RoPE + key/value cache write, the attention over the slot
cache (flash-decoding, with Gemma's soft-cap and sliding windows), fused SiLU-and-multiply, Gemma's float32
RMSNorm with its residual add, its tanh-GELU-and-multiply and its logit soft-cap (bf16/fp16 activations), and
sampling with top-k/top-p filters found without a sort (the kernels are in ``triton_kernels.py``).

Only used for CUDA tensors (:func:`enabled`); CPU keeps the plain torch code of ``model.py`` and
``sampling.py``. The RoPE and SiLU kernels round where the torch ops they replace round (to the
activation dtype after each op), so bf16 results agree with the torch path up to fused multiply-adds. The
attention keeps scores and softmax in float32 (as SDPA's fused kernels do) and rounds only the probabilities
that multiply the values. ``VERL_NATIVE_TRITON=0`` turns them off (the torch path runs everywhere). The tests
also run the kernels on a CPU through Triton's interpreter (``TRITON_INTERPRET=1``).
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
            _kernels()
            _STATE["ok"] = True
        except ImportError:  # no triton: fall back to torch
            _STATE["ok"] = False
    return _STATE["ok"]


def _kernels():
    from verl.workers.rollout.native import triton_kernels  # imports triton

    return triton_kernels


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
    _kernels().rope_kv_kernel[(b,)](q, k, v, cos_table, sin_table, positions, write_pos, slot_ids, out, keys,
                                    values, keys.shape[2], H=H, HKV=HKV, D=D, BH=_next_pow2(H), BKV=_next_pow2(HKV),
                                    num_warps=2)
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with torch's roundings (silu rounded to the dtype, then the product)."""
    return _elementwise(_kernels().silu_mul_kernel, (gate, up))


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up`` (Gemma's MLP) with torch's roundings."""
    return _elementwise(_kernels().gelu_tanh_mul_kernel, (gate, up))


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma's logit soft-cap ``tanh(x / cap) * cap`` in one pass, with the torch ops' roundings."""
    return _elementwise(_kernels().softcap_kernel, (x,), float(cap))


def _elementwise(kernel, inputs: tuple[torch.Tensor, ...], *scalars) -> torch.Tensor:
    """``kernel(*inputs, out, n, *scalars)`` over blocks of 2,048 elements; ``out`` is shaped like the first input."""
    inputs = tuple(t.contiguous() for t in inputs)
    out = torch.empty_like(inputs[0])
    n = out.numel()
    block = 2048
    kernel[(_cdiv(n, block),)](*inputs, out, n, *scalars, BLOCK=block, num_warps=8)
    return out


def scaled_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float,
                    residual: torch.Tensor | None = None) -> torch.Tensor:
    """Gemma's normalisation in one kernel: ``rms_norm(x.float(), scale, eps)`` with the float32 ``scale`` (``1 +
    weight``) rounded to ``x``'s dtype, then ``residual +`` it rounded again, as the torch ops round; the torch path
    takes four or five kernels (the casts, the norm, the add). Rows of ``x (..., H)``."""
    h = x.shape[-1]
    rows = x.reshape(-1, h).contiguous()
    out = torch.empty_like(rows)
    res = rows if residual is None else residual.reshape(-1, h).contiguous()
    assert scale.dtype == torch.float32 and scale.is_contiguous() and scale.numel() == h
    _kernels().scaled_rms_norm_kernel[(rows.shape[0],)](rows, scale, res, out, h, float(eps), BLOCK=_next_pow2(h),
                                                        RESIDUAL=residual is not None, num_warps=8 if h > 2048 else 4)
    return out.view(x.shape)


MAX_SPLITS = 32  # parts a row's columns are cut into at most (a small batch on a large GPU)


def decode_attention_supported(head_dim: int, groups: int, dtype: torch.dtype) -> bool:
    """Whether the engine's decode step uses :func:`decode_attention`: bf16/fp16 activations (float32 ones, for
    exact comparisons, keep SDPA: their tiles need up to 150 KB of shared memory and full-precision products) and
    a head shape its tiles take (a power-of-two head dimension of at least 16; a group of query heads is padded
    to at least 16 rows)."""
    return (dtype in (torch.bfloat16, torch.float16) and 16 <= head_dim <= 512 and head_dim & (head_dim - 1) == 0
            and groups <= 64)


SHARED_TABLE_WIDTH = 64  # columns of the chunk table (``SlotState.members``): the most rows a chunk may hold


def shared_prefix_chunk(n: int, groups: int, head_dim: int) -> int:
    """How many rows that share a prompt one program of :func:`decode_attention` serves (0: no sharing): up to the
    ``n`` samples of a prompt, as long as their stacked query heads (``chunk * groups`` rows) stay within 64 and
    the float32 tile of their outputs within 8192 values (32 KiB, as much as the queries' and the keys' tiles
    together: more would spill registers)."""
    if n < 2:
        return 0
    chunk = min(n, 64 // groups, 8192 // (head_dim * groups), SHARED_TABLE_WIDTH)
    return chunk if chunk >= 2 else 0


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: torch.Tensor,
                     write_pos: torch.Tensor, window: int | None, scale: float | None, softcap: float | None,
                     splits: int | None = None, shared: tuple[torch.Tensor, torch.Tensor, int] | None = None,
                     prefix_splits: int | None = None) -> torch.Tensor:
    """One decode step's attention, fused: ``q (b, Hkv, G, D)`` (the ``G`` query heads of each kv head) over the
    cache ``keys``/``values`` ``(slots, Hkv, max_len, D)``, row ``i`` reading slot ``i`` at columns
    ``[start[i], write_pos[i]]`` (with ``window``: only the last ``window`` of them). Scores are ``q.k * scale``
    (``scale`` None: ``D ** -0.5``, as SDPA), soft-capped to ``tanh(s / softcap) * softcap`` when ``softcap`` is
    set, softmaxed in float32. Returns ``(b, Hkv, G, D)`` in q's dtype.

    Only the visible columns are read (the torch path reads all ``max_len`` and masks). A row's columns are cut
    into ``splits`` parts attended in parallel and combined (flash-decoding), chosen so that the grid fills the
    GPU (at most ``MAX_SPLITS``); the grid depends only on ``b`` and the cache's shape, so a CUDA graph captures
    it. The split count and the window are runtime arguments: one compile serves every batch-size bucket.

    ``shared = (members, shared_end, chunk)``: rows whose slots hold identical keys and values up to column
    ``shared_end[i]`` (the ``n`` samples of a prompt prefilled together) read those columns once per chunk of
    them instead of once per row. ``members (slots, SHARED_TABLE_WIDTH)`` int32 lists each chunk's rows in its
    first row's entry (that row first; -1 pads it) and holds -1 in the first column of every other row; a chunk
    has at most ``chunk`` rows (:func:`shared_prefix_chunk`), each seeing its own range of the shared columns
    (from its start or its window). The shared columns are cut into ``prefix_splits`` parts, the rest of each row
    into ``splits``."""
    b, hkv, groups, head_dim = q.shape
    assert keys.is_contiguous() and values.is_contiguous() and keys.shape[1] == hkv and keys.shape[3] == head_dim
    q = q.contiguous()
    max_len = keys.shape[2]
    block = 64 if head_dim <= 128 else 32
    programs = 2 * _multiprocessors(q.device) if q.is_cuda else 1
    most = _cdiv(max_len, 4 * block)
    if splits is None:
        splits = min(_cdiv(programs, max(1, b * hkv)), most)
    if shared is None:
        members = end = start
        chunk, prefix_splits = 1, 0
    else:
        members, end, chunk = shared
        assert members.dtype == torch.int32 and members.shape[1] == SHARED_TABLE_WIDTH and 2 <= chunk <= members.shape[1]
        if prefix_splits is None:
            prefix_splits = min(_cdiv(programs, _cdiv(b, chunk) * hkv), most)
        prefix_splits = max(1, min(int(prefix_splits), MAX_SPLITS - 1))
    splits = max(1, min(int(splits), MAX_SPLITS - prefix_splits))
    total_splits = splits + prefix_splits
    out = torch.empty_like(q)
    if total_splits > 1:
        m = torch.empty(b, hkv, total_splits, groups, dtype=torch.float32, device=q.device)
        total = torch.empty_like(m)
        acc = torch.empty(b, hkv, total_splits, groups, head_dim, dtype=torch.float32, device=q.device)
    else:
        m = total = acc = out
    kernels = _kernels()
    kernels.decode_attention_kernel[(b * hkv, total_splits)](
        q, keys, values, start, write_pos, end, members, out, m, total, acc, b, max_len, int(window or 0),
        total_splits, prefix_splits, float(head_dim ** -0.5 if scale is None else scale), float(softcap or 1.0),
        HKV=hkv, G=groups, D=head_dim, GP=max(16, _next_pow2(groups)), NM=chunk, NMS=SHARED_TABLE_WIDTH,
        MP=max(16, _next_pow2(chunk * groups)), BN=block, SOFTCAP=softcap is not None,
        IEEE=q.dtype == torch.float32, SHARED=shared is not None,
        INTERPRETED=os.environ.get("TRITON_INTERPRET") == "1", num_warps=4)
    if total_splits > 1:
        kernels.decode_attention_combine_kernel[(b * hkv * groups,)](m, total, acc, out, total_splits, G=groups,
                                                                    D=head_dim, SP=MAX_SPLITS, num_warps=4)
    return out


def _multiprocessors(device: torch.device) -> int:
    key = ("sms", device.index)
    if key not in _STATE:
        _STATE[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _STATE[key]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int, *, chunk: int = 8192,
           block: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``(b,)`` drawn from ``softmax(logits / temperature)`` after top-k then top-p filtering, and
    ``log_softmax(logits / temperature)`` at them (before filtering), for ``logits (b, V)``.

    Same filters as ``sampling.sample`` (see there for the tie rule); no sort: a radix search over the
    logits' order-preserving keys, two bits per pass over the row, finds each filter's threshold (8 passes
    per filter for bf16/fp16 logits, 16 for fp32), then one draw by inverse CDF with Philox noise keyed by
    ``(seed, row)``. Rows are split into chunks of ``chunk``
    tokens, one program per (row, chunk)."""
    return _sample(logits, temperature, top_k, top_p, seed, chunk=chunk, block=block)[:2]


def order_key(x: torch.Tensor) -> torch.Tensor:
    """The keys the threshold search orders tokens by: the raw bits of ``x`` (bf16/fp16/fp32) mapped to
    int64 so that integer order is float order (-0.0 takes the key of +0.0)."""
    bits = {2: torch.int16, 4: torch.int32}[x.element_size()]
    width = 8 * x.element_size()
    raw = x.contiguous().view(bits).long()
    key = torch.where(raw < 0, (~raw) & ((1 << width) - 1), raw | (1 << (width - 1)))
    return key.masked_fill(key == (1 << (width - 1)) - 1, 1 << (width - 1))


def _sample(logits, temperature, top_k, top_p, seed, *, chunk=8192, block=1024):
    """``sample`` plus the key of the lowest kept logit of each row (for tests)."""
    k = _kernels()
    b, V = logits.shape
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        logits = logits.float()
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    key_bits, digit_bits = 8 * logits.element_size(), 2
    device = logits.device
    tokens = torch.empty(b, dtype=torch.long, device=device)
    log_probs = torch.empty(b, dtype=torch.float32, device=device)
    keep_from = torch.zeros(b, dtype=torch.long, device=device)
    if not b:
        return tokens, log_probs, keep_from
    digits = key_bits // digit_bits
    count, mass = k.COUNT.value, k.MASS.value
    passes = ([count] * digits if 0 < top_k < V else []) + ([mass] * digits if top_p < 1.0 else [])
    chunk = min(_next_pow2(chunk), _next_pow2(V))
    block = min(_next_pow2(block), chunk)
    num_chunks = _cdiv(V, chunk)
    ncp = _next_pow2(num_chunks)
    stats = torch.empty(b, num_chunks, 2, dtype=torch.float32, device=device)
    bkeys = torch.empty(b, num_chunks * (chunk // block), 2, dtype=torch.long, device=device) if passes else stats
    k.sample_stats_kernel[(b, num_chunks)](logits, logits.stride(0), stats, bkeys, float(temperature), V, num_chunks,
                                           KB=key_bits, C=chunk, BLOCK=block, BLOCK_KEYS=bool(passes), num_warps=4)
    nb = 1 << digit_bits
    hist = torch.empty(2, b, num_chunks, 2, nb, dtype=torch.float32, device=device)
    stf = torch.empty(max(len(passes), 1), b, 4, dtype=torch.float32, device=device)
    sti = torch.empty(max(len(passes), 1), b, 2, dtype=torch.long, device=device)
    above = torch.empty(b, num_chunks, dtype=torch.float32, device=device)
    prev = 0
    for step, mode in enumerate(passes):
        k.sample_digit_kernel[(b, num_chunks)](
            logits, logits.stride(0), stats, bkeys, hist, stf, sti, above, float(temperature), int(top_k), float(top_p),
            step, key_bits - digit_bits * (step % digits + 1), b, V, num_chunks, KB=key_bits, DB=digit_bits,
            PREV_MODE=prev, MODE=mode, C=chunk, BLOCK=block, NCP=ncp, NBLKP=_next_pow2(bkeys.shape[1]),
            num_warps=4)
        prev = mode
    k.sample_final_kernel[(b,)](logits, logits.stride(0), stats, hist, stf, sti, above, tokens, log_probs, keep_from,
                                float(temperature), int(seed), len(passes) - 1, b, V, num_chunks, KB=key_bits,
                                DB=digit_bits, PREV_MODE=prev, C=chunk, BLOCK=block, NCP=ncp, num_warps=4)
    return tokens, log_probs, keep_from
