"""The Triton kernels of the native engine. Imported only through ``triton_ops`` (which checks that Triton
and a CUDA tensor are there); the wrappers, shapes and the meaning of each argument live there.

Sampling runs over a row of logits split into chunks of ``C`` tokens, one program per (row, chunk), so a
pass over ``b x V`` logits keeps every SM busy:

1. ``sample_stats_kernel``: per chunk, the max and the sum of ``exp(x / T - max)``.
2. ``sample_digit_kernel``, once per digit of a radix search for the filter threshold (no sort): each
   program first settles the previous digit from the previous pass's per-chunk histograms (every program
   of a row computes the same choice), then histograms its own chunk's tokens under the prefix chosen so
   far by the next ``DB`` bits of their order-preserving keys (probability mass and, for top-k, counts).
3. ``sample_final_kernel``: settles the last digit, draws ``u ~ U(0, 1)`` per row, picks the chunk whose
   cumulative kept mass crosses ``u`` times the total, then the token inside it (inverse CDF in
   vocabulary order) and the log-softmax of the choice.
"""

from __future__ import annotations

import triton
import triton.language as tl

COUNT = tl.constexpr(1)
MASS = tl.constexpr(2)


# ---------------------------------------------------------------------------------------------- decode ops
@triton.jit
def _rope_rows(base, d, dr, cos, sin, mask, dtype):
    """RoPE of the ``(rows, D)`` tile at ``base + row * D``, rounded like the torch ops: ``x * cos`` to the
    dtype, then ``+ roll(x) * sin``."""
    x = tl.load(base + d[None, :], mask=mask, other=0.0).to(tl.float32)
    xr = tl.load(base + dr[None, :], mask=mask, other=0.0).to(tl.float32)
    a = (x * cos).to(dtype).to(tl.float32)
    return (a + xr * sin).to(dtype)


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
    q = _rope_rows(q_ptr + row * (H * D) + h * D, d, dr, cos, sin, hm, dtype)
    tl.store(qo_ptr + row * (H * D) + h * D + d[None, :], q, mask=hm)
    # keys (rotated) and values into the cache row of (slot, head, wpos)
    g = tl.arange(0, BKV)[:, None]
    gm = g < HKV
    k = _rope_rows(k_ptr + row * (HKV * D) + g * D, d, dr, cos, sin, gm, dtype)
    dst = ((slot * HKV + g) * max_len + wpos) * D + d[None, :]
    tl.store(kc_ptr + dst, k, mask=gm)
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


@triton.jit
def gelu_tanh_mul_kernel(g_ptr, u_ptr, o_ptr, n, BLOCK: tl.constexpr):
    """``gelu(gate, approximate="tanh") * up`` with torch's roundings (the gelu rounded to the dtype, then the
    product), the gelu in float32 as torch computes it: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
    dtype = o_ptr.dtype.element_ty
    inner = 0.7978845608028654 * (g + 0.044715 * (g * g * g))
    s = (0.5 * g * (1.0 + _tanh(inner))).to(dtype).to(tl.float32)
    tl.store(o_ptr + offs, (s * u).to(dtype), mask=m)


@triton.jit
def softcap_kernel(x_ptr, o_ptr, n, cap, BLOCK: tl.constexpr):
    """``tanh(x / cap) * cap`` with torch's three roundings to the dtype (the quotient, the tanh, the product)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    dtype = o_ptr.dtype.element_ty
    x = (tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32) / cap).to(dtype).to(tl.float32)
    t = _tanh(x).to(dtype).to(tl.float32)
    tl.store(o_ptr + offs, (t * cap).to(dtype), mask=m)


