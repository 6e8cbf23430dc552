"""Checks of the fused log-prob/entropy kernels against torch ops; run on a CPU under TRITON_INTERPRET=1 by
test_logprob_kernels.py, and imported by its GPU test. Prints one "<name>: ok" line per check."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verl.models import logprob_kernels  # noqa: E402
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits  # noqa: E402


def reference(logits, labels, temperature, g_logp, g_ent):
    x = logits.detach().float().requires_grad_(True)
    z = x / temperature
    logp, ent = logprobs_from_logits(z, labels), entropy_from_logits(z)
    ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
    return logp.detach(), ent.detach(), x.grad


def check(name, rows, vocab, dtype, temperature, device="cpu", block=None, spread=4.0, tol=1e-5):
    generator = torch.Generator().manual_seed(rows * 7 + vocab)
    logits = (torch.randn(rows, vocab, generator=generator) * spread).to(dtype).to(device)
    labels = torch.randint(0, vocab, (rows,), generator=generator).to(device)
    g_logp, g_ent = torch.randn(rows, generator=generator).to(device), torch.randn(rows, generator=generator).to(device)
    previous = logprob_kernels.BLOCK_V
    logprob_kernels.BLOCK_V = block or previous
    try:
        x = logits.clone().requires_grad_(True)
        logp, ent = logprob_kernels.logprob_entropy(x, labels, temperature)
        ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
    finally:
        logprob_kernels.BLOCK_V = previous
    ref_logp, ref_ent, ref_grad = reference(logits, labels, temperature, g_logp, g_ent)
    assert logp.dtype == ent.dtype == torch.float32 and x.grad.dtype == dtype
    torch.testing.assert_close(logp, ref_logp, atol=tol, rtol=tol)
    torch.testing.assert_close(ent, ref_ent, atol=tol, rtol=tol)
    grad_tol = tol if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(x.grad.float(), ref_grad.to(dtype).float(), atol=grad_tol, rtol=grad_tol)
    print(f"{name}: ok", flush=True)


def by_hand(device="cpu"):
    """Two tokens with logits (0, ln 3): p = (1/4, 3/4); label 1: log p = ln(3/4);
    H = -(1/4 ln 1/4 + 3/4 ln 3/4) = ln 4 - (3/4) ln 3. d logp/dz = (0, 1) - p = (-1/4, 1/4)."""
    import math

    x = torch.tensor([[0.0, math.log(3.0)]], device=device, requires_grad=True)
    logp, ent = logprob_kernels.logprob_entropy(x, torch.tensor([1], device=device), 1.0)
    logp.sum().backward()
    assert abs(logp.item() - math.log(0.75)) < 1e-6
    assert abs(ent.item() - (math.log(4.0) - 0.75 * math.log(3.0))) < 1e-6
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([[-0.25, 0.25]]))
    print("by_hand: ok", flush=True)


def main(device="cpu"):
    by_hand(device)
    check("one_block_fp32", rows=5, vocab=300, dtype=torch.float32, temperature=1.0, device=device)
    # Several blocks: the running max rises across blocks (large spread) and the temperature divides.
    check("blocks_fp32_temperature", rows=4, vocab=1000, dtype=torch.float32, temperature=0.7, device=device,
          block=128, spread=20.0)
    check("blocks_bf16", rows=3, vocab=700, dtype=torch.bfloat16, temperature=1.0, device=device, block=256)


if __name__ == "__main__":
    main()
