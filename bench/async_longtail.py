"""Synchronous against asynchronous GRPO on responses with a long tail of lengths, same run.

    python3 bench/async_longtail.py --out /tmp/longtail [--steps 4] [--mode NAME:key=value;... ...]
    python3 bench/async_longtail.py --out /tmp/longtail --tiny     # a small CPU dry run of the script

The workload: a random-weight model of the Qwen2.5-0.5B shape (24 layers, hidden 896, 14/2 heads, the full
151,936-token vocabulary, bf16), 64 prompts of about 380 tokens x 8 samples per step, GRPO (no KL), temperature 1.
The prompts are numbered (``DISTINCT_BATCHES`` x 64 of them, none repeated within a run of that many steps), so
that every sample of every step meets a draw of its own.
Each sample's response length is drawn once from a heavy-tailed distribution (seed fixed): 90% uniform in
200-600 tokens, 10% from a Pareto tail (exponent 1.2) from 600 up to 4,096; a random model never stops by
itself, so the engine's stop token is forced at the drawn length (this script patches the scheduler's record of
sampled tokens in its own process, which is why the runs use ``trainer.backend=local``). The draw depends on the
prompt's tokens (right-aligned, so the padding width does not matter) and the sample's index only, so every mode
meets the same lengths.

Modes (default): ``sync``; ``colocate_async`` allowing staleness 1 and 4 (one batch generated ahead, the
original's default ``num_warmup_batches``; groups past the threshold dropped, its default strategy). Each runs in a
process of its own; reported over steps 2..N: seconds per step, trained tokens per second (prompt + response tokens
of the batches trained, the original's ``perf/throughput`` count), the GPU's busy fraction (``nvidia-smi``'s
utilization.gpu, the share of time a kernel was running, sampled every 100 ms), peak memory, samples dropped for
staleness, and the ratio to sync.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PROMPTS, SAMPLES, MAX_RESPONSE = 64, 8, 4096
TAIL_SHARE, BODY, TAIL_EXPONENT = 0.1, (200, 600), 1.2
DISTINCT_BATCHES = 16  # batches of distinct prompts in train.parquet
MODES = {
    "sync": [],
    "async_s1": ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.sampler.max_off_policy_threshold=1"],
    "async_s4": ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.sampler.max_off_policy_threshold=4"],
}


def length_table(size: int, longest: int, seed: int = 0):
    """``size`` response lengths drawn from the workload's distribution (scaled so the longest is ``longest``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    scale = longest / MAX_RESPONSE
    body = rng.uniform(*BODY, size)
    tail = BODY[1] * (1 - rng.uniform(0, 1, size)) ** (-1 / TAIL_EXPONENT)
    lengths = np.where(rng.uniform(0, 1, size) < TAIL_SHARE, np.minimum(tail, MAX_RESPONSE), body)
    return np.maximum(1, (lengths * scale).astype(np.int64))