@triton.jit
def scaled_rms_norm_kernel(x_ptr, scale_ptr, r_ptr, o_ptr, h, eps, BLOCK: tl.constexpr, RESIDUAL: tl.constexpr):
    """One row: ``x`` in float32, times ``rsqrt(mean(x^2) + eps)`` and the float32 ``scale``, rounded to the
    output dtype; with ``RESIDUAL``, plus the residual row and rounded again (torch's two roundings)."""
    row = tl.program_id(0).to(tl.int64) * h
    cols = tl.arange(0, BLOCK)
    m = cols < h
    x = tl.load(x_ptr + row + cols, mask=m, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / h + eps)
    y = x * rstd * tl.load(scale_ptr + cols, mask=m, other=0.0)
    dtype = o_ptr.dtype.element_ty
    if RESIDUAL:
        y = y.to(dtype).to(tl.float32) + tl.load(r_ptr + row + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(o_ptr + row + cols, y.to(dtype), mask=m)


@triton.jit
def _tanh(x):
    """tanh in float32, within 2 units in the last place in Triton's interpreter (``tl`` has no tanh, and
    libdevice's does not run in the interpreter). For |x| >= 0.55, ``(1 - t) / (1 + t)`` with ``t = exp(-2|x|)``
    <= 1/3, so ``1 - t`` cancels at most 0.6 bits and ``t`` never overflows; below, where ``1 - t`` would cancel,
    the Taylor series to x^19 (its next term is under 1e-9 of x there). The sign is put back last."""
    a = tl.abs(x)
    t = tl.exp(-2.0 * a)
    a2 = a * a
    series = 1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0 + a2 * (62.0 / 2835.0 + a2 * (
        -1382.0 / 155925.0 + a2 * (21844.0 / 6081075.0 + a2 * (-929569.0 / 638512875.0 + a2 * (
            6404582.0 / 10854718875.0 + a2 * (-443861162.0 / 1856156927625.0)))))))))
    r = tl.where(a < 0.55, a * series, (1.0 - t) / (1.0 + t))
    return tl.where(x < 0, -r, r)


@triton.jit
def _attention_block(q, k_ptr, v_ptr, col, hi, first, last, d, m, total, acc, scale, softcap, D: tl.constexpr,
                     BN: tl.constexpr, SOFTCAP: tl.constexpr, IEEE: tl.constexpr):
    """The online softmax over columns ``[col, min(col + BN, hi))``, query row ``r`` seeing those in
    ``[first[r], last[r])``: the running max ``m``, sum ``total`` and unnormalised output ``acc`` updated. A row
    may see none of them (its running max stays -inf and its sums 0)."""
    cols = col + tl.arange(0, BN)
    inside = cols < hi
    k = tl.load(k_ptr + cols[:, None] * D + d[None, :], mask=inside[:, None], other=0.0)
    v = tl.load(v_ptr + cols[:, None] * D + d[None, :], mask=inside[:, None], other=0.0)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = s * scale
    if SOFTCAP:
        s = _tanh(s / softcap) * softcap
    seen = (cols[None, :] >= first[:, None]) & (cols[None, :] < last[:, None]) & inside[None, :]
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    base = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet: exp(-inf) = 0 below
    p = tl.exp(s - base[:, None])
    alpha = tl.exp(m - base)
    total = total * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, total, acc


@triton.jit
def _attend_columns(q, k_row, v_row, lo, hi, first, last, d, scale, softcap, R: tl.constexpr, D: tl.constexpr,
                    BN: tl.constexpr, SOFTCAP: tl.constexpr, IEEE: tl.constexpr, INTERPRETED: tl.constexpr):
    """The ``R`` query rows ``q`` over columns ``[lo, hi)`` of one slot's keys and values (row ``r`` seeing
    ``[first[r], last[r])`` of them) in blocks of ``BN``: their running max, sum and unnormalised output."""
    m = tl.full((R,), float("-inf"), tl.float32)
    total = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, D), tl.float32)
    if INTERPRETED:  # the interpreter cannot take a loaded value as a range() bound; the same blocks, unpipelined
        col = lo
        while col < hi:
            m, total, acc = _attention_block(q, k_row, v_row, col, hi, first, last, d, m, total, acc, scale, softcap,
                                             D, BN, SOFTCAP, IEEE)
            col += BN
    else:
        for col in range(lo, hi, BN):
            m, total, acc = _attention_block(q, k_row, v_row, col, hi, first, last, d, m, total, acc, scale, softcap,
                                             D, BN, SOFTCAP, IEEE)
    return m, total, acc


