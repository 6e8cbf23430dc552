"""GRPO against a peer: TRL's ``GRPOTrainer`` and ``python3 -m verl.trainer.main_ppo`` on one workload, same run.

    python3 bench/peer_grpo.py --out /tmp/peer [--steps 5] [--variant 'NAME:key=value;key=value' ...]
    python3 bench/peer_grpo.py --out /tmp/peer --quick        # a tiny CPU dry run of the script

The workload, identical for both:
- one random-weight model folder of the Qwen2.5-0.5B shape (24 layers, hidden 896, 14/2 heads,
  intermediate 4864, the full 151,936 vocabulary, tied embeddings) with a small BPE tokenizer;
- 64 prompts of about 380 tokens (GSM8K questions of the bundled fixture, concatenated, as one chat
  user turn; the fixture's 12 questions make 6 distinct prompts, which leaves the timing alone: lengths are
  forced and neither side caches by content) x 4 generations, completions forced to 256 tokens (TRL: ``min_new_tokens``; ours:
  ``ignore_eos``), temperature 1, no top-k/top-p;
- KL to the reference policy with beta 0.001 (k3), one optimizer step per batch of 256 completions,
  micro-batch 16, lr 1e-6, bf16 compute; gradient checkpointing on for TRL, as its users run it;
- a cheap non-constant rule reward: the decoded completion's length in characters / 100 (the random
  model samples from 151,936 ids, of which only the tokenizer's 512 decode to text).

Each runs ``--steps`` optimizer steps in its own process; reported: the median seconds per step after
the first, tokens/s counted the same way for both ((real prompt tokens + completion tokens) / step
time), peak GPU memory (``torch.cuda.max_memory_allocated``; ours: the largest
``perf/max_memory_allocated_gb`` of its workers), and the ratio. Ours also prints its stage timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS, GENERATIONS, PROMPT_TOKENS, COMPLETION, MICRO, BETA, LR = 64, 4, 380, 256, 16, 0.001, 1e-6
REWARD = '''
def decoded_length(text):
    return len(text) / 100.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return decoded_length(solution_str)
'''


def prepare(out: str, quick: bool) -> dict:
    """The model folder, the prompts (TRL's jsonl and ours parquet), the reward file; returns their paths
    and the real prompt token counts."""
    import pandas as pd

    sys.path.insert(0, REPO)
    from transformers import AutoTokenizer

    from verl.utils.tiny_model import build_tiny_causal_lm, build_tiny_tokenizer

    fixture = os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k/main/train-00000-of-00001.parquet")
    questions = list(pd.read_parquet(fixture)["question"])
    tokenizer_dir = build_tiny_tokenizer(os.path.join(out, "tokenizer"), corpus=questions)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape = ({"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}
             if quick else {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
                            "intermediate_size": 4864})
    model = build_tiny_causal_lm(os.path.join(out, "model"), tokenizer_dir, arch="qwen2", vocab_size=151936,
                                 tie_word_embeddings=True, **shape)
    prompts, lengths = pack_questions(tokenizer, questions, 8 if quick else PROMPTS, 48 if quick else PROMPT_TOKENS)
    write_prompts(prompts, "peer_bench", os.path.join(out, "train.parquet"))
    with open(os.path.join(out, "prompts.json"), "w") as f:
        json.dump(prompts, f)
    with open(os.path.join(out, "reward.py"), "w") as f:
        f.write(REWARD)
    return {"model": model, "prompt_tokens": lengths}


# ------------------------------------------------------------------------------------------------ TRL
def run_trl(out: str, steps: int, quick: bool) -> None:
    """In its own process (``--_trl``): TRL's GRPOTrainer on the workload; writes trl.json."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, out)
    from reward import decoded_length

    with open(os.path.join(out, "prompts.json")) as f:
        prompts = json.load(f)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    completion = 16 if quick else COMPLETION
    micro = 4 if quick else MICRO

    def reward(completions, **kwargs):
        return [decoded_length(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    step_times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            step_times.append(time.perf_counter() - self.start)

    batch = len(prompts) * GENERATIONS
    config = GRPOConfig(
        output_dir=os.path.join(out, "trl_out"), per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro, generation_batch_size=batch, num_generations=GENERATIONS,
        max_completion_length=completion, generation_kwargs={"min_new_tokens": completion},
        temperature=1.0, top_p=1.0, top_k=0, beta=BETA, num_iterations=1, learning_rate=LR,
        bf16=torch.cuda.is_available(), gradient_checkpointing=True, max_steps=steps, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=not torch.cuda.is_available(), seed=0)
    trainer = GRPOTrainer(model=os.path.join(out, "model"), reward_funcs=reward, args=config, train_dataset=dataset,
                          callbacks=[Timer()])
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    with open(os.path.join(out, "trl.json"), "w") as f:
        json.dump({"step_seconds": step_times, "peak_gib": peak}, f)


# ------------------------------------------------------------------------------------------------ ours
def run_ours(out: str, steps: int, quick: bool, max_prompt: int, overrides: list[str]) -> list[dict]:
    sys.path.insert(0, REPO)
    from bench.ppo_step import run_main_ppo

    return run_main_ppo(ours_command(out, steps, quick, max_prompt, overrides), os.path.join(out, "ours.jsonl"), out)


def planned_gib(out: str, quick: bool, max_prompt: int, overrides: list[str], device_gib: float | None) -> float:
    """The peak ``python -m verl.trainer.plan`` predicts for this run (checkpointing resolved as the run does)."""
    sys.path.insert(0, REPO)
    from bench.ppo_step import planned_peak_gib

    return planned_peak_gib(ours_command(out, 1, quick, max_prompt, overrides), device_gib)


def prompt_length(tokenizer, text: str) -> int:
    """Tokens of ``text`` as one chat user turn with the generation prompt (what the dataset feeds the model)."""
    return len(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"])


def pack_questions(tokenizer, questions: list[str], count: int, target: int) -> tuple[list[str], list[int]]:
    """``count`` prompts, each of consecutive ``questions`` (cycled) added while the chat-templated prompt stays
    within ``target`` tokens (one question at least), and their lengths in tokens."""
    prompts, lengths, cursor = [], [], 0
    for _ in range(count):
        text, length = "", 0
        while True:
            candidate = (text + " " + questions[cursor % len(questions)]).strip()
            n = prompt_length(tokenizer, candidate)
            if n > target and text:
                break
            text, length, cursor = candidate, n, cursor + 1
        prompts.append(text)
        lengths.append(length)
    return prompts, lengths


def numbered_prompts(tokenizer, questions: list[str], count: int, target: int) -> tuple[list[str], list[int]]:
    """``count`` distinct prompts: :func:`pack_questions` within ``target - 16`` tokens (room for the number),
    each numbered ("Problem {i}. "), since the fixture's few questions repeat; and their lengths in tokens."""
    packed, _ = pack_questions(tokenizer, questions, count, target - 16)
    prompts = [f"Problem {i}. {text}" for i, text in enumerate(packed)]
    return prompts, [prompt_length(tokenizer, p) for p in prompts]


def write_prompts(prompts: list[str], data_source: str, path: str) -> None:
    """The prompts as a training parquet (verl's schema; an empty ground truth for the benchmark's reward)."""
    import pandas as pd

    rows = [{"data_source": data_source, "prompt": [{"role": "user", "content": p}], "ability": "bench",
             "reward_model": {"style": "rule", "ground_truth": ""}, "extra_info": {"index": i}}
            for i, p in enumerate(prompts)]
    pd.DataFrame(rows).to_parquet(path)


def ours_command(out: str, steps: int, quick: bool, max_prompt: int, overrides: list[str]) -> list[str]:
    micro = 4 if quick else MICRO
    gpu = not quick
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={out}/train.parquet", f"data.train_batch_size={8 if quick else PROMPTS}",
        f"data.max_prompt_length={max_prompt}", f"data.max_response_length={16 if quick else COMPLETION}",
        f"actor_rollout_ref.model.path={out}/model", f"actor_rollout_ref.actor.optim.lr={LR}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={8 if quick else PROMPTS}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.use_kl_loss=True", f"actor_rollout_ref.actor.kl_loss_coef={BETA}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", f"actor_rollout_ref.rollout.n={GENERATIONS}",
        "actor_rollout_ref.rollout.ignore_eos=True", f"actor_rollout_ref.rollout.name={'native' if gpu else 'hf'}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.top_p=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={4 * micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={4 * micro}",
        f"custom_reward_function.path={out}/reward.py", "custom_reward_function.name=compute_score",
        "trainer.logger=['console','file']", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
        f"trainer.device={'cuda' if gpu else 'cpu'}", "trainer.experiment_name=peer_grpo",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={out}/ckpt", *overrides,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-trl", action="store_true", help="ours only (e.g. to compare settings)")
    parser.add_argument("--ours-override", action="append", default=[], help="an extra main_ppo override (all runs)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:key=value;key=value -- one run of ours per --variant (default: one run, 'ours')")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the memory estimate of each variant and stop (no GPU needed)")
    parser.add_argument("--device-gib", type=float, help="with --plan-only: the GPU size to plan for (GiB)")
    parser.add_argument("--_trl", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out = os.path.abspath(args.out)
    if args._trl:
        run_trl(args.out, args.steps, args.quick)
        return
    os.makedirs(args.out, exist_ok=True)
    prepared = prepare(args.out, args.quick)
    prompt_tokens = sum(prepared["prompt_tokens"]) * GENERATIONS
    completion_tokens = len(prepared["prompt_tokens"]) * GENERATIONS * (16 if args.quick else COMPLETION)
    tokens = prompt_tokens + completion_tokens
    print(f"workload: {len(prepared['prompt_tokens'])} prompts x {GENERATIONS}, prompt tokens "
          f"{min(prepared['prompt_tokens'])}..{max(prepared['prompt_tokens'])} (mean "
          f"{statistics.mean(prepared['prompt_tokens']):.0f}), {tokens} tokens per step", flush=True)

    results = {"tokens_per_step": tokens}
    variants = {"ours": []} if not args.variant else {}
    for spec in args.variant:
        name, _, overrides = spec.partition(":")
        variants[name] = [o for o in overrides.split(";") if o]
    if args.plan_only:
        for name, overrides in variants.items():
            gib = planned_gib(args.out, args.quick, max(prepared["prompt_tokens"]), args.ours_override + overrides,
                              args.device_gib)
            print(f"{name:12} planned peak {gib:6.2f} GiB")
        return
    for name, overrides in variants.items():
        steps = run_ours(args.out, args.steps, args.quick, max(prepared["prompt_tokens"]),
                         args.ours_override + overrides)[1:]
        stages = sorted({k for s in steps for k in s if k.startswith("timing_s/")})
        seconds = statistics.median(s["timing_s/step"] for s in steps)
        results[name] = {"seconds": seconds, "tokens_per_s": tokens / seconds, "overrides": overrides,
                         "peak_gib": max(s.get("perf/max_memory_allocated_gb", 0.0) for s in steps),
                         "mfu_actor": statistics.median(s.get("perf/mfu/actor", 0.0) for s in steps),
                         "stages": {k: statistics.median(s[k] for s in steps) for k in stages},
                         "planned_gib": planned_gib(args.out, args.quick, max(prepared["prompt_tokens"]),
                                                    args.ours_override + overrides, None),
                         "score_mean": steps[-1].get("critic/score/mean")}
    if not args.skip_trl:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out, "--steps", str(args.steps),
                        "--_trl"] + (["--quick"] if args.quick else []), check=True)
        with open(os.path.join(args.out, "trl.json")) as f:
            trl = json.load(f)
        trl_seconds = statistics.median(trl["step_seconds"][1:])
        results["trl"] = {"seconds": trl_seconds, "tokens_per_s": tokens / trl_seconds, "peak_gib": trl["peak_gib"],
                          "step_seconds": trl["step_seconds"]}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)

    print("\nmedian over steps 2..N")
    print(f"{'':12} {'s/step':>8} {'tokens/s':>10} {'peak GiB':>9} {'planned':>8} {'vs TRL':>7}")
    for name in ["trl", *variants]:
        if name in results:
            r = results[name]
            ratio = f"{results['trl']['seconds'] / r['seconds']:6.2f}x" if "trl" in results else ""
            planned = f"{r['planned_gib']:8.2f}" if "planned_gib" in r else f"{'':8}"
            print(f"{name:12} {r['seconds']:8.2f} {r['tokens_per_s']:10.0f} {r['peak_gib']:9.2f} {planned} {ratio:>7}")
    for name in variants:
        r = results[name]
        print(f"{name} ({' '.join(r['overrides']) or 'defaults'}): perf/mfu/actor {r['mfu_actor']:.3f}; stages (s): "
              + ", ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in r["stages"].items()))


if __name__ == "__main__":
    main()
