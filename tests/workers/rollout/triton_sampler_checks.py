"""Checks of the Triton sampler's kernels that run on a CPU through Triton's interpreter
(``TRITON_INTERPRET=1``, set before Triton is imported). Run as a script by
``test_triton_sampler_interpreter.py``; exits non-zero on the first failed check.

Small rows split into many chunks and blocks, so every part of the search runs: the per-block key
bounds, the digits settled across chunks, the switch from the top-k search to the top-p one, the chunk
choice and the walk inside a chunk."""

import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from verl.workers.rollout.native import triton_ops  # noqa: E402
from verl.workers.rollout.native.sampling import filter_logits  # noqa: E402

SMALL = {"chunk": 16, "block": 8}  # 61 tokens: four chunks of two blocks


def kept_from(logits, temperature, top_k, top_p):
    raw = logits.float()
    kept = filter_logits(raw, raw / temperature, top_k, top_p) > float("-inf")
    return raw.masked_fill(~kept, float("inf")).min(dim=-1).values.to(logits.dtype)


def hand_worked():
    # probabilities 0.5, 0.2, 0.2, 0.1 with the tie in the middle, in a shuffled order
    probs = torch.tensor([0.2, 0.1, 0.5, 0.2])
    for dtype in (torch.float32, torch.bfloat16):
        logits = probs.log().to(dtype)[None]
        cases = {  # (top_k, top_p): kept token ids, worked out by hand
            (0, 0.6): [0, 2, 3],  # before the tie: 0.5 < 0.6, so both tied tokens stay
            (0, 0.5): [2],  # 0.5 is not < 0.5
            (2, 1.0): [0, 2, 3],  # the 2nd largest is tied: ties stay
            (1, 1.0): [2],
            (0, 0.55): [0, 2, 3],
            (2, 0.55): [2],  # renormalised over the top-k mass 0.9: 0.5 / 0.9 = 0.556 >= 0.55
            (3, 0.6): [0, 2, 3],  # 0.556 < 0.6
        }
        for (top_k, top_p), want in cases.items():
            _, _, keep_from = triton_ops._sample(logits, 1.0, top_k, top_p, 3, chunk=4, block=2)
            got = torch.nonzero(triton_ops.order_key(logits[0]) >= keep_from[0]).flatten().tolist()
            assert got == want, (dtype, top_k, top_p, got, want)


def signed_zeros():
    """-0.0 == +0.0: a tie at zero is kept whole (the keys give both the same rank)."""
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.tensor([[0.0, -0.0, -1.0, -2.0, -0.0, -3.0, 0.0, -5.0]], dtype=dtype)
        for top_k, top_p in [(1, 1.0), (0, 0.3)]:
            _, _, keep_from = triton_ops._sample(logits, 1.0, top_k, top_p, 3, chunk=4, block=2)
            got = torch.nonzero(triton_ops.order_key(logits[0]) >= keep_from[0]).flatten().tolist()
            assert got == [0, 1, 4, 6], (dtype, top_k, top_p, got)


def random_rows():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 61, generator=g) * 2
    logits[1, :20] = logits[1, 7] * 3  # a wide tie, and a more peaked row
    logits[1, 20:] *= 3
    cases = {torch.bfloat16: [(5, 1.0, 1.0), (0, 0.7, 0.8), (7, 0.8, 1.3), (100, 0.5, 1.0), (0, 1e-4, 1.0),
                              (0, 1.0, 0.7)],
             torch.float32: [(0, 0.7, 0.8), (7, 0.8, 1.3)]}
    for dtype, settings in cases.items():
        x = logits.to(dtype)
        for top_k, top_p, temperature in settings:
            tokens, log_probs, keep_from = triton_ops._sample(x, temperature, top_k, top_p, 5, **SMALL)
            if top_k or top_p < 1.0:
                ref = triton_ops.order_key(kept_from(x, temperature, top_k, top_p))
                assert torch.equal(keep_from, ref), (dtype, top_k, top_p, keep_from, ref)
            assert (triton_ops.order_key(x.gather(-1, tokens[:, None]).squeeze(-1)) >= keep_from).all()
            want = torch.log_softmax(x.float() / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1)
            assert (log_probs - want).abs().max() < 1e-5, (log_probs, want)


def frequencies_and_seeds():
    """Draws over two chunks: frequencies of the inverse-CDF walk (the filters only move where the walk may
    stop, checked exactly above) and the seed's role."""
    rows = 300
    logits = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5, 1.5, -0.5, 0.25], dtype=torch.bfloat16)
    logits = logits.expand(rows, 8).contiguous()
    tokens, _ = triton_ops.sample(logits, 1.0, 0, 1.0, 17, chunk=4, block=4)
    probs = logits[0].float().softmax(-1)
    freq = torch.bincount(tokens, minlength=8).float() / rows
    # five standard deviations of a frequency over 300 draws: at most 0.144
    assert (freq - probs).abs().max() < 5 * math.sqrt(0.25 / rows), (freq, probs)
    again, _ = triton_ops.sample(logits, 1.0, 0, 1.0, 17, chunk=4, block=4)
    other, _ = triton_ops.sample(logits, 1.0, 0, 1.0, 18, chunk=4, block=4)
    assert torch.equal(tokens, again) and not torch.equal(tokens, other)
    # tokens of probability zero (-inf logits) are never drawn, with or without filters
    inf = float("-inf")
    masked = torch.tensor([inf, 1.0, inf, inf, 0.5, inf, inf, inf], dtype=torch.bfloat16).expand(30, 8).contiguous()
    for top_k in (0, 6):
        drawn, log_probs = triton_ops.sample(masked, 1.0, top_k, 1.0, 5, chunk=4, block=4)
        assert set(drawn.tolist()) <= {1, 4} and torch.isfinite(log_probs).all(), (top_k, drawn)


if __name__ == "__main__":
    import time

    for check in (hand_worked, signed_zeros, random_rows, frequencies_and_seeds):
        start = time.perf_counter()
        check()
        print(f"{check.__name__}: ok ({time.perf_counter() - start:.1f} s)", flush=True)
    sys.exit(0)