@triton.jit
def _shared_prefix(q_ptr, k_ptr, v_ptr, start_ptr, wpos_ptr, end_ptr, members_ptr, m_ptr, l_ptr, acc_ptr, rh, split,
                   prefix_splits, splits, rows, max_len, window, scale, softcap, HKV: tl.constexpr, G: tl.constexpr,
                   D: tl.constexpr, NM: tl.constexpr, NMS: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
                   SOFTCAP: tl.constexpr, IEEE: tl.constexpr, INTERPRETED: tl.constexpr):
    """The shared prompt of a chunk of rows, read once for all of them: the program of the chunk's first row (its
    leader, ``members[leader, 0] == leader``) stacks the ``G`` query heads of each of its (up to ``NM``) rows into
    ``MP`` query rows and attends over its own slot's columns ``[first, shared_end)``, which every member's slot
    holds an identical copy of. Row ``r`` sees its own range of them (``[start, shared_end)``, cut by its
    window). Partial softmaxes go to split ``split`` of each member."""
    leader = rh // HKV
    h = rh % HKV
    if tl.load(members_ptr + leader * NMS) == leader:
        i = tl.arange(0, MP)
        member = i // G
        g = i % G
        mrow = tl.load(members_ptr + leader * NMS + member, mask=member < NM, other=-1).to(tl.int64)
        ok = (member < NM) & (mrow >= 0) & (mrow < rows)
        mrow = tl.where(ok, mrow, 0)
        wpos = tl.load(wpos_ptr + mrow, mask=ok, other=0)
        first = tl.load(start_ptr + mrow, mask=ok, other=0)
        if window > 0:
            first = tl.maximum(first, wpos - window + 1)
        last = tl.minimum(wpos + 1, tl.load(end_ptr + leader))
        first = tl.where(ok, first, max_len)
        last = tl.where(ok, last, 0)
        lo_all = tl.min(first, axis=0)
        hi_all = tl.max(last, axis=0)
        per_split = tl.cdiv(tl.cdiv(tl.maximum(hi_all - lo_all, 0), prefix_splits), BN) * BN
        lo = lo_all + split * per_split
        hi = tl.minimum(lo + per_split, hi_all)
        d = tl.arange(0, D)
        at = mrow * HKV + h
        q = tl.load(q_ptr + (at * G + g)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        m, total, acc = _attend_columns(q, k_ptr + rh * max_len * D, v_ptr + rh * max_len * D, lo, hi, first, last, d,
                                        scale, softcap, MP, D, BN, SOFTCAP, IEEE, INTERPRETED)
        out = (at * splits + split) * G + g
        tl.store(m_ptr + out, m, mask=ok)
        tl.store(l_ptr + out, total, mask=ok)
        tl.store(acc_ptr + out[:, None] * D + d[None, :], acc, mask=ok[:, None])


@triton.jit
def _own_columns(q_ptr, k_ptr, v_ptr, start_ptr, wpos_ptr, end_ptr, o_ptr, m_ptr, l_ptr, acc_ptr, rh, split,
                 own_splits, splits, max_len, window, scale, softcap, HKV: tl.constexpr, G: tl.constexpr,
                 D: tl.constexpr, GP: tl.constexpr, BN: tl.constexpr, SOFTCAP: tl.constexpr, IEEE: tl.constexpr,
                 SHARED: tl.constexpr, INTERPRETED: tl.constexpr):
    """A row's own columns, split ``split`` of ``own_splits``: the ``G`` query heads that share the kv head attend
    over the split's share of the row's visible columns ``[first, wpos]`` (``first``: the row's start, or the
    window's first column; with ``SHARED``, not before its shared prompt's end) in blocks of ``BN`` columns,
    with an online softmax in float32. A lone split writes the output; otherwise the running max, sum and
    unnormalised output go to split ``split + splits - own_splits`` of the row."""
    row = rh // HKV
    wpos = tl.load(wpos_ptr + row)
    first = tl.load(start_ptr + row)
    if window > 0:
        first = tl.maximum(first, wpos - window + 1)
    if SHARED:  # the shared prompt is the leader's; a row that is not running may see its last column twice
        first = tl.minimum(tl.maximum(first, tl.load(end_ptr + row)), wpos)
    span = wpos + 1 - first
    per_split = tl.cdiv(tl.cdiv(span, own_splits), BN) * BN
    lo = first + split * per_split
    hi = tl.minimum(lo + per_split, wpos + 1)
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (rh * G + g[:, None]) * D + d[None, :], mask=g[:, None] < G, other=0.0)
    seen_from = first + tl.zeros((GP,), tl.int64)  # every query head sees the same columns
    seen_to = wpos + 1 + tl.zeros((GP,), tl.int64)
    m, total, acc = _attend_columns(q, k_ptr + rh * max_len * D, v_ptr + rh * max_len * D, lo, hi, seen_from, seen_to,
                                    d, scale, softcap, GP, D, BN, SOFTCAP, IEEE, INTERPRETED)
    rows = g[:, None] < G
    if splits == 1:
        out = acc / total[:, None]
        tl.store(o_ptr + (rh * G + g[:, None]) * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=rows)
    else:
        at = (rh * splits + split + splits - own_splits) * G + g
        tl.store(m_ptr + at, m, mask=g < G)
        tl.store(l_ptr + at, total, mask=g < G)
        tl.store(acc_ptr + at[:, None] * D + d[None, :], acc, mask=rows)


