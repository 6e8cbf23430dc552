"""Synchronous against asynchronous GRPO on responses with a long tail of lengths, same run.

    python3 bench/async_longtail.py --out /tmp/longtail [--steps 4] [--mode NAME:key=value;... ...]
    python3 bench/async_longtail.py --out /tmp/longtail --tiny     # a small CPU dry run of the script
    python3 bench/async_longtail.py --out /tmp/sched --schedule --steps 9   # the schedule alone, on CPU

The workload: a random-weight model of the Qwen2.5-0.5B shape (24 layers, hidden 896, 14/2 heads, the full
151,936-token vocabulary, bf16), 64 prompts of about 380 tokens x 8 samples per step, GRPO (no KL), temperature 1.
The prompts are numbered (``DISTINCT_BATCHES`` x 64 of them, none repeated within a run of that many steps), so
that every sample of every step meets a draw of its own.
Each sample's response length is drawn once from a heavy-tailed distribution (seed fixed): 90% uniform in
200-600 tokens, 10% from a Pareto tail (exponent 1.2) from 600 up to 4,096. The engine's stop token is forced
at the drawn length, and a stop token the random model samples before it is replaced (this script patches the
scheduler's record of sampled tokens in its own process, which is why the runs use ``trainer.backend=local``). The draw depends on the
prompt's tokens (right-aligned, so the padding width does not matter) and the sample's index only, so every mode
meets the same lengths.

Modes (default): ``sync``; ``colocate_async`` allowing staleness 1 and 4 (one batch generated ahead, the
original's default ``num_warmup_batches``; groups past the threshold dropped, its default strategy). Each runs in a
process of its own; reported over steps 2..N: seconds per step, trained tokens per second (prompt + response tokens
of the batches trained, the original's ``perf/throughput`` count), the GPU's busy fraction (``nvidia-smi``'s
utilization.gpu, the share of time a kernel was running, sampled every 100 ms), peak memory, samples dropped for
staleness, and the ratio to sync. A second table says where each step's generation goes: rollout calls and their
seconds (the device synchronised around each call and each phase, which costs a little), of which decoding (and
within it CUDA-graph capture: the graphs go with the cache freed after every call), prompt prefill, the prefill
of resumed rows, the rest, and decode steps with their mean time outside capture.

``--schedule`` runs the same modes on CPU to count what each schedules, not how fast: the real trainer and
schedulers with a one-layer model of a 512-token vocabulary, every length (prompts, drawn responses) divided by
``SCHEDULE_SCALE``, and ``SCHEDULE_SLOTS`` cache slots (what the H100's cache holds for this workload). Per
training step: decode steps, rows decoded per step, prompt and resumed tokens prefilled, all scaled back. It also
prints an *estimate* of the GPU's seconds per step from these counts, with per-step costs fitted to the H100
measurements in docs/benchmarks.md (``DECODE_STEP_S`` and the rest below). It is an estimate, for choosing what
to measure. It is not a measurement.
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
# --schedule: lengths divided by SCHEDULE_SCALE; slots about as many as an H100's cache holds for this workload (half
# of about 70 GB free, less the 2.5 GB the engine keeps for logits, at 55 MB for a slot of 4,480 columns; not read
# from a GPU run).
SCHEDULE_SCALE, SCHEDULE_SLOTS = 8, 590
# The estimate's costs on one H100 (docs/benchmarks.md). A decode step of this shape: DECODE_STEP_S, plus
# DECODE_ROW_S per row of its bucket, plus the live rows' keys and values (KV_BYTES_PER_TOKEN per column) read at
# HBM_BYTES_PER_S; DECODE_ROW_S from the measured steps of 64 and 256 rows (1.84 and 2.48 ms, ~512 columns). Every
# live row is charged its own prompt columns, though a group's rows prefilled together read one copy (resumed rows
# do not share): this overstates sync's key/value reads more than the asynchronous modes'.
# Prefill: PREFILL_TOKEN_S (98,304 prompt tokens in 0.24 s). Update: UPDATE_TOKEN_S per trained token (3.5 s for
# 400k tokens, checkpointing off). A generation call costs GENERATE_CALL_S besides its decoding and prefill. That
# constant and DECODE_STEP_S are fitted to two measured generation times of the workload before its tail was
# restored, 3.78 s (sync) and 3.14 s (staleness 1), with this script's counts of that workload's exact lengths.
# The fit is fragile: a 0.15 s error in either time moves DECODE_STEP_S by about 0.2 ms. Anything else in a
# step: OTHER_S.
DECODE_STEP_S, DECODE_ROW_S, KV_BYTES_PER_TOKEN, HBM_BYTES_PER_S = 1.23e-3, 1.3e-6, 12288, 3.0e12
PREFILL_TOKEN_S, UPDATE_TOKEN_S, GENERATE_CALL_S, OTHER_S = 2.5e-6, 8.75e-6, 1.30, 0.15
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
    """Make the native engine emit ``eos_id`` once a row has generated its drawn number of tokens, and never
    before: a stop token the model samples earlier is replaced by a token that does not stop (a random model
    samples one about once per vocabulary size: rarely with 151,936 ids, every ~512 tokens with ``--schedule``'s
    512). A row's draw is picked by a hash of its prompt's tokens and its sample index, so the synchronous and the
    streaming schedulers (which number rows and pad prompts differently) stop the same sample at the same
    length."""
    import torch

    from verl.workers.rollout.native import scheduler

    record = scheduler.Run._record
    cached: dict = {}

    def _record(self, rows, steps, tokens, log_probs):
        device = self.input_ids.device
        if device not in cached:
            generator = torch.Generator().manual_seed(1)
            stops = set(self.eos.tolist())
            cached[device] = (torch.randint(1, 2**20, (8192,), generator=generator).to(device),
                              torch.as_tensor(table, device=device), next(i for i in range(1, 2**20) if i not in stops))
        weights, lengths, goes_on = cached[device]
        live = rows < self.rows
        prompt = torch.where(live, rows // samples, 0)
        ids = self.input_ids[prompt]  # left-padded: the last token always meets the last weight
        digest = (ids * weights[-ids.shape[1]:]).sum(-1) + (rows % samples) * 7919
        target = lengths[digest % len(lengths)]
        tokens.masked_fill_(live & (steps + 1 < target) & torch.isin(tokens, self.eos), goes_on)
        tokens.masked_fill_(live & (steps + 1 >= target), eos_id)
        return record(self, rows, steps, tokens, log_probs)

    scheduler.Run._record = _record


def prepare(out: str, tiny: bool, schedule: bool = False) -> dict:
    """The model folder, reward and prompts. The model and reward are the peer benchmark's (bench/peer_grpo.py;
    ``tiny``: its CPU-sized model; ``schedule``: one layer over its 512-token vocabulary). The prompts are
    ``DISTINCT_BATCHES`` batches of numbered ones, in place of its one batch (which repeats the fixture's few
    questions, so its prompts, and with them the drawn lengths, would repeat)."""
    import pandas as pd
    from transformers import AutoTokenizer

    from bench.peer_grpo import PROMPT_TOKENS, numbered_prompts, pack_questions, write_prompts
    from bench.peer_grpo import prepare as peer_prepare
    from verl.utils.tiny_model import build_tiny_causal_lm

    prepared = peer_prepare(out, quick=tiny or schedule)
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    if schedule:
        prepared["model"] = build_tiny_causal_lm(os.path.join(out, "model"), os.path.join(out, "tokenizer"),
                                                 hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                 intermediate_size=64)
    fixture = os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k/main/train-00000-of-00001.parquet")
    questions = list(pd.read_parquet(fixture)["question"])
    count = (8 if tiny else PROMPTS) * DISTINCT_BATCHES
    if schedule:  # the chat template is not scaled: questions are cut so that whole prompts average 1/8 of the GPU's
        _, peer = pack_questions(tokenizer, questions, PROMPTS, PROMPT_TOKENS)
        _, full = numbered_prompts(tokenizer, questions, count, max(peer))
        prompts, lengths = cut_prompts(tokenizer, questions, count, round(statistics.mean(full) / SCHEDULE_SCALE + 0.5))
    else:
        prompts, lengths = numbered_prompts(tokenizer, questions, count, max(prepared["prompt_tokens"]))
    write_prompts(prompts, "peer_bench", os.path.join(out, "train.parquet"))
    return {"model": prepared["model"], "prompt_tokens": lengths}


def cut_prompts(tokenizer, questions: list[str], count: int, target: int) -> tuple[list[str], list[int]]:
    """``count`` numbered prompts of the questions' first words, as many as keep the chat-templated prompt within
    ``target`` tokens; and their lengths."""
    from bench.peer_grpo import prompt_length

    prompts, lengths = [], []
    for i in range(count):
        words, text = questions[i % len(questions)].split(), f"P {i}."
        for word in words:
            if prompt_length(tokenizer, f"{text} {word}") > target:
                break
            text = f"{text} {word}"
        prompts.append(text)
        lengths.append(prompt_length(tokenizer, text))
    return prompts, lengths


def longest(args) -> int:
    """The longest response of the run: the workload's, or scaled down for ``--tiny`` and ``--schedule``."""
    return 64 if args.tiny else MAX_RESPONSE // SCHEDULE_SCALE if args.schedule else MAX_RESPONSE


