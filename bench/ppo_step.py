"""A GRPO run on one GPU through the real CLI, once per rollout engine, to compare whole steps.

    python3 bench/ppo_step.py --out /tmp/ppo_step [--engines native hf] [--steps 3]

Builds the GSM8K sample with the real preprocessing script, a tokenizer trained on its prompts, and a
random model of the Qwen2.5-0.5B shape (24 layers, hidden 896, 14/2 heads, intermediate 4864; the
vocabulary is the tokenizer's 512 tokens, so the logits are cheap and everything else is full size).
Then it runs ``python3 -m verl.trainer.main_ppo`` (Ray or the local backend, one GPU, GRPO with KL loss, 8 prompts x 8
samples, 256 response tokens at fixed length) for each engine and prints the per-stage timings of the
steps after the first (which includes CUDA-graph capture and allocator warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "step")


def prepare(out: str) -> tuple[str, str]:
    import pandas as pd

    from verl.utils.tiny_model import build_tiny_causal_lm, build_tiny_tokenizer

    data = os.path.join(out, "gsm8k")
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/gsm8k.py"), "--local_dataset_path",
                    os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k"), "--local_dir", data], check=True)
    prompts = [row[0]["content"] for row in pd.read_parquet(os.path.join(data, "train.parquet"))["prompt"]]
    tokenizer = build_tiny_tokenizer(os.path.join(out, "tokenizer"), corpus=prompts)
    model = build_tiny_causal_lm(os.path.join(out, "model"), tokenizer, arch="qwen2", hidden_size=896, num_layers=24,
                                 num_heads=14, num_kv_heads=2, intermediate_size=4864)
    return data, model


def run_main_ppo(overrides: list[str], metrics_file: str, cwd: str) -> list[dict]:
    """``python3 -m verl.trainer.main_ppo <overrides>`` in a subprocess with the file logger writing to
    ``metrics_file`` (replaced); returns each step's metrics."""
    if os.path.exists(metrics_file):
        os.remove(metrics_file)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": metrics_file, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], check=True, env=env, cwd=cwd)
    with open(metrics_file) as f:
        return [json.loads(line)["data"] for line in f]


def run(engine: str, data: str, model: str, out: str, steps: int, backend: str) -> list[dict]:
    overrides = [
        f"data.train_files={data}/train.parquet", "data.train_batch_size=8",
        "data.max_prompt_length=128", "data.max_response_length=256",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=True", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.ignore_eos=True",
        f"actor_rollout_ref.rollout.name={engine}", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
        "trainer.logger=['console','file']", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
        "trainer.device=cuda", f"trainer.experiment_name=bench_{engine}", "trainer.resume_mode=disable",
        f"trainer.backend={backend}",
    ]
    return run_main_ppo(overrides, os.path.join(out, f"{engine}.jsonl"), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--engines", nargs="+", default=["native", "hf"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--backend", choices=["ray", "local"], default="ray")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data, model = prepare(args.out)
    results = {}
    for engine in args.engines:
        steps = run(engine, data, model, args.out, args.steps, args.backend)[1:]  # step 1 warms up
        results[engine] = {stage: sum(s[f"timing_s/{stage}"] for s in steps) / len(steps) for stage in STAGES}
        results[engine]["perf/throughput"] = sum(s["perf/throughput"] for s in steps) / len(steps)
        results[engine]["perf/max_memory_allocated_gb"] = max(s["perf/max_memory_allocated_gb"] for s in steps)
        results[engine]["critic/score/mean"] = steps[-1]["critic/score/mean"]
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\nmean over steps 2..N (seconds, except throughput tokens/s/GPU and memory GiB)")
    keys = [f"timing_s/{s}" for s in STAGES] + ["perf/throughput", "perf/max_memory_allocated_gb"]
    print(f"{'metric':32}" + "".join(f"{e:>12}" for e in results))
    for key in keys:
        name = key.split("/", 1)[1] if key.startswith("timing_s/") else key
        row = [results[e][name if key.startswith('timing_s/') else key] for e in results]
        print(f"{key:32}" + "".join(f"{v:12.3f}" for v in row))
    if "native" in results and "hf" in results:
        print(f"\ngen speed-up native/hf: {results['hf']['gen'] / results['native']['gen']:.2f}x; "
              f"step speed-up: {results['hf']['step'] / results['native']['step']:.2f}x")


if __name__ == "__main__":
    main()