@triton.jit(do_not_specialize=["window", "splits", "prefix_splits", "rows"])
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, start_ptr, wpos_ptr, end_ptr, members_ptr, o_ptr, m_ptr, l_ptr,
                            acc_ptr, rows, max_len, window, splits, prefix_splits, scale, softcap, HKV: tl.constexpr,
                            G: tl.constexpr, D: tl.constexpr, GP: tl.constexpr, NM: tl.constexpr, NMS: tl.constexpr,
                            MP: tl.constexpr, BN: tl.constexpr, SOFTCAP: tl.constexpr, IEEE: tl.constexpr,
                            SHARED: tl.constexpr, INTERPRETED: tl.constexpr):
    """One program per (row, kv head, split). Without ``SHARED`` every split reads a share of the row's own
    visible columns (``_own_columns``). With it, the first ``prefix_splits`` splits read the shared prompts
    (``_shared_prefix``: the programs of chunk leaders work, the others return at once) and the rest each row's
    columns after its shared prompt. ``splits``, ``prefix_splits``, ``rows`` and the window are runtime values:
    one compiled kernel serves every batch size and layer."""
    rh = tl.program_id(0).to(tl.int64)  # row * HKV + kv head; row i reads slot i of the cache
    split = tl.program_id(1)
    if split < prefix_splits:
        if SHARED:
            _shared_prefix(q_ptr, k_ptr, v_ptr, start_ptr, wpos_ptr, end_ptr, members_ptr, m_ptr, l_ptr, acc_ptr, rh,
                           split, prefix_splits, splits, rows, max_len, window, scale, softcap, HKV, G, D, NM, NMS,
                           MP, BN, SOFTCAP, IEEE, INTERPRETED)
    else:
        _own_columns(q_ptr, k_ptr, v_ptr, start_ptr, wpos_ptr, end_ptr, o_ptr, m_ptr, l_ptr, acc_ptr, rh,
                     split - prefix_splits, splits - prefix_splits, splits, max_len, window, scale, softcap, HKV, G,
                     D, GP, BN, SOFTCAP, IEEE, SHARED, INTERPRETED)