def command(out: str, prepared: dict, steps: int, args, overrides: list[str]) -> list[str]:
    prompts = 8 if args.tiny else PROMPTS
    on_cpu = args.tiny or args.schedule
    return [
        "algorithm.adv_estimator=grpo", f"data.train_files={out}/train.parquet", f"data.train_batch_size={prompts}",
        f"data.max_prompt_length={max(prepared['prompt_tokens'])}", f"data.max_response_length={longest(args)}",
        f"actor_rollout_ref.model.path={out}/model", "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}", f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.top_p=1.0", "actor_rollout_ref.rollout.name=native",
        f"custom_reward_function.path={out}/reward.py", "custom_reward_function.name=compute_score",
        "trainer.logger=['console','file']", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
        f"trainer.device={'cpu' if on_cpu else 'cuda'}", "trainer.backend=local", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={out}/ckpt", "trainer.experiment_name=async_longtail",
        *([f"actor_rollout_ref.rollout.max_num_seqs={SCHEDULE_SLOTS}"] if args.schedule else []), *overrides,
    ]


def count_schedule() -> list[dict]:
    """Count, per training step, what the native rollout schedules (``--schedule``): returns the list the counts
    of each finished step are appended to (by :func:`end_step`)."""
    from verl.workers.rollout.native import scheduler, stream

    steps = [{"decode_steps": 0, "live_rows": 0, "bucket_rows": 0, "decode_est_s": 0.0, "prompt_tokens": 0,
              "resumed_rows": 0, "resumed_tokens": 0}]
    scale = SCHEDULE_SCALE
    decode_step, prefill_prompts, prefill_suspended = (scheduler.Run._decode_step, scheduler.Run._prefill,
                                                       stream.StreamRun._prefill_suspended)

    def _decode_step(self, b):
        live = self.state.live[:b]
        rows = int(live.sum())
        columns = int((self.state.write_pos[:b] - self.state.start[:b])[live].sum()) * scale
        current = steps[-1]
        current["decode_steps"] += 1
        current["live_rows"] += rows
        current["bucket_rows"] += b
        current["decode_est_s"] += (DECODE_STEP_S + b * DECODE_ROW_S
                                    + columns * KV_BYTES_PER_TOKEN / HBM_BYTES_PER_S) * scale
        return decode_step(self, b)

    def _prefill(self, prompts, rows, slots):
        steps[-1]["prompt_tokens"] += len(prompts) * (self.width - min(self.pads[p] for p in prompts))
        return prefill_prompts(self, prompts, rows, slots)

    def _prefill_suspended(self, rows, slots):
        steps[-1]["resumed_rows"] += len(rows)
        steps[-1]["resumed_tokens"] += sum(self.width - self.pads[r // self.n] + int(self.row_steps[r]) - 1
                                           for r in rows)
        return prefill_suspended(self, rows, slots)

    scheduler.Run._decode_step = _decode_step
    scheduler.Run._prefill = _prefill
    stream.StreamRun._prefill_suspended = _prefill_suspended
    return steps


def end_step(steps: list[dict]) -> None:
    """Close the current step's counts (scaled back to the workload's lengths) and open the next."""
    done = steps[-1]
    for key in ("live_rows", "bucket_rows"):  # per decode step
        done[key] /= max(1, done["decode_steps"])
    for key in ("decode_steps", "prompt_tokens", "resumed_tokens"):
        done[key] *= SCHEDULE_SCALE
    steps.append({key: 0 * value for key, value in done.items()})


ROLLOUT_KEYS = ("decode_steps", "graph_captures", "prefill_s", "decode_s", "resume_prefill_s")


def record_rollout() -> list[dict]:
    """Time every call of the native rollout (device synchronised around it, and at each of its phases: the
    engine's ``profile``) and sum its statistics, per training step: returns the list each finished step's record
    is appended to (by :func:`end_rollout_step`), for the table of where generation goes. A rollout decoding on a
    thread of its own (``overlap_generation``, ``separate_async``) is timed per call only: its phases are the
    thread's, not the call's."""
    import torch

    from verl.utils import startup
    from verl.workers.rollout.native.engine import NativeRollout

    steps = [{"calls": 0, "call_s": 0.0, "threaded": 0, **dict.fromkeys(ROLLOUT_KEYS, 0.0),
              "capture_s": startup.WORKER.totals().get("cuda graph capture", 0.0)}]

    def timed(method):
        def call(self, *a, **k):
            self.profile = True
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            tic = time.perf_counter()
            try:
                return method(self, *a, **k)
            finally:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                current = steps[-1]
                current["calls"] += 1
                current["call_s"] += time.perf_counter() - tic
                if self.server is not None:
                    current["threaded"] = 1
                else:
                    for key in ROLLOUT_KEYS:
                        current[key] += float(self.last_stats.get(key, 0.0))
        return call

    NativeRollout.generate_sequences = timed(NativeRollout.generate_sequences)
    NativeRollout.generate_stream = timed(NativeRollout.generate_stream)
    return steps


def end_rollout_step(steps: list[dict]) -> None:
    """Close the current step's rollout record (graph capture seconds since the step began) and open the next."""
    from verl.utils import startup

    captured = startup.WORKER.totals().get("cuda graph capture", 0.0)
    done = steps[-1]
    done["capture_s"] = captured - done["capture_s"]
    steps.append({**{key: 0 * value for key, value in done.items()}, "capture_s": captured})


def run_child(args) -> None:
    """One mode, in this process: patch the stops, run main_ppo, stamp each step's end (and count its schedule)."""
    from transformers import AutoTokenizer

    from verl.trainer import main_ppo
    from verl.utils import tracking

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.out, "model"))
    force_stops(length_table(4096, longest(args)), SAMPLES, tokenizer.eos_token_id)
    schedule = count_schedule() if args.schedule else None
    rollout = record_rollout()
    ends = []
    log = tracking.Tracking.log

    def stamped(self, data, step, *a, **k):
        ends.append(time.time())
        end_rollout_step(rollout)
        if schedule is not None:
            end_step(schedule)
        return log(self, data, step, *a, **k)

    tracking.Tracking.log = stamped
    overrides = json.loads(args._child)
    with open(os.path.join(args.out, "prepared.json")) as f:
        prepared = json.load(f)
    if main_ppo.main(command(args.out, prepared, args.steps, args, overrides)) != 0:
        sys.exit(1)
    with open(os.path.join(args.out, f"{args._name}.ends.json"), "w") as f:
        json.dump(ends, f)
    with open(os.path.join(args.out, f"{args._name}.rollout.json"), "w") as f:
        json.dump(rollout[:-1], f)
    if schedule is not None:
        with open(os.path.join(args.out, f"{args._name}.schedule.json"), "w") as f:
            json.dump(schedule[:-1], f)


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


