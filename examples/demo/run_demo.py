"""``make demo``: watch RL with a verifiable reward fix what supervised learning copied from a sloppy
teacher -- on a CPU, in a few minutes, through the same command lines a GPU user types.

    python examples/demo/run_demo.py [--seed 0] [--output_dir demo_output]

The stages, each announced with a header and the exact command it runs:

1. data    the toy task (examples/demo/toy_task.py): reverse a digit string; the demonstrations come
           from a teacher that, on long strings, mostly stops one digit early
2. model   a small byte-level BPE tokenizer (one token per digit) and a random tiny Qwen2 model,
           built and saved locally
3. sft     ``python -m verl.trainer.fsdp_sft_trainer``: imitate the teacher, mistakes included
4. rl      ``python3 -m verl.trainer.main_ppo``: GRPO with the rule reward, Ray workers on CPU;
           greedy validation on held-out prompts before training and every few steps
5. export  ``python -m verl.model_merger merge``: the last actor checkpoint as a Hugging Face folder
6. plots   ``python -m verl.utils.plot``: PNG curves of the RL run
7. summary accuracy before/after RL, the reward curve, time per stage, where everything is

Everything is written under ``--output_dir``; a rerun starts from scratch there.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import toy_task  # examples/demo/toy_task.py, next to this file

from verl.rewards.scorers.reverse_digits import DATA_SOURCE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VAL_ACC = f"val-core/{DATA_SOURCE}/acc/mean@1"
VAL_TRUNCATED = f"val-aux/{DATA_SOURCE}/truncated/mean@1"


@dataclass
class Settings:
    """What the demo runs. The defaults are the ``make demo`` run; tests shrink them."""

    seed: int = 0
    output_dir: str = "demo_output"
    # task (see toy_task.py)
    n_train: int = 2000
    n_test: int = 200
    # model: ~0.36M parameters
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    # supervised warm start
    sft_epochs: int = 6
    sft_batch_size: int = 64
    sft_lr: float = 3e-3
    # GRPO
    rl_steps: int = 40
    rl_batch_size: int = 32  # prompts per step
    rl_n: int = 8  # samples per prompt
    rl_lr: float = 2e-4
    test_freq: int = 5
    trainer_mode: str = "sync"  # or colocate_async: generation streams across steps (trainer.v1.trainer_mode)
    max_off_policy_threshold: int = 2  # colocate_async: how many policy versions old a sample may be
    workers: int = 2  # Ray worker processes ("devices"); 2 beat 1 by ~15% on 2 cores
    started_at: float = 0.0  # Unix time the run began; make passes its own start, so the total includes setup


# ------------------------------------------------------------------------------------------ helpers
def stage(number: int, title: str) -> None:
    print(f"\n{'=' * 100}\n[{number}/7] {title}\n{'=' * 100}", flush=True)


def _compact_step_line(line: str, keys: dict[str, str]) -> str | None:
    """``step:12 - a/b:0.5 - ...`` (the trainers' console lines) -> ``step 12 | reward 0.5 | ...``."""
    if not line.startswith("step:"):
        return None
    fields = dict(item.split(":", 1) for item in line.strip().split(" - ") if ":" in item)
    parts = [f"step {fields['step']:>3}"] + [f"{label} {fields[key]}" for key, label in keys.items() if key in fields]
    return " | ".join(parts)


def run_cli(args: list[str], log_path: str, compact_keys: dict[str, str] | None = None,
            env: dict[str, str] | None = None) -> None:
    """Run a verl command line as a user would; its full output goes to ``log_path``.

    The trainers print one long line of metrics per step; those are shortened to the ``compact_keys``
    on the way to the terminal (the full lines stay in the log and the JSONL file). Their progress bar
    (stderr) reaches the terminal untouched.
    """
    cmd = [sys.executable, *args]
    shown = " ".join(shlex.quote(a) for a in ["python", *args]).replace(REPO + os.sep, "")  # it runs in REPO
    print("$ " + shown, flush=True)
    clear = "\r\x1b[K" if sys.stdout.isatty() else ""  # start a line over the child's progress bar
    with open(log_path, "w") as log, subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, text=True, bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}) as proc:
        for line in proc.stdout:
            log.write(line)
            short = _compact_step_line(line, compact_keys) if compact_keys else None
            print(clear + (short if short is not None else line.rstrip("\n")), flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"\nthis command failed (exit code {proc.returncode}); its output is in {log_path}")


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def sparkline(values: list[float], low: float = 0.0, high: float = 1.0) -> str:
    bars = "▁▂▃▄▅▆▇█"
    span = (high - low) or 1.0
    return "".join(bars[min(len(bars) - 1, max(0, int((v - low) / span * len(bars))))] for v in values)


