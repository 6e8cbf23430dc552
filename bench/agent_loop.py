"""Multi-turn episodes: the native engine's continuous scheduling (each episode keeps its cache slot
and continues as soon as its tool result is ready) against rounds (every ready episode's next turn in
one ``generate_sequences`` call per budget group, each call re-reading its whole context: what
``BaseRollout.generate_episodes`` does, and what this repository did before), same engine, same run.

Qwen2.5-0.5B architecture with random bf16 weights (bench/rollout.py), so the workload is synthetic
but shaped like tool use: 64 prompts x 4 samples of 256 random tokens, a response budget of 2,048
tokens, at most 4 assistant turns. A turn ends when the model samples one of the lowest ``K`` token
ids (``K`` calibrated in the run so that a turn averages ~``--turn`` tokens; with random weights the
next-token distribution is nearly uniform). After each of the first three turns a simulated tool
answers after a latency and with a result of a length that are fixed per (episode, turn): uniform in
[``--latency-min``, ``--latency-max``] ms and [32, 160] tokens; its result tokens are appended as
the next part of the context. Tools run on threads, concurrently with generation, in both modes.

    python3 bench/agent_loop.py --json results.json     # on the GPU machine
    python3 bench/agent_loop.py --quick                 # a tiny CPU dry run of the script

Prints per mode and latency setting: wall seconds, episodes/s, generated tokens/s (model tokens /
wall time), all response tokens/s (tool results included), turns, and the engine's split (decode,
prefill/extend, idle waiting for tools).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.rollout import build_model, make_prompts, measure
from verl.workers.rollout import NativeRollout
from verl.workers.rollout.base import BaseRollout

MAX_TURNS = 4


class SimulatedTools:
    """``on_turn`` for ``generate_episodes``: a tool result after a latency, both fixed per (row, turn)."""

    def __init__(self, vocab: int, budget: int, latency_ms: tuple[float, float], result_tokens=(32, 160)):
        self.vocab, self.budget, self.latency_ms, self.result_tokens = vocab, budget, latency_ms, result_tokens
        self.turns: dict[int, int] = {}
        self.generated = 0
        self.lock = threading.Lock()

    def plan(self, row: int, turn: int) -> tuple[float, list[int]]:
        rng = random.Random(row * 1000 + turn)
        latency = rng.uniform(*self.latency_ms) / 1000
        length = rng.randint(*self.result_tokens)
        return latency, [rng.randrange(1, self.vocab) for _ in range(length)]

    def __call__(self, row: int, ids: list[int], log_probs: list[float], used: int) -> concurrent.futures.Future:
        with self.lock:
            turn = self.turns[row] = self.turns.get(row, 0) + 1
            self.generated += len(ids)
        future = concurrent.futures.Future()
        if turn >= MAX_TURNS or used >= self.budget:
            future.set_result(None)
            return future
        latency, result = self.plan(row, turn)
        if latency <= 0:
            future.set_result(result)
        else:
            threading.Timer(latency, future.set_result, args=(result,)).start()
        return future


def calibrate_stop_ids(model, vocab: int, prompt_len: int, device: str, target_turn: int) -> int:
    """The K for which sampled tokens fall below K once every ``target_turn`` tokens, measured."""
    config = {"response_length": 64, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True,
              "ignore_eos": True, "gpu_memory_utilization": 0.5}
    out = NativeRollout(config, model, None).generate_sequences(make_prompts(64, prompt_len, vocab, device, seed=5))
    tokens = out.batch["responses"].flatten().sort().values
    return int(tokens[len(tokens) // target_turn].item()) + 1


def run_mode(mode: str, model, prompts, vocab: int, budget: int, latency_ms, stop_ids: int, n: int, device: str,
             repeats: int):
    config = {"response_length": budget, "n": n, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True,
              "gpu_memory_utilization": 0.5, "max_num_seqs": 1024, "max_num_batched_tokens": 8192,
              "free_cache_engine": True, "enforce_eager": device != "cuda"}
    engine = NativeRollout(config, model, None)
    prompts.meta_info.update({"eos_token_id": list(range(stop_ids)), "n": n, "response_length": budget})
    best = None
    for repeat in range(repeats):
        prompts.meta_info["seed"] = 100 + repeat
        tools = SimulatedTools(vocab, budget, latency_ms)
        engine.last_stats = {}
        out = {}

        def call():
            if mode == "continuous":
                out["tokens"] = engine.generate_episodes(prompts, tools)
            else:
                out["tokens"] = BaseRollout.generate_episodes(engine, prompts, tools)

        seconds, peak, _ = measure(call, device)
        tokens = out["tokens"]
        result = {"seconds": seconds, "peak_gib": peak, "episodes": len(tokens.lengths),
                  "generated_tokens": int(tokens.generated.sum()), "response_tokens": int(tokens.lengths.sum()),
                  "turns": sum(tools.turns.values()), "stats": dict(engine.last_stats)}
        if best is None or seconds < best["seconds"]:
            best = result
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model on CPU: checks the script runs")
    parser.add_argument("--json", default=None)
    parser.add_argument("--turn", type=int, default=160, help="target mean tokens per assistant turn")
    parser.add_argument("--latency-min", type=float, default=50.0)
    parser.add_argument("--latency-max", type=float, default=500.0)
    parser.add_argument("--repeats", type=int, default=2, help="runs per case; the fastest is reported")
    args = parser.parse_args(argv)

    device = "cpu" if args.quick else "cuda"
    batch, n, prompt_len, budget = (4, 2, 16, 96) if args.quick else (64, 4, 256, 2048)
    turn = 12 if args.quick else args.turn
    model = build_model("qwen2.5-0.5b", args.quick, device, torch.float32 if args.quick else torch.bfloat16)
    vocab = model.config.vocab_size
    stop_ids = calibrate_stop_ids(model, vocab, prompt_len, device, turn)
    info = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "prompts": batch, "n": n, "prompt_len": prompt_len,
            "budget": budget, "stop_ids": stop_ids, "target_turn": turn, "cases": []}
    print(f"# {info['device']}, torch {torch.__version__}: {batch} prompts x n={n}, prompt {prompt_len}, budget "
          f"{budget}, turns end at ids < {stop_ids} (target {turn} tokens per turn)", flush=True)
    run_mode("continuous", model, make_prompts(8, prompt_len, vocab, device), vocab, 64, (0, 0), stop_ids, 1, device,
             1)  # warm-up: kernels, CUDA context

    latencies = [(0.0, 0.0), (args.latency_min, args.latency_max)]
    for latency in latencies:
        results = {}
        for mode in ("rounds", "continuous"):
            prompts = make_prompts(batch, prompt_len, vocab, device)
            r = results[mode] = run_mode(mode, model, prompts, vocab, budget, latency, stop_ids, n, device,
                                         args.repeats)
            s = r["stats"]
            split = (f"decode {s.get('decode_s', 0):.2f} s, extend {s.get('extend_s', 0):.2f} s, "
                     f"idle {s.get('idle_s', 0):.2f} s" if mode == "continuous" else "engine calls per round group")
            print(f"tool latency {latency[0]:.0f}-{latency[1]:.0f} ms, {mode}: {r['seconds']:.2f} s, "
                  f"{r['episodes'] / r['seconds']:.1f} episodes/s, {r['generated_tokens'] / r['seconds']:.0f} generated "
                  f"tok/s, {r['response_tokens'] / r['seconds']:.0f} response tok/s, {r['turns']} turns "
                  f"({r['generated_tokens'] / max(r['turns'], 1):.0f} tokens each), peak {r['peak_gib']:.2f} GiB; "
                  f"{split}", flush=True)
        ratio = (results["continuous"]["generated_tokens"] / results["continuous"]["seconds"]) / (
            results["rounds"]["generated_tokens"] / results["rounds"]["seconds"])
        print(f"tool latency {latency[0]:.0f}-{latency[1]:.0f} ms: continuous / rounds = {ratio:.2f}x generated tok/s",
              flush=True)
        info["cases"].append({"latency_ms": latency, **{m: results[m] for m in results}, "ratio": ratio})
    print("\n| tool latency | mode | s | episodes/s | generated tok/s | response tok/s | turns | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for case in info["cases"]:
        for mode, ratio in (("rounds", 1.0), ("continuous", case["ratio"])):
            r = case[mode]
            print(f"| {case['latency_ms'][0]:.0f}-{case['latency_ms'][1]:.0f} ms | {mode} | {r['seconds']:.2f} | "
                  f"{r['episodes'] / r['seconds']:.1f} | {r['generated_tokens'] / r['seconds']:.0f} | "
                  f"{r['response_tokens'] / r['seconds']:.0f} | {r['turns']} | {ratio:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1, default=str)


if __name__ == "__main__":
    main()