def schedule_summary(counts: list[dict], metrics: list[dict]) -> dict:
    """Medians over steps 2..N of one mode's schedule counts (``--schedule``), and the estimated GPU seconds per
    step and trained tokens per second they imply (the cost constants above; an estimate, not a measurement)."""
    steps = []
    for c, m in zip(counts, metrics):
        trained = m["perf/total_num_tokens"] * SCHEDULE_SCALE
        generate = (c["decode_est_s"] + (c["prompt_tokens"] + c["resumed_tokens"]) * PREFILL_TOKEN_S
                    + GENERATE_CALL_S * m.get("async/generate_calls", 1))
        steps.append({**c, "trained_tokens": trained, "est_generate_s": generate,
                      "est_update_s": trained * UPDATE_TOKEN_S,
                      "est_step_s": generate + trained * UPDATE_TOKEN_S + OTHER_S})
    summary = {key: statistics.median(s[key] for s in steps) for key in steps[0]}
    summary["est_tokens_per_s"] = sum(s["trained_tokens"] for s in steps) / sum(s["est_step_s"] for s in steps)
    return summary


def print_schedule(results: dict) -> None:
    base = results.get("sync", {}).get("schedule")
    print("\nsteps 2..N, per training step (medians), lengths scaled back; est_*: estimated H100 seconds, not measured")
    print(f"{'':10} {'decode steps':>12} {'live rows':>9} {'bucket':>7} {'prompt tok':>10} {'resumed':>8} "
          f"{'resumed tok':>11} {'dropped':>8} {'stale max':>9} {'resp mean':>9} {'est gen s':>9} {'est upd s':>9} "
          f"{'est s/step':>10} {'est vs sync':>11}")
    for name, r in results.items():
        s = r["schedule"]
        ratio = f"{s['est_tokens_per_s'] / base['est_tokens_per_s']:10.2f}x" if base else ""
        print(f"{name:10} {s['decode_steps']:12.0f} {s['live_rows']:9.0f} {s['bucket_rows']:7.0f} "
              f"{s['prompt_tokens']:10.0f} {s['resumed_rows']:8.0f} {s['resumed_tokens']:11.0f} {r['dropped']:8.0f} "
              f"{r['staleness_max']:9.0f} {r['response_mean'] * SCHEDULE_SCALE:9.0f} {s['est_generate_s']:9.2f} "
              f"{s['est_update_s']:9.2f} {s['est_step_s']:10.2f} {ratio:>11}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--schedule", action="store_true", help="count the schedule on CPU (see above)")
    parser.add_argument("--mode", action="append", default=[], help="NAME:key=value;... (default: sync, s1, s4)")
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    parser.add_argument("--_name", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out = os.path.abspath(args.out)
    if args._child is not None:
        run_child(args)
        return
    os.makedirs(args.out, exist_ok=True)
    if args.tiny and args.schedule:
        parser.error("--tiny and --schedule are two different CPU runs: pick one")
    prepared = prepare(args.out, args.tiny, args.schedule)
    with open(os.path.join(args.out, "prepared.json"), "w") as f:
        json.dump({"prompt_tokens": prepared["prompt_tokens"]}, f)
    table = length_table(4096, longest(args))
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
                        "--_child", json.dumps(overrides), "--_name", name] + (["--tiny"] if args.tiny else [])
                       + (["--schedule"] if args.schedule else []),
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
        with open(os.path.join(args.out, f"{name}.rollout.json")) as f:
            calls = json.load(f)[1:]
        results[name]["rollout"] = {key: statistics.median(c[key] for c in calls) for key in calls[0]}
        if args.schedule:
            with open(os.path.join(args.out, f"{name}.schedule.json")) as f:
                results[name]["schedule"] = schedule_summary(json.load(f)[1:], later)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    if args.schedule:
        print_schedule(results)
        return
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
    print("\nwhere generation goes, per training step (medians of steps 2..N; the device synchronised around each call"
          " and phase; decode includes the graph captures)")
    print(f"{'':10} {'calls':>5} {'call s':>7} {'decode s':>8} {'(capture)':>9} {'prefill s':>9} {'resume s':>8} "
          f"{'graphs':>6} {'other s':>7} {'decode steps':>12} {'ms/step':>7}")
    for name, r in results.items():
        c = r["rollout"]
        if c["threaded"]:
            print(f"{name:10} {c['calls']:5.0f} {c['call_s']:7.2f}   (a rollout thread of its own: no phases)")
            continue
        other = c["call_s"] - c["decode_s"] - c["prefill_s"] - c["resume_prefill_s"]
        per_step = 1e3 * (c["decode_s"] - c["capture_s"]) / c["decode_steps"] if c["decode_steps"] else 0.0
        print(f"{name:10} {c['calls']:5.0f} {c['call_s']:7.2f} {c['decode_s']:8.2f} {c['capture_s']:9.2f} "
              f"{c['prefill_s']:9.2f} {c['resume_prefill_s']:8.2f} {c['graph_captures']:6.0f} {other:7.2f} "
              f"{c['decode_steps']:12.0f} {per_step:7.2f}")


if __name__ == "__main__":
    main()