def latest_step_dir(checkpoint_root: str) -> str:
    with open(os.path.join(checkpoint_root, "latest_checkpointed_iteration.txt")) as f:
        return os.path.join(checkpoint_root, f"global_step_{f.read().strip()}")


# ------------------------------------------------------------------------------------------ stages
def make_data(s: Settings, paths: dict) -> None:
    toy_task.main(["--local_dir", paths["data"], "--seed", str(s.seed),
                   "--n_train", str(s.n_train), "--n_test", str(s.n_test)])


def make_model(s: Settings, paths: dict) -> dict:
    """A byte-level BPE trained on the prompts (every digit stays one token) and a random Qwen2."""
    import pandas as pd
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from verl.utils.tiny_model import build_tiny_causal_lm, build_tiny_tokenizer

    hf_logging.disable_progress_bar()
    prompts = [m["content"] for chat in pd.read_parquet(paths["data"] + "/train.parquet")["prompt"] for m in chat]
    tokenizer_dir = build_tiny_tokenizer(os.path.join(paths["model"], "tokenizer"),
                                         corpus=prompts + ["user assistant"] * 100)
    build_tiny_causal_lm(paths["model"], tokenizer_dir, hidden_size=s.hidden_size, num_layers=s.num_layers,
                         num_heads=s.num_heads, num_kv_heads=s.num_heads, intermediate_size=s.intermediate_size,
                         seed=s.seed)
    tokenizer = AutoTokenizer.from_pretrained(paths["model"])
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(paths["model"]).parameters())
    sft = pd.read_parquet(paths["data"] + "/sft_train.parquet")
    prompt_len = max(len(tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                                 add_generation_prompt=True))["input_ids"])
                     for p in sft["prompt"])
    response_len = max(len(tokenizer(r + tokenizer.eos_token)["input_ids"]) for r in sft["response"])
    print(f"tokenizer: {len(tokenizer)} tokens; model: Qwen2, {s.num_layers} layers, hidden {s.hidden_size}, "
          f"{params / 1e6:.2f}M parameters -> {paths['model']}")
    print(f"longest prompt {prompt_len} tokens, longest answer {response_len} tokens (with <|im_end|>)")
    return {"params": params, "prompt_len": prompt_len, "response_len": response_len}


def run_sft(s: Settings, paths: dict, lengths: dict) -> str:
    run_cli([
        "-m", "verl.trainer.fsdp_sft_trainer",
        f"data.train_files={paths['data']}/sft_train.parquet",
        f"data.val_files={paths['data']}/sft_test.parquet",
        "data.prompt_key=prompt", "data.response_key=response",
        f"data.max_length={lengths['prompt_len'] + lengths['response_len']}",
        f"data.train_batch_size={s.sft_batch_size}", f"data.micro_batch_size_per_gpu={s.sft_batch_size}",
        f"model.partial_pretrain={paths['model']}", "model.enable_gradient_checkpointing=false",
        f"optim.lr={s.sft_lr}", "optim.lr_warmup_steps_ratio=0.05",
        "trainer.device=cpu", f"trainer.total_epochs={s.sft_epochs}", f"trainer.seed={s.seed}",
        f"trainer.default_local_dir={paths['sft']}", "trainer.logger=[console,file]",
        "trainer.project_name=demo", "trainer.experiment_name=sft",
    ], os.path.join(paths["sft"], "train.log"),
        compact_keys={"train/loss": "loss", "train/lr": "lr", "val/loss": "val loss"},
        # One torch thread: with two, a second busy process on a 2-core machine makes every step wait
        # for a descheduled thread (measured: 2x slower with one core busy, 15% faster when idle).
        env={"VERL_FILE_LOGGER_PATH": paths["sft_metrics"], "OMP_NUM_THREADS": "1"})
    return os.path.join(latest_step_dir(paths["sft"]), "huggingface")


