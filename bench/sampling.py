"""Sampling one token per row from ``(rows, 151936)`` bf16 logits (Qwen2.5's vocabulary): the native
engine's sort-free Triton sampler (``triton_ops.sample``) vs the torch ops it replaces on CUDA
(``sampling.sample`` with ``VERL_NATIVE_TRITON=0``'s path: ``topk``/full sort for the filters, then
Gumbel-max), in the same run.

Two kinds of rows: "flat" (``randn * 2``: the near-uniform logits of a randomly initialised model, where
top-p 0.9 keeps ~80% of the vocabulary) and "peaked" (``randn * 12``: a few tokens hold most of the mass,
as in a trained model). Times are CUDA-event medians over repeated calls, milliseconds per call.

    python3 bench/sampling.py [--rows 256] [--blocks 1024 2048] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.native import sampling, triton_ops

VOCAB = 151936
SETTINGS = [("pure sampling", 0, 1.0), ("top_k 50", 50, 1.0), ("top_p 0.9", 0, 0.9),
            ("top_k 50 + top_p 0.9", 50, 0.9)]


def median_ms(fn, repeats: int = 30) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024],
                        help="the Triton sampler's tokens per loop step (each is timed)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    g = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(args.rows, VOCAB, device="cuda", generator=g)
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "rows": args.rows, "vocab": VOCAB, "results": []}
    print(f"# {info['device']}, torch {torch.__version__}, {args.rows} x {VOCAB} bf16 logits, ms per call")
    header = "| rows | setting | torch ops | " + " | ".join(f"Triton, block {b}" for b in args.blocks)
    print(header + " | speed-up |")
    print("|---" * (4 + len(args.blocks)) + "|")
    for kind, scale in (("flat", 2.0), ("peaked", 12.0)):
        logits = (base * scale).to(torch.bfloat16)
        for name, top_k, top_p in SETTINGS:
            params = SamplingParams(n=1, greedy=False, temperature=1.0, top_k=top_k, top_p=top_p, response_length=1,
                                    eos_token_ids=(), pad_token_id=0)
            gen = torch.Generator(device="cuda").manual_seed(1)
            torch_ms = median_ms(lambda: sampling.sample(logits, params, gen))  # no seed: the torch path
            ours = [median_ms(lambda b=b: triton_ops.sample(logits, 1.0, top_k, top_p, 7, block=b))
                    for b in args.blocks]
            best = min(ours)
            info["results"].append({"rows": kind, "setting": name, "torch_ms": torch_ms,
                                    "triton_ms": dict(zip(args.blocks, ours)), "speedup": torch_ms / best})
            cells = " | ".join(f"{t:.3f}" for t in ours)
            print(f"| {kind} | {name} | {torch_ms:.3f} | {cells} | {torch_ms / best:.1f}x |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
