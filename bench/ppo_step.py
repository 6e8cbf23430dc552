"""Whole steps through the real CLI on one GPU: GRPO once per rollout engine, or the reference PPO shape.

    python3 bench/ppo_step.py --out /tmp/ppo_step [--engines native hf] [--steps 3]
    python3 bench/ppo_step.py --out /tmp/ppo_ref --shape reference [--steps 3] [--variant "NAME:key=value;..."]

``--shape reference`` is the original's GSM8K PPO quickstart at full size: GAE with a critic of the
same shape, the reference policy with KL in the reward (kl_coef 0.001), 256 prompts per step (GSM8K
questions, at most 512 prompt tokens), 256 response tokens (fixed length), mini-batch 64, the
quickstart's micro-batch keys (as for a user typing the quickstart, packed forwards then size the
micro-batches by tokens instead), a random Qwen2.5-0.5B-shaped model with the full 151,936-token
vocabulary. It prints ``perf/throughput`` (tokens of prompts and responses per second per GPU, the
original's definition) against the original's published single-GPU log for this shape (64.6 s per
step, about 1.05k tokens/s/GPU; the original cannot run here, so that number is quoted, not measured).
``--quick`` runs either shape tiny on the CPU to check the script.

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


ORIGINAL_REFERENCE = {"seconds_per_step": 64.6, "throughput": 1050.0}  # the original's published log (issue #9)


def prepare(out: str, vocab_size: int | None = None, rows: int = 0, quick: bool = False) -> tuple[str, str]:
    """GSM8K parquet (the fixture's questions repeated to ``rows`` rows when given), a tokenizer trained
    on them and a random Qwen2.5-0.5B-shaped model (its vocabulary: the tokenizer's, or ``vocab_size``)."""
    import pandas as pd

    from verl.utils.tiny_model import build_tiny_causal_lm, build_tiny_tokenizer

    data = os.path.join(out, "gsm8k")
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/gsm8k.py"), "--local_dataset_path",
                    os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k"), "--local_dir", data], check=True)
    frame = pd.read_parquet(os.path.join(data, "train.parquet"))
    if rows:
        frame = pd.concat([frame] * -(-rows // len(frame)), ignore_index=True).iloc[:rows]
        frame.to_parquet(os.path.join(data, "train.parquet"))
    prompts = [row[0]["content"] for row in frame["prompt"]]
    tokenizer = build_tiny_tokenizer(os.path.join(out, "tokenizer"), corpus=prompts)
    shape = ({"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}
             if quick else {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
                            "intermediate_size": 4864})
    extra = {"vocab_size": vocab_size, "tie_word_embeddings": True} if vocab_size else {}
    model = build_tiny_causal_lm(os.path.join(out, "model"), tokenizer, arch="qwen2", **shape, **extra)
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


def planned_peak_gib(command: list[str], device_gib: float | None) -> float:
    """The peak ``python -m verl.trainer.plan`` predicts for ``main_ppo <command>`` on a GPU of
    ``device_gib`` (default: this machine's), checkpointing resolved as the run resolves it."""
    from verl.trainer.config.spec import resolve_run
    from verl.trainer.config_validation import compose_ppo_config
    from verl.trainer.plan import GIB, device_memory, plan_memory

    config = compose_ppo_config(command)
    device = int(device_gib * GIB) if device_gib else device_memory(config.trainer.device)
    spec = resolve_run(config, log=lambda _: None, device_bytes=device)
    return plan_memory(spec, device).peak / GIB


def reference_command(out: str, steps: int, backend: str, quick: bool) -> list[str]:
    """``main_ppo`` overrides of the reference PPO shape (builds its data and model under ``out``)."""
    batch = 8 if quick else 256
    data, model = prepare(out, vocab_size=None if quick else 151936, rows=batch * steps, quick=quick)
    return [
        f"data.train_files={data}/train.parquet", f"data.train_batch_size={batch}",
        "data.max_prompt_length=512", f"data.max_response_length={16 if quick else 256}",
        "data.truncation=left", f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6", "critic.optim.lr=1e-5",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch // 4}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "actor_rollout_ref.rollout.ignore_eos=True",
        f"actor_rollout_ref.rollout.name={'hf' if quick else 'native'}",
        "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=['console','file']", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
        f"trainer.device={'cpu' if quick else 'cuda'}", "trainer.experiment_name=bench_reference",
        "trainer.resume_mode=disable", f"trainer.backend={backend}",
    ]


def run_reference(out: str, steps: int, backend: str, quick: bool, variants: dict[str, list[str]],
                  plan_only: bool = False, device_gib: float | None = None) -> None:
    """The reference PPO shape (see the module docstring), once per variant (extra overrides); prints
    each beside the original's log, with the memory estimate's peak beside the measured one."""
    overrides = reference_command(out, steps, backend, quick)
    planned = {name: planned_peak_gib(overrides + extra, device_gib) for name, extra in variants.items()}
    if plan_only:
        for name, gib in planned.items():
            print(f"{name}: planned peak {gib:.2f} GiB")
        return
    results = {}
    for name, extra in variants.items():
        steps_metrics = run_main_ppo(overrides + extra, os.path.join(out, f"reference_{name}.jsonl"), out)[1:]
        results[name] = {key: sum(s.get(key, 0.0) for s in steps_metrics) / len(steps_metrics)  # step 1 warms up
                         for key in steps_metrics[0] if key.startswith(("timing_s/", "perf/"))}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"ours": results, "overrides": variants, "original_published": ORIGINAL_REFERENCE}, f, indent=1)
    print("\nreference PPO shape, mean over steps 2..N")
    print(f"{'':34}{'s/step':>10}{'tokens/s/GPU':>14}")
    print(f"{'original (published log, quoted)':34}{ORIGINAL_REFERENCE['seconds_per_step']:10.2f}"
          f"{ORIGINAL_REFERENCE['throughput']:14.0f}")
    for name, mean in results.items():
        print(f"{'ours: ' + name:34}{mean['timing_s/step']:10.2f}{mean['perf/throughput']:14.0f}   "
              f"{mean['perf/throughput'] / ORIGINAL_REFERENCE['throughput']:.1f}x")
        print("    stages (s): " + ", ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in mean.items()
                                           if k.startswith("timing_s/")))
        print(f"    peak GiB {mean.get('perf/max_memory_allocated_gb', 0.0):.2f} (planned {planned[name]:.2f}), "
              f"mfu actor {mean.get('perf/mfu/actor', 0.0):.3f}, critic {mean.get('perf/mfu/critic', 0.0):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--engines", nargs="+", default=["native", "hf"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--backend", choices=["ray", "local"], default="ray")
    parser.add_argument("--shape", choices=["grpo", "reference"], default="grpo")
    parser.add_argument("--quick", action="store_true", help="with --shape reference: tiny, on the CPU")
    parser.add_argument("--variant", action="append", default=[],
                        help="with --shape reference: NAME:key=value;key=value, one run per --variant "
                             "(default: one run, 'defaults')")
    parser.add_argument("--plan-only", action="store_true",
                        help="with --shape reference: print each variant's estimated peak and stop (no GPU needed)")
    parser.add_argument("--device-gib", type=float, help="the GPU size the estimate assumes (default: this one's)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.shape == "reference":
        variants = {"defaults": []} if not args.variant else {}
        for spec in args.variant:
            name, _, extra = spec.partition(":")
            variants[name] = [o for o in extra.split(";") if o]
        run_reference(args.out, args.steps, args.backend, args.quick, variants, args.plan_only, args.device_gib)
        return
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