@triton.jit(do_not_specialize=["splits"])
def decode_attention_combine_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, splits, G: tl.constexpr, D: tl.constexpr,
                                    SP: tl.constexpr):
    """One program per (row, kv head, query head of the group): the ``splits`` (at most ``SP``) partial softmaxes
    rescaled to the largest running max and summed. A split that saw no column has max -inf and weighs nothing."""
    pid = tl.program_id(0).to(tl.int64)
    rh = pid // G
    gi = pid % G
    s = tl.arange(0, SP)
    d = tl.arange(0, D)
    at = (rh * splits + s) * G + gi
    m = tl.load(m_ptr + at, mask=s < splits, other=float("-inf"))
    total = tl.load(l_ptr + at, mask=s < splits, other=0.0)
    acc = tl.load(acc_ptr + at[:, None] * D + d[None, :], mask=(s < splits)[:, None], other=0.0)
    top = tl.max(m, axis=0)
    w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(total * w, axis=0)
    tl.store(o_ptr + pid * D + d, out.to(o_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------------- sampling
@triton.jit
def _order_key(x, KB: tl.constexpr):
    """The raw bits of ``x`` (16- or 32-bit floats) as an unsigned integer in ``[0, 2**KB)`` with the floats'
    order (int32 for 16-bit floats, uint32 for 32-bit ones); -0.0 gets the key of +0.0, as they are equal."""
    if KB == 16:
        bits = x.to(tl.int16, bitcast=True).to(tl.int32)  # sign-extended: negative floats are < 0
        key = tl.where(bits < 0, (~bits) & 0xFFFF, bits | 0x8000)
        key = tl.where(key == 0x7FFF, 0x8000, key)
    else:
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, ~bits, bits ^ -2147483648)
        key = tl.where(key == 0x7FFFFFFF, -2147483648, key).to(tl.uint32, bitcast=True)
    return key


@triton.jit
def _row_max_and_total(stats_ptr, row, NC, NCP: tl.constexpr):
    """Max of ``x / T`` over the row and ``sum(exp(x / T - max))``, from the per-chunk stats."""
    cs = tl.arange(0, NCP)
    cm = cs < NC
    mc = tl.load(stats_ptr + (row * NC + cs) * 2, mask=cm, other=float("-inf"))
    sc = tl.load(stats_ptr + (row * NC + cs) * 2 + 1, mask=cm, other=0.0)
    m = tl.max(mc, axis=0)
    total = tl.sum(tl.where(mc > float("-inf"), sc * tl.exp(mc - m), 0.0), axis=0)
    return m, total


@triton.jit
def _hist_tile(hist_ptr, pp, row, B, NC, ch, NCP: tl.constexpr, NB: tl.constexpr):
    """The ``(NCP, NB)`` tile of channel ``ch`` (0: mass, 1: count) of one row's per-chunk histograms."""
    cs = tl.arange(0, NCP)[:, None]
    bins = tl.arange(0, NB)[None, :]
    offs = (((pp * B + row) * NC + cs) * 2 + ch) * NB + bins
    return tl.load(hist_ptr + offs, mask=(cs < NC) & (bins < NB), other=0.0)


@triton.jit
def _choose_bin(h, above, target, NB: tl.constexpr):
    """The highest bin whose tokens, with those above the bin, reach ``target``; bin 0 (keep everything in
    range) when none does (a top-k larger than the row, or rounding)."""
    bins = tl.arange(0, NB)
    suffix = tl.cumsum(h, axis=0, reverse=True)  # sum over bins >= b
    ok = (above + suffix) >= target
    return tl.max(tl.where(ok, bins, 0), axis=0)


@triton.jit
def _key_value(key, dtype, KB: tl.constexpr):
    """The float (as float32) whose order key is ``key`` (the inverse of ``_order_key``)."""
    if KB == 16:
        bits = tl.where(key >= 0x8000, key ^ 0x8000, (~key) & 0xFFFF).to(tl.int16)
    else:
        bits = tl.where(key >= 0x80000000, key ^ 0x80000000, (~key) & 0xFFFFFFFF).to(tl.int32)
    return bits.to(dtype, bitcast=True).to(tl.float32)


@triton.jit
def _search_floor(bkeys_ptr, row, NBLK, m, total, top_k, top_p, temperature, dtype, MODE: tl.constexpr,
                  KB: tl.constexpr, NBLKP: tl.constexpr):
    """A key the threshold cannot lie below, from the blocks' largest keys (each is one token's key):
    for top-k the k-th largest of them (at least k tokens reach it); for top-p the largest one whose
    blocks' maxima alone carry ``top_p`` of the probability. 0 (no floor) when there is none. Blocks
    below the floor are then never read, which is most blocks for top-k and for peaked rows."""
    i = tl.arange(0, NBLKP)
    tops = tl.load(bkeys_ptr + (row * NBLK + i) * 2, mask=i < NBLK, other=0)
    tops = tl.sort(tops, descending=True)
    if MODE == COUNT:
        floor = tl.sum(tl.where(i == top_k - 1, tops, 0), axis=0)
    else:
        w = tl.where(tops > 0, tl.exp(_key_value(tops, dtype, KB) / temperature - m), 0.0)
        first = tl.min(tl.where(tl.cumsum(w, axis=0) >= top_p * total, i, NBLKP), axis=0)
        floor = tl.sum(tl.where(i == first, tops, 0), axis=0)
    return floor


@triton.jit
def _settle_digit(hist_ptr, stf_ptr, sti_ptr, prev, row, B, NC, PREV_MODE: tl.constexpr, DB: tl.constexpr,
                  NCP: tl.constexpr, NB: tl.constexpr):
    """Choose the digit of pass ``prev`` from its histograms; returns the state after it and the chosen bin.

    State (per pass and row): prefix (the digits chosen so far), kfloor (the top-k threshold key once the
    top-k search is done), and the mass and count of the tokens above the prefix's range, the mass at or
    above it, and the search's target."""
    sbase = (prev * B + row) * 4
    above_m = tl.load(stf_ptr + sbase)
    above_c = tl.load(stf_ptr + sbase + 1)
    target = tl.load(stf_ptr + sbase + 3)
    prefix = tl.load(sti_ptr + (prev * B + row) * 2)
    kfloor = tl.load(sti_ptr + (prev * B + row) * 2 + 1)
    bins = tl.arange(0, NB)
    hm = tl.sum(_hist_tile(hist_ptr, prev % 2, row, B, NC, 0, NCP, NB), axis=0)
    if PREV_MODE == COUNT:
        hc = tl.sum(_hist_tile(hist_ptr, prev % 2, row, B, NC, 1, NCP, NB), axis=0)
        chosen = _choose_bin(hc, above_c, target, NB)
        above_c = above_c + tl.sum(tl.where(bins > chosen, hc, 0.0), axis=0)
    else:
        chosen = _choose_bin(hm, above_m, target, NB)
    above_m = above_m + tl.sum(tl.where(bins > chosen, hm, 0.0), axis=0)
    incl_m = above_m + tl.sum(tl.where(bins == chosen, hm, 0.0), axis=0)
    prefix = (prefix << DB) | chosen.to(tl.int64)
    return prefix, kfloor, above_m, above_c, incl_m, target, chosen


@triton.jit
def sample_stats_kernel(x_ptr, stride, stats_ptr, bkeys_ptr, temperature, V, NC, KB: tl.constexpr, C: tl.constexpr,
                        BLOCK: tl.constexpr, BLOCK_KEYS: tl.constexpr):
    """Per chunk: max of ``x / T`` and ``sum(exp(x / T - max))``; with ``BLOCK_KEYS``, also the largest and
    smallest key of every block of ``BLOCK`` tokens, so the threshold search can skip blocks unread."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, C, BLOCK):
        offs = c * C + start + lanes
        valid = offs < V
        raw = tl.load(base + offs, mask=valid, other=float("-inf"))
        rf = raw.to(tl.float32)
        x = rf / temperature
        m_new = tl.maximum(m, x)
        s = tl.where(m_new > float("-inf"), s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
        m = m_new
        if BLOCK_KEYS:  # float reductions, then keys
            top = tl.max(rf, axis=0).to(raw.dtype)
            bottom = tl.min(tl.where(valid, rf, float("inf")), axis=0).to(raw.dtype)
            blk = (row * NC * (C // BLOCK) + c * (C // BLOCK) + start // BLOCK) * 2
            tl.store(bkeys_ptr + blk, _order_key(top, KB).to(tl.int64))
            tl.store(bkeys_ptr + blk + 1, _order_key(bottom, KB).to(tl.int64))
    mc = tl.max(m, axis=0)
    sc = tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - mc), 0.0), axis=0)
    tl.store(stats_ptr + (row * NC + c) * 2, mc)
    tl.store(stats_ptr + (row * NC + c) * 2 + 1, sc)


@triton.jit(do_not_specialize=["step", "shift", "top_k", "top_p", "B"])
def sample_digit_kernel(x_ptr, stride, stats_ptr, bkeys_ptr, hist_ptr, stf_ptr, sti_ptr, above_ptr, temperature, top_k,
                        top_p, step, shift, B, V, NC, KB: tl.constexpr, DB: tl.constexpr, PREV_MODE: tl.constexpr,
                        MODE: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr, NCP: tl.constexpr,
                        NBLKP: tl.constexpr):
    """Pass ``step`` of the threshold search (``PREV_MODE`` 0 at the first pass). ``MODE`` is COUNT for a
    digit of the top-k search and MASS for one of the top-p search; the top-p search follows the top-k one.
    Digits are two bits (``DB == 2``)."""
    NB: tl.constexpr = 1 << DB
    tl.static_assert(DB == 2)
    row = tl.program_id(0)
    c = tl.program_id(1)
    m, total = _row_max_and_total(stats_ptr, row, NC, NCP)
    bins = tl.arange(0, NB)
    if PREV_MODE == 0:
        prefix = tl.zeros([], tl.int64)
        kfloor = _search_floor(bkeys_ptr, row, NC * (C // BLOCK), m, total, top_k, top_p, temperature,
                               x_ptr.dtype.element_ty, MODE, KB, NBLKP)
        above_m = 0.0
        above_c = 0.0
        incl_m = total
        if MODE == COUNT:
            target = top_k.to(tl.float32)
        else:
            target = top_p * total
        chunk_above = 0.0
    else:
        prefix, kfloor, above_m, above_c, incl_m, target, chosen = _settle_digit(
            hist_ptr, stf_ptr, sti_ptr, step - 1, row, B, NC, PREV_MODE, DB, NCP, NB)
        own = tl.load(hist_ptr + ((((step - 1) % 2) * B + row) * NC + c) * 2 * NB + bins)
        chunk_above = tl.load(above_ptr + row * NC + c) + tl.sum(tl.where(bins > chosen, own, 0.0), axis=0)
        if PREV_MODE != MODE:  # top-k settled: its threshold becomes a floor, the top-p search starts
            kfloor = prefix
            target = top_p * incl_m
            prefix = tl.zeros([], tl.int64)
            above_m = 0.0
            above_c = 0.0
            chunk_above = 0.0
    if c == 0:
        tl.store(stf_ptr + (step * B + row) * 4, above_m)
        tl.store(stf_ptr + (step * B + row) * 4 + 1, above_c)
        tl.store(stf_ptr + (step * B + row) * 4 + 2, incl_m)
        tl.store(stf_ptr + (step * B + row) * 4 + 3, target)
        tl.store(sti_ptr + (step * B + row) * 2, prefix)
        tl.store(sti_ptr + (step * B + row) * 2 + 1, kfloor)
    tl.store(above_ptr + row * NC + c, chunk_above)

    # this chunk's histogram of the next digit (four bins: four accumulators in registers, no reduction
    # inside the loop) over the tokens under the prefix and at or above kfloor; blocks whose key range
    # misses that range are not read (late digits, top-k, peaked rows)
    base = x_ptr + row.to(tl.int64) * stride
    lanes = tl.arange(0, BLOCK)
    lo = tl.maximum(prefix << (shift + DB), kfloor)
    hi = ((prefix + 1) << (shift + DB)) - 1
    m0 = tl.zeros([BLOCK], tl.float32)
    m1 = tl.zeros([BLOCK], tl.float32)
    m2 = tl.zeros([BLOCK], tl.float32)
    m3 = tl.zeros([BLOCK], tl.float32)
    c0 = tl.zeros([BLOCK], tl.int32)
    c1 = tl.zeros([BLOCK], tl.int32)
    c2 = tl.zeros([BLOCK], tl.int32)
    c3 = tl.zeros([BLOCK], tl.int32)
    for start in range(0, C, BLOCK):
        blk = (row * NC * (C // BLOCK) + c * (C // BLOCK) + start // BLOCK) * 2
        if (tl.load(bkeys_ptr + blk) >= lo) & (tl.load(bkeys_ptr + blk + 1) <= hi):
            offs = c * C + start + lanes
            valid = offs < V
            raw = tl.load(base + offs, mask=valid, other=0.0)
            key = _order_key(raw, KB)
            high = key >> shift
            sel = valid & ((high >> DB) == prefix.to(key.dtype)) & (key >= kfloor.to(key.dtype))
            digit = tl.where(sel, (high & 3).to(tl.int32), 4)
            w = tl.exp(raw.to(tl.float32) / temperature - m)
            m0 += tl.where(digit == 0, w, 0.0)
            m1 += tl.where(digit == 1, w, 0.0)
            m2 += tl.where(digit == 2, w, 0.0)
            m3 += tl.where(digit == 3, w, 0.0)
            if MODE == COUNT:
                c0 += (digit == 0).to(tl.int32)
                c1 += (digit == 1).to(tl.int32)
                c2 += (digit == 2).to(tl.int32)
                c3 += (digit == 3).to(tl.int32)
    out = hist_ptr + (((step % 2) * B + row) * NC + c) * 2 * NB
    tl.store(out, tl.sum(m0, axis=0))
    tl.store(out + 1, tl.sum(m1, axis=0))
    tl.store(out + 2, tl.sum(m2, axis=0))
    tl.store(out + 3, tl.sum(m3, axis=0))
    if MODE == COUNT:
        tl.store(out + NB, tl.sum(c0, axis=0).to(tl.float32))
        tl.store(out + NB + 1, tl.sum(c1, axis=0).to(tl.float32))
        tl.store(out + NB + 2, tl.sum(c2, axis=0).to(tl.float32))
        tl.store(out + NB + 3, tl.sum(c3, axis=0).to(tl.float32))


@triton.jit(do_not_specialize=["seed", "last", "B"])
def sample_final_kernel(x_ptr, stride, stats_ptr, hist_ptr, stf_ptr, sti_ptr, above_ptr, tok_ptr, lp_ptr, kf_ptr,
                        temperature, seed, last, B, V, NC, KB: tl.constexpr, DB: tl.constexpr,
                        PREV_MODE: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr, NCP: tl.constexpr):
    """One program per row: settle the last digit of pass ``last`` (``PREV_MODE`` 0: no filter), draw."""
    NB: tl.constexpr = 1 << DB
    row = tl.program_id(0)
    m, total = _row_max_and_total(stats_ptr, row, NC, NCP)
    cs = tl.arange(0, NCP)
    cm = cs < NC
    if PREV_MODE == 0:
        keep_from = tl.zeros([], tl.int64)
        mc = tl.load(stats_ptr + (row * NC + cs) * 2, mask=cm, other=float("-inf"))
        sc = tl.load(stats_ptr + (row * NC + cs) * 2 + 1, mask=cm, other=0.0)
        kept = tl.where(mc > float("-inf"), sc * tl.exp(mc - m), 0.0)
    else:
        prefix, kfloor, above_m, above_c, incl_m, target, chosen = _settle_digit(
            hist_ptr, stf_ptr, sti_ptr, last, row, B, NC, PREV_MODE, DB, NCP, NB)
        keep_from = tl.maximum(prefix, kfloor)
        bins = tl.arange(0, NB)[None, :]
        tile = _hist_tile(hist_ptr, last % 2, row, B, NC, 0, NCP, NB)
        kept = tl.load(above_ptr + row * NC + cs, mask=cm, other=0.0) + tl.sum(tl.where(bins >= chosen, tile, 0.0),
                                                                              axis=1)
    # the chunk where the cumulative kept mass crosses u * (kept total)
    goal = tl.rand(seed, row) * tl.sum(kept, axis=0)
    cum = tl.cumsum(kept, axis=0)
    chunk = tl.sum(((cum <= goal) & cm).to(tl.int32), axis=0)
    chunk = tl.minimum(chunk, tl.max(tl.where(kept > 0.0, cs, 0), axis=0))
    goal = tl.maximum(goal - tl.sum(tl.where(cs == chunk - 1, cum, 0.0), axis=0), 0.0)  # the same sums as ``cum``
    # ... and the token inside it
    base = x_ptr + row.to(tl.int64) * stride
    lanes = tl.arange(0, BLOCK)
    run = tl.zeros([], tl.float32)
    # the first token of positive weight whose running mass passes the goal; if the walk's sums, taken in
    # another order than the chunk's, round below the goal: the chunk's last token of positive weight
    choice = tl.full([], 2**31 - 1, tl.int32)
    fallback = tl.full([], -1, tl.int32)
    for start in range(0, C, BLOCK):
        offs = chunk * C + start + lanes
        valid = offs < V
        raw = tl.load(base + offs, mask=valid, other=0.0)
        key = _order_key(raw, KB)
        keep = valid & (key >= keep_from.to(key.dtype))
        w = tl.where(keep, tl.exp(raw.to(tl.float32) / temperature - m), 0.0)
        passed = (w > 0.0) & ((tl.cumsum(w, axis=0) + run) > goal)
        choice = tl.minimum(choice, tl.min(tl.where(passed, offs, 2**31 - 1), axis=0))
        fallback = tl.maximum(fallback, tl.max(tl.where(w > 0.0, offs, -1), axis=0))
        run += tl.sum(w, axis=0)
    choice = tl.where(choice < 2**31 - 1, choice, fallback)
    choice = tl.maximum(choice, 0)
    chosen_x = tl.load(base + choice).to(tl.float32) / temperature
    tl.store(tok_ptr + row, choice.to(tl.int64))
    tl.store(lp_ptr + row, chosen_x - m - tl.log(total))
    tl.store(kf_ptr + row, keep_from)
