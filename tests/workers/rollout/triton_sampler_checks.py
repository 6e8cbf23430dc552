"""Checks of the Triton sampler's kernels that run on a CPU through Triton's interpreter
(``TRITON_INTERPRET=1``, set before Triton is imported). Run as a script by
``test_triton_sampler_interpreter.py`` (``python triton_sampler_checks.py [check ...]``: the named checks,
else all); exits non-zero on the first failed check.

Small rows split into many chunks and blocks, so every part of the search runs: the per-block key
bounds, the digits settled across chunks, the switch from the top-k search to the top-p one, the chunk
choice and the walk inside a chunk."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from verl.workers.rollout.native import triton_ops  # noqa: E402
from verl.workers.rollout.native.sampling import filter_logits  # noqa: E402

SMALL = {"chunk": 16, "block": 8}  # 61 tokens: four chunks of two blocks
CHI2_7DF_P1E5 = 35.26  # the chi-square distribution with 7 degrees of freedom exceeds it with probability 1e-5


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
    """Draws over two chunks under a temperature: the frequencies of the inverse-CDF walk (the filters only
    move where the walk may stop, checked exactly above) and the seed's role."""
    rows, temperature = 300, 2.5
    logits = torch.tensor([2.0, 0.0, 4.0, -1.0, 1.0, 1.5, -1.0, 0.5], dtype=torch.bfloat16)
    logits = logits.expand(rows, 8).contiguous()
    tokens, _ = triton_ops.sample(logits, temperature, 0, 1.0, 17, chunk=4, block=4)
    expected = rows * (logits[0].float() / temperature).softmax(-1)  # 14.3 draws or more of every token
    counts = torch.bincount(tokens, minlength=8).float()
    # Pearson's statistic: a correct sampler exceeds CHI2_7DF_P1E5 with probability 1e-5. With the walk's
    # temperature left out, or the chunks weighed by their sums without their maxima, it read 373 and 629 here.
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < CHI2_7DF_P1E5, (chi2, counts, expected)
    # the noise is keyed by (seed, row): the first rows drawn again with the same seed repeat, not with another
    again, _ = triton_ops.sample(logits[:30], temperature, 0, 1.0, 17, chunk=4, block=4)
    other, _ = triton_ops.sample(logits[:30], temperature, 0, 1.0, 18, chunk=4, block=4)
    assert torch.equal(tokens[:30], again) and not torch.equal(tokens[:30], other)
    # tokens of probability zero (-inf logits) are never drawn, with or without filters
    inf = float("-inf")
    masked = torch.tensor([inf, 1.0, inf, inf, 0.5, inf, inf, inf], dtype=torch.bfloat16).expand(10, 8).contiguous()
    for top_k in (0, 6):
        drawn, log_probs = triton_ops.sample(masked, 1.0, top_k, 1.0, 5, chunk=4, block=4)
        assert set(drawn.tolist()) <= {1, 4} and torch.isfinite(log_probs).all(), (top_k, drawn)


CHECKS = {check.__name__: check for check in (hand_worked, signed_zeros, random_rows, frequencies_and_seeds)}

if __name__ == "__main__":
    import time

    for name in sys.argv[1:] or CHECKS:  # the checks named on the command line, else all
        check = CHECKS[name]
        start = time.perf_counter()
        check()
        print(f"{check.__name__}: ok ({time.perf_counter() - start:.1f} s)", flush=True)
    sys.exit(0)