def force_stops(table, samples: int, eos_id: int) -> None:
    """Make the native engine emit ``eos_id`` once a row has generated its drawn number of tokens. A row's draw is
    picked by a hash of its prompt's tokens and its sample index, so the synchronous and the streaming schedulers
    (which number rows and pad prompts differently) stop the same sample at the same length."""
    import torch

    from verl.workers.rollout.native import scheduler

    record = scheduler.Run._record
    cached: dict = {}

    def _record(self, rows, steps, tokens, log_probs):
        device = self.input_ids.device
        if device not in cached:
            generator = torch.Generator().manual_seed(1)
            cached[device] = (torch.randint(1, 2**20, (8192,), generator=generator).to(device),
                              torch.as_tensor(table, device=device))
        weights, lengths = cached[device]
        live = rows < self.rows
        prompt = torch.where(live, rows // samples, 0)
        ids = self.input_ids[prompt]  # left-padded: the last token always meets the last weight
        digest = (ids * weights[-ids.shape[1]:]).sum(-1) + (rows % samples) * 7919
        target = lengths[digest % len(lengths)]
        tokens.masked_fill_(live & (steps + 1 >= target), eos_id)
        return record(self, rows, steps, tokens, log_probs)

    scheduler.Run._record = _record


def prepare(out: str, tiny: bool) -> dict:
    """The peer benchmark's model folder and reward (bench/peer_grpo.py; ``tiny``: its CPU-sized model), and
    ``DISTINCT_BATCHES`` batches of numbered prompts in place of its one batch (which repeats the fixture's few
    questions, so its prompts, and with them the drawn lengths, would repeat)."""
    import pandas as pd
    from transformers import AutoTokenizer

    from bench.peer_grpo import pack_questions, write_prompts
    from bench.peer_grpo import prepare as peer_prepare

    prepared = peer_prepare(out, quick=tiny)
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    fixture = os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k/main/train-00000-of-00001.parquet")
    questions = list(pd.read_parquet(fixture)["question"])
    count, target = (8 if tiny else PROMPTS) * DISTINCT_BATCHES, max(prepared["prompt_tokens"])
    packed, _ = pack_questions(tokenizer, questions, count, target - 16)  # room for the number
    prompts = [f"Problem {i}. {text}" for i, text in enumerate(packed)]
    lengths = [len(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"]) for p in prompts]
    if len(set(prompts)) != count:
        raise RuntimeError(f"expected {count} distinct prompts, got {len(set(prompts))}")
    write_prompts(prompts, "peer_bench", os.path.join(out, "train.parquet"))
    return {"model": prepared["model"], "prompt_tokens": lengths}


def command(out: str, prepared: dict, steps: int, tiny: bool, overrides: list[str]) -> list[str]:
    response = 64 if tiny else MAX_RESPONSE
    prompts = 8 if tiny else PROMPTS
    return [
        "algorithm.adv_estimator=grpo", f"data.train_files={out}/train.parquet", f"data.train_batch_size={prompts}",
        f"data.max_prompt_length={max(prepared['prompt_tokens'])}", f"data.max_response_length={response}",
        f"actor_rollout_ref.model.path={out}/model", "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}", f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.top_p=1.0", "actor_rollout_ref.rollout.name=native",
        f"custom_reward_function.path={out}/reward.py", "custom_reward_function.name=compute_score",
        "trainer.logger=['console','file']", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
        f"trainer.device={'cpu' if tiny else 'cuda'}", "trainer.backend=local", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={out}/ckpt", "trainer.experiment_name=async_longtail", *overrides,
    ]


def run_child(args) -> None:
    """One mode, in this process: patch the stops, run main_ppo, stamp each step's end."""
    from transformers import AutoTokenizer

    from verl.trainer import main_ppo
    from verl.utils import tracking

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.out, "model"))
    force_stops(length_table(4096, 64 if args.tiny else MAX_RESPONSE), SAMPLES, tokenizer.eos_token_id)
    ends = []
    log = tracking.Tracking.log

    def stamped(self, data, step, *a, **k):
        ends.append(time.time())
        return log(self, data, step, *a, **k)

    tracking.Tracking.log = stamped
    overrides = json.loads(args._child)
    with open(os.path.join(args.out, "prepared.json")) as f:
        prepared = json.load(f)
    if main_ppo.main(command(args.out, prepared, args.steps, args.tiny, overrides)) != 0:
        sys.exit(1)
    with open(os.path.join(args.out, f"{args._name}.ends.json"), "w") as f:
        json.dump(ends, f)


class Utilization:
    """``nvidia-smi`` samples of utilization.gpu every 100 ms, with their times (no samples without a GPU)."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          "-lms", "100"], stdout=subprocess.PIPE, text=True)
        except FileNotFoundError:
            self.proc = None
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.samples.append((time.time(), float(line)))

    def busy(self, start: float, end: float) -> float | None:
        inside = [u for t, u in self.samples if start <= t <= end]
        return statistics.mean(inside) / 100 if inside else None

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--mode", action="append", default=[], help="NAME:key=value;... (default: sync, s1, s4)")
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    parser.add_argument("--_name", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out = os.path.abspath(args.out)
    if args._child is not None:
        run_child(args)
        return
    os.makedirs(args.out, exist_ok=True)
    prepared = prepare(args.out, args.tiny)
    with open(os.path.join(args.out, "prepared.json"), "w") as f:
        json.dump({"prompt_tokens": prepared["prompt_tokens"]}, f)
    table = length_table(4096, 64 if args.tiny else MAX_RESPONSE)
    print(f"response lengths: median {int(statistics.median(table))}, 90th percentile "
          f"{int(sorted(table)[int(0.9 * len(table))])}, max {int(table.max())}", flush=True)
    modes = dict(MODES)
    if args.mode:
        modes = {}
        for spec in args.mode:
            name, _, overrides = spec.partition(":")
            modes[name] = [o for o in overrides.split(";") if o]
    results = {}
    for name, overrides in modes.items():
        metrics_file = os.path.join(args.out, f"{name}.jsonl")
        if os.path.exists(metrics_file):
            os.remove(metrics_file)
        env = {**os.environ, "VERL_FILE_LOGGER_PATH": metrics_file,
               "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
        usage = Utilization()
        started = time.time()
        subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out, "--steps", str(args.steps),
                        "--_child", json.dumps(overrides), "--_name", name] + (["--tiny"] if args.tiny else []),
                       check=True, env=env, cwd=args.out)
        usage.stop()
        with open(metrics_file) as f:
            steps = [json.loads(line)["data"] for line in f]
        with open(os.path.join(args.out, f"{name}.ends.json")) as f:
            ends = json.load(f)
        later = steps[1:]
        seconds = sum(s["timing_s/step"] for s in later)
        results[name] = {
            "overrides": overrides, "first_step_s": ends[0] - started,
            "seconds": statistics.median(s["timing_s/step"] for s in later),
            "tokens_per_s": sum(s["perf/total_num_tokens"] for s in later) / seconds,
            "busy": usage.busy(ends[0], ends[-1]),
            "peak_gib": max(s.get("perf/max_memory_allocated_gb", 0.0) for s in steps),
            "dropped": sum(s.get("async/dropped_samples", 0) for s in later),
            "staleness_max": max(s.get("async/staleness/max", 0) for s in later),
            "response_mean": statistics.mean(s["response_length/mean"] for s in later),
            "gen_s": statistics.median(s["timing_s/gen"] for s in later),
            "update_s": statistics.median(s["timing_s/update_actor"] for s in later),
        }
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    base = results.get("sync")
    print("\nsteps 2..N")
    print(f"{'':10} {'s/step':>7} {'tokens/s':>9} {'vs sync':>8} {'busy':>6} {'peak GiB':>9} {'dropped':>8} "
          f"{'stale max':>9} {'resp mean':>9} {'gen s':>7} {'update s':>9}")
    for name, r in results.items():
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:7.2f}x" if base else ""
        busy = f"{r['busy']:6.2f}" if r["busy"] is not None else f"{'-':>6}"
        print(f"{name:10} {r['seconds']:7.2f} {r['tokens_per_s']:9.0f} {ratio:>8} {busy} {r['peak_gib']:9.2f} "
              f"{r['dropped']:8.0f} {r['staleness_max']:9.0f} {r['response_mean']:9.0f} {r['gen_s']:7.2f} "
              f"{r['update_s']:9.2f}")


if __name__ == "__main__":
    main()
