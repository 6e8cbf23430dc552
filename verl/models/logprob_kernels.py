"""Log-prob and entropy of a chunk of logits in one pass each way (Triton, CUDA).

For rows of logits x (N, V) in bf16/fp16/fp32, z = x / τ, labels y:

    forward   lse = log Σ_j exp z_j,   log_prob = z_y − lse,   H = lse − Σ_j p_j z_j   (p = softmax z)
    backward  ∂log_prob/∂z_j = 1[j = y] − p_j,   ∂H/∂z_j = −p_j (z_j − lse + H),   ∂/∂x = ∂/∂z · 1/τ

The forward reads each row once with an online (running-max) softmax that also carries
Σ e^{z−m}(z−m), so H comes out without a second pass; it keeps lse and H per row. The backward
reads the row again and writes ∂x in the logits' dtype. The torch ops this replaces (upcast, log-softmax,
softmax, products, sums, and their autograd) make about a dozen fp32 passes over the (N, V) block each
way; here there is one read forward and one read + one write backward, in fp32 registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 4096


@triton.jit
def logprob_entropy_fwd_kernel(logits_ptr, labels_ptr, logp_ptr, ent_ptr, lse_ptr, row_stride, inv_temp,
                               V: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    m = tl.full((), -1.0e30, tl.float32)      # running max (finite: keeps 0 * (m - m_new) finite)
    s = tl.zeros((), tl.float32)              # Σ e^{z−m}
    t = tl.zeros((), tl.float32)              # Σ e^{z−m} (z − m)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        z = tl.load(base + cols, mask=inside, other=-float("inf")).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, tl.max(z, axis=0))
        scale = tl.exp(m - m_new)
        d = tl.where(inside, z - m_new, 0.0)
        e = tl.where(inside, tl.exp(d), 0.0)
        t = scale * (t + s * (m - m_new)) + tl.sum(e * d, axis=0)
        s = scale * s + tl.sum(e, axis=0)
        m = m_new
    lse = m + tl.log(s)
    label = tl.load(labels_ptr + row)
    z_label = tl.load(base + label).to(tl.float32) * inv_temp
    tl.store(logp_ptr + row, z_label - lse)
    tl.store(ent_ptr + row, tl.log(s) - t / s)
    tl.store(lse_ptr + row, lse)


@triton.jit
def logprob_entropy_bwd_kernel(logits_ptr, labels_ptr, lse_ptr, ent_ptr, g_logp_ptr, g_ent_ptr, dlogits_ptr,
                               row_stride, d_row_stride, inv_temp, V: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    d_base = dlogits_ptr + row * d_row_stride
    lse = tl.load(lse_ptr + row)
    ent = tl.load(ent_ptr + row)
    g_logp = tl.load(g_logp_ptr + row)
    g_ent = tl.load(g_ent_ptr + row)
    label = tl.load(labels_ptr + row)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        z = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32) * inv_temp
        p = tl.exp(z - lse)
        dz = g_logp * (tl.where(cols == label, 1.0, 0.0) - p) - g_ent * p * (z - lse + ent)
        tl.store(d_base + cols, (dz * inv_temp).to(dlogits_ptr.dtype.element_ty), mask=inside)


def _rows(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"expected (rows, vocab) logits, got shape {tuple(logits.shape)}")
    return logits if logits.stride(1) == 1 else logits.contiguous()


class LogprobEntropy(torch.autograd.Function):
    """``(log_prob, entropy)`` (N,) float32 of logits (N, V) at temperature τ, differentiable in the logits."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, temperature: float):
        logits = _rows(logits)
        labels = labels.contiguous().long()
        n, vocab = logits.shape
        logp, ent, lse = (torch.empty(n, dtype=torch.float32, device=logits.device) for _ in range(3))
        if n:
            logprob_entropy_fwd_kernel[(n,)](logits, labels, logp, ent, lse, logits.stride(0), 1.0 / temperature,
                                             V=vocab, BLOCK=min(BLOCK_V, triton.next_power_of_2(vocab)),
                                             num_warps=8)
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.temperature = temperature
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None):
        logits, labels, lse, ent = ctx.saved_tensors
        n, vocab = logits.shape
        zeros = None
        if g_logp is None or g_ent is None:
            zeros = torch.zeros(n, dtype=torch.float32, device=logits.device)
        g_logp = zeros if g_logp is None else g_logp.float().contiguous()
        g_ent = zeros if g_ent is None else g_ent.float().contiguous()
        dlogits = torch.empty_like(logits)
        if n:
            logprob_entropy_bwd_kernel[(n,)](logits, labels, lse, ent, g_logp, g_ent, dlogits, logits.stride(0),
                                             dlogits.stride(0), 1.0 / ctx.temperature, V=vocab,
                                             BLOCK=min(BLOCK_V, triton.next_power_of_2(vocab)), num_warps=8)
        return dlogits, None, None


def logprob_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0):
    """``(log_prob, entropy)`` of each row of ``logits`` (N, V) at ``temperature``, both (N,) float32."""
    return LogprobEntropy.apply(logits, labels, float(temperature))