def run_grpo(s: Settings, paths: dict, lengths: dict, sft_model: str) -> None:
    # Micro-batches are sized by tokens (packed forwards, the default): each rank's rows here are far
    # under the 16k-token budget, so one forward/backward per mini-batch.
    run_cli([
        "-m", "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={paths['data']}/train.parquet", f"data.val_files={paths['data']}/test.parquet",
        f"data.train_batch_size={s.rl_batch_size}", f"data.seed={s.seed}",
        # a little room beyond the longest prompt and answer, so a longer answer shows as wrong, not cut
        f"data.max_prompt_length={lengths['prompt_len'] + 2}", f"data.max_response_length={lengths['response_len'] + 1}",
        f"actor_rollout_ref.model.path={sft_model}", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        f"actor_rollout_ref.actor.optim.lr={s.rl_lr}", "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s.rl_batch_size // 2}",
        "actor_rollout_ref.actor.use_kl_loss=false", "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        f"actor_rollout_ref.rollout.n={s.rl_n}", f"actor_rollout_ref.rollout.seed={s.seed}",
        "trainer.backend=ray", "trainer.device=cpu", f"trainer.n_gpus_per_node={s.workers}", "trainer.nnodes=1",
        f"trainer.total_training_steps={s.rl_steps}", "trainer.val_before_train=true",
        f"trainer.test_freq={s.test_freq}", f"trainer.save_freq={s.rl_steps}", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={paths['rl_checkpoints']}", "trainer.logger=[console,file]",
        "trainer.project_name=demo", "trainer.experiment_name=grpo", f"trainer.v1.trainer_mode={s.trainer_mode}",
        *([f"trainer.v1.sampler.max_off_policy_threshold={s.max_off_policy_threshold}",
           # samples of older policy versions weighed by pi_old / pi_rollout (truncated), as the original advises
           "actor_rollout_ref.rollout.calculate_log_probs=true", "algorithm.rollout_correction.rollout_is=token"]
          if s.trainer_mode != "sync" else []),
    ], os.path.join(paths["rl"], "train.log"),
        compact_keys={"critic/score/mean": "reward", VAL_ACC: "held-out accuracy",
                      VAL_TRUNCATED: "held-out one digit short", "actor/entropy": "entropy", "timing_s/step": "s/step"},
        env={"VERL_FILE_LOGGER_PATH": paths["rl_metrics"]})


def export(paths: dict) -> None:
    actor = os.path.join(latest_step_dir(paths["rl_checkpoints"]), "actor")
    run_cli(["-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", actor,
             "--target_dir", paths["exported"], "--overwrite"], os.path.join(paths["rl"], "export.log"))


def plot(s: Settings, paths: dict) -> None:
    run_cli(["-m", "verl.utils.plot", paths["rl_metrics"], "--out", paths["plots"],
             "--title", f"make demo, seed {s.seed}: GRPO on {DATA_SOURCE} after a supervised warm start"],
            os.path.join(paths["plots"], "plot.log"))


