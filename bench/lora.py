"""How the rollout should apply a LoRA adapter: merged into the weights once per generation call, or
as low-rank terms in every decode step. Both measured in one run on the Qwen2.5-0.5B shape.

    python3 bench/lora.py [--rank 32] [--batch 256] [--steps 255]    # on the GPU machine
    python3 bench/lora.py --quick                                    # tiny, on the CPU (checks the script)

- merged (what ``verl.models.lora.merge_into_gathered_weights`` does): ``W += scaling · B·A`` for every
  adapted linear of the model, once per generation call; decode steps then cost what they cost without
  an adapter.
- low-rank terms (the baseline): every decode step adds ``scaling · (x·Aᵀ)·Bᵀ`` to the output of each
  adapted linear, 2 extra matmuls per linear per step. Timed for one decode step's tokens (``--batch``
  rows), eager and captured in a CUDA graph (the native engine replays decode steps as graphs), then
  multiplied by ``--steps`` decode steps (a 256-token response).

Prints the time of each per generation call and their ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformers import AutoModelForCausalLM, Qwen2Config

from bench.rollout import QUICK, QWEN25_05B
from verl.models.lora import LoraSettings, apply_lora, merge_into_gathered_weights


def _timed(fn, device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after a warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256, help="rows decoded per step")
    parser.add_argument("--steps", type=int, default=255, help="decode steps per generation call")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = Qwen2Config(**(QUICK if args.quick else QWEN25_05B))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    apply_lora(model, LoraSettings(rank=args.rank, alpha=args.rank))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.01)
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    adapter = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)

    merge_s = _timed(lambda: merge_into_gathered_weights(model), device, 5)

    x_by_in = {}
    for layer in layers:
        features = layer.base_layer.in_features
        x_by_in.setdefault(features, torch.randn(args.batch, features, device=device, dtype=dtype))
    outputs = [torch.empty(args.batch, layer.base_layer.out_features, device=device, dtype=dtype) for layer in layers]

    def low_rank_terms():
        for layer, out in zip(layers, outputs):
            a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
            out.add_((x_by_in[layer.base_layer.in_features] @ a.t()) @ b.t(), alpha=layer.scaling["default"])

    eager_s = _timed(low_rank_terms, device, 20)
    graph_s = None
    if device.type == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            low_rank_terms()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            low_rank_terms()
        graph_s = _timed(graph.replay, device, 50)

    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}; "
          f"{len(layers)} adapted linears, rank {args.rank}, {adapter:,} adapter parameters, {dtype}")
    print(f"merged:          {merge_s * 1e3:9.2f} ms once per generation call")
    per_call = {"eager": eager_s * args.steps}
    print(f"low-rank terms:  {eager_s * 1e6:9.1f} us per decode step eager  -> {per_call['eager'] * 1e3:9.2f} ms "
          f"per call of {args.steps} steps")
    if graph_s is not None:
        per_call["graph"] = graph_s * args.steps
        print(f"                 {graph_s * 1e6:9.1f} us per decode step graph  -> {per_call['graph'] * 1e3:9.2f} ms "
              f"per call")
    best = min(per_call.values())
    print(f"merged is {best / merge_s:.1f}x cheaper per generation call than the best low-rank variant")


if __name__ == "__main__":
    main()