def compare_answers(paths: dict, sft_model: str, count: int = 6) -> list[dict]:
    """Greedy answers of the SFT model and of the exported RL model to a few held-out prompts."""
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    test = pd.read_parquet(paths["data"] + "/test.parquet")
    rows = sorted(range(len(test)), key=lambda i: -len(test["extra_info"][i]["digits"]))[:count // 2]
    rows += [i for i in range(len(test)) if i not in rows][:count - len(rows)]
    tokenizer = AutoTokenizer.from_pretrained(paths["exported"])
    chats = [list(test["prompt"][i]) for i in rows]
    inputs = tokenizer.apply_chat_template(chats, add_generation_prompt=True, return_tensors="pt", padding=True,
                                           return_dict=True)
    answers = {}
    for name, folder in (("sft", sft_model), ("rl", paths["exported"])):
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=12, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        answers[name] = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return [{"prompt": chats[k][0]["content"], "answer": test["reward_model"][i]["ground_truth"],
             "sft": answers["sft"][k].strip(), "rl": answers["rl"][k].strip()} for k, i in enumerate(rows)]


# ------------------------------------------------------------------------------------------ summary
def _judge(answer: str, right: str) -> str:
    return f"{answer} " + ("ok" if answer == right else "(short)" if answer == right[:-1] else "wrong")


def summarize(s: Settings, paths: dict, timings: dict, examples: list[dict], model_info: dict,
              started_at: float) -> dict:
    records = read_jsonl(paths["rl_metrics"])
    val = [(r["step"], r["data"]) for r in records if VAL_ACC in r["data"]]
    (_, before), (last_step, after) = val[0], val[-1]
    rewards = [r["data"]["critic/score/mean"] for r in records if "critic/score/mean" in r["data"]]
    total = time.time() - started_at
    summary = {
        "seed": s.seed, "settings": asdict(s), "model_parameters": model_info["params"],
        "lengths": {k: model_info[k] for k in ("prompt_len", "response_len")},
        "accuracy_before_rl": before[VAL_ACC], "accuracy_after_rl": after[VAL_ACC],
        "truncated_before_rl": before.get(VAL_TRUNCATED), "truncated_after_rl": after.get(VAL_TRUNCATED),
        "validation_steps": [step for step, _ in val], "val_accuracy": [d[VAL_ACC] for _, d in val],
        "reward_per_step": rewards,
        "seconds": {k: round(v, 1) for k, v in timings.items()}, "total_seconds": round(total, 1),
        "examples": examples,
    }
    with open(paths["summary"], "w") as f:
        json.dump(summary, f, indent=2)

    def pct(x):
        return f"{100 * x:5.1f}%"

    print(f"Held-out accuracy (greedy, {s.n_test} prompts never trained on), seed {s.seed}:")
    print(f"  after the supervised warm start: {pct(before[VAL_ACC])}   "
          f"one digit short (the teacher's mistake): {pct(before.get(VAL_TRUNCATED, 0))}")
    print(f"  after {last_step:>3} GRPO steps:            {pct(after[VAL_ACC])}   "
          f"one digit short:                         {pct(after.get(VAL_TRUNCATED, 0))}")
    print(f"  change: {100 * (after[VAL_ACC] - before[VAL_ACC]):+.1f} points")
    print(f"\nReward per GRPO step (mean over {s.rl_batch_size}x{s.rl_n} samples, 0..1): "
          f"{rewards[0]:.2f} {sparkline(rewards)} {rewards[-1]:.2f}")
    print("\nGreedy answers to held-out prompts:")
    print(f"  {'prompt':<18}{'right answer':<14}{'after SFT':<20}after RL")
    for e in examples:
        print(f"  {e['prompt']:<18}{e['answer']:<14}{_judge(e['sft'], e['answer']):<20}{_judge(e['rl'], e['answer'])}")
    print("\nTime per stage: " + ", ".join(f"{k} {v:.0f}s" for k, v in summary["seconds"].items()))
    print(f"Total: {total / 60:.1f} min since the start" + (" (of make demo)" if s.started_at else ""))
    print("\nWhere everything is:")
    for label, key in (("task data (parquet)", "data"), ("initial tiny model + tokenizer", "model"),
                       ("SFT checkpoints", "sft"), ("RL actor checkpoints", "rl_checkpoints"),
                       ("RL model exported for Hugging Face", "exported"), ("RL metrics (JSONL)", "rl_metrics"),
                       ("SFT metrics (JSONL)", "sft_metrics"), ("plots", "plots"), ("this summary", "summary")):
        print(f"  {label:<36}{paths[key]}")
    print(f"\nOpen {os.path.join(paths['plots'], 'overview.png')} for the curves.")
    return summary


# ------------------------------------------------------------------------------------------ main
def output_paths(root: str) -> dict:
    root = os.path.abspath(root)
    rl = os.path.join(root, "rl")
    return {
        "root": root, "data": os.path.join(root, "data"), "model": os.path.join(root, "model_init"),
        "sft": os.path.join(root, "sft"), "sft_metrics": os.path.join(root, "sft", "metrics.jsonl"),
        "rl": rl, "rl_checkpoints": os.path.join(rl, "checkpoints"), "rl_metrics": os.path.join(rl, "metrics.jsonl"),
        "exported": os.path.join(root, "model_rl_hf"), "plots": os.path.join(root, "plots"),
        "summary": os.path.join(root, "summary.json"),
    }


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in asdict(Settings()).items():
        parser.add_argument(f"--{name}", type=type(default), default=default)
    return Settings(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> dict:
    s = parse_args(argv)
    started_at = s.started_at or time.time()
    paths = output_paths(s.output_dir)
    for key in ("data", "model", "sft", "rl", "exported", "plots"):  # a rerun starts from scratch
        shutil.rmtree(paths[key], ignore_errors=True)
    for key in ("data", "model", "sft", "rl", "plots"):
        os.makedirs(paths[key], exist_ok=True)
    timings: dict[str, float] = {}

    def timed(name, fn, *args):
        t0 = time.time()
        result = fn(*args)
        timings[name] = time.time() - t0
        return result

    stage(1, "Data: reverse a digit string; the teacher's demonstrations often stop one digit early")
    timed("data", make_data, s, paths)
    stage(2, "Model: a tokenizer and a random tiny Qwen2, built locally")
    model_info = timed("model", make_model, s, paths)
    stage(3, "Supervised warm start: imitate the teacher, mistakes included")
    sft_model = timed("sft", run_sft, s, paths, model_info)
    stage(4, f"GRPO: {s.rl_n} samples per prompt, reward 1 for the reversed string, {s.workers} Ray worker(s) on CPU")
    timed("rl", run_grpo, s, paths, model_info, sft_model)
    stage(5, "Export: the last actor checkpoint as a Hugging Face model")
    timed("export", export, paths)
    stage(6, "Plots of the RL run")
    timed("plots", plot, s, paths)
    stage(7, "Summary")
    examples = compare_answers(paths, sft_model)
    return summarize(s, paths, timings, examples, model_info, started_at)


if __name__ == "__main__":
    main()
