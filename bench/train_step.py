"""The actor update alone: our FSDP2 actor against a plain transformers fwd+bwd+AdamW loop, same run.

    python3 bench/train_step.py --json results.json     # on the GPU machine
    python3 bench/train_step.py --quick                 # a tiny CPU dry run of the script

Qwen2.5-0.5B architecture (24 layers, hidden 896, 14/2 heads, intermediate 4864, vocab 151,936, tied
embeddings), random weights, fp32 master weights and bf16 compute for both. One optimizer step over
``--rows`` sequences in micro-batches of ``--micro`` rows, two workloads:

- ``dense``: every sequence 768 real tokens (512 prompt + 256 response), no padding;
- ``ragged``: prompts of 128..512 tokens left-padded to 512, responses of 64..256 tokens right-padded
  to 256 (a GRPO batch after generation).

Baseline: ``model(input_ids, attention_mask, labels)`` (transformers' loss over the full logits)
with gradient checkpointing, autocast bf16, ``torch.optim.AdamW``, as a user of transformers writes it.
Ours: ``DataParallelPPOActor.update_policy`` (PPO loss, log-probs of the response tokens, on-policy)
in each configuration listed in VARIANTS. Prints seconds per step, tokens/s (real tokens), MFU by the
trainer's ``perf/mfu/actor`` convention (verl.utils.flops_counter) and peak memory; the median of
``--steps`` steps after one warm-up step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformers import AutoModelForCausalLM, Qwen2Config

from bench.rollout import QUICK, QWEN25_05B
from verl.models.loader import attention_implementation
from verl.protocol import DataProto
from verl.trainer.plan import GIB, model_shape, training_components
from verl.utils.flops_counter import FlopsCounter
from verl.workers.actor import DataParallelPPOActor
from verl.workers.engine import FSDPEngine

# name -> (use_remove_padding, gradient checkpointing, optimizer overrides, log-prob kernel, fsdp_config).
# "before": what the actor ran before padding-free forwards, the Triton log-prob kernel and fused AdamW.
VARIANTS = {
    "before(padded+ckpt)": (False, True, {"fused": False}, "torch", {}),
    "packed+ckpt": (True, True, {}, "auto", {}),
    "packed": (True, False, {}, "auto", {}),
    "packed,torch_logprob": (True, False, {}, "torch", {}),
    "packed+ckpt,keep_params": (True, True, {}, "auto", {"reshard_after_forward": False}),
    "packed,keep_params": (True, False, {}, "auto", {"reshard_after_forward": False}),
    "packed+ckpt,compiled": (True, True, {}, "auto", {"compile": True}),
    "packed,compiled": (True, False, {}, "auto", {"compile": True}),
}
PROMPT, RESPONSE = 512, 256


def make_batch(rows: int, vocab: int, ragged: bool, device, prompt: int = PROMPT, response: int = RESPONSE):
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (rows, prompt + response), generator=generator)
    mask = torch.ones_like(input_ids)
    if ragged:
        prompt_lens = torch.randint(prompt // 4, prompt + 1, (rows,), generator=generator)
        response_lens = torch.randint(response // 4, response + 1, (rows,), generator=generator)
        cols = torch.arange(prompt + response)
        mask = ((cols >= prompt - prompt_lens[:, None]) & (cols < prompt + response_lens[:, None])).long()
    response_mask = mask[:, -response:]
    batch = {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
             "responses": input_ids[:, -response:], "response_mask": response_mask,
             "advantages": torch.randn(rows, response, generator=generator) * response_mask}
    return DataProto.from_dict({k: v.to(device) for k, v in batch.items()})


def timed(fn, steps: int, device) -> tuple[float, float]:
    """Median seconds of ``steps`` calls after one warm-up call, and the peak memory in GiB."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    return statistics.median(times), peak


def baseline(config: Qwen2Config, data: DataProto, micro: int, steps: int, device):
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).to(device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    micros = data.split(micro)

    def step():
        for m in micros:
            labels = m.batch["input_ids"].masked_fill(m.batch["attention_mask"] == 0, -100)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = model(input_ids=m.batch["input_ids"], attention_mask=m.batch["attention_mask"],
                             position_ids=m.batch["position_ids"], labels=labels).loss
            (loss / len(micros)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed(step, steps, device)  # the model and optimizer are freed on return


def build_actor(config: Qwen2Config, data: DataProto, micro: int, device, variant: str) -> DataParallelPPOActor:
    remove_padding, checkpointing, optim_overrides, kernel, fsdp_overrides = VARIANTS[variant]
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention_implementation(remove_padding),
                                             dtype=torch.float32)
    optim = {"lr": 1e-6, "total_training_steps": 100, "override_optimizer_config": optim_overrides}
    fsdp_config = {"dtype": "bfloat16" if device.type == "cuda" else "float32", **fsdp_overrides}
    engine = FSDPEngine(model, fsdp_config=fsdp_config, optim_config=optim, compile_layers="compile" in fsdp_config,
                        enable_gradient_checkpointing=checkpointing, device=device)
    return DataParallelPPOActor({"ppo_epochs": 1, "clip_ratio": 0.2, "loss_agg_mode": "token-mean"}, engine,
                                mini_batch_size=len(data), micro_batch_size=micro, remove_padding=remove_padding,
                                logprob_kernel=kernel)


def ours(config: Qwen2Config, data: DataProto, micro: int, steps: int, device, variant: str):
    actor = build_actor(config, data, micro, device, variant)
    return timed(lambda: actor.update_policy(data, temperature=1.0), steps, device)


def planned_gib(shape, data: DataProto, micro: int, variant: str, device) -> float:
    """The actor-update peak verl.trainer.plan predicts for this case: its largest micro-batch, packed
    (real tokens) or padded (rows x width)."""
    remove_padding, checkpointing, _, _, fsdp_overrides = VARIANTS[variant]
    mask = data.batch["attention_mask"]
    tokens = max(int(mask[i:i + micro].sum()) if remove_padding else mask[i:i + micro].numel()
                 for i in range(0, len(data), micro))
    parts = training_components(shape, tokens, checkpointing=checkpointing,
                                compiled="compile" in fsdp_overrides and device.type == "cuda")
    return sum(parts.values()) / GIB


def profile(config: Qwen2Config, data: DataProto, micro: int, device, variant: str) -> None:
    """One warm-up update, then one under torch.profiler: the kernels that took the most device time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    actor = build_actor(config, data, micro, device, variant)
    actor.update_policy(data, temperature=1.0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        actor.update_policy(data, temperature=1.0)
        if device.type == "cuda":
            torch.cuda.synchronize()
    averages = prof.key_averages()
    tables = []
    if device.type == "cuda":
        tables.append(averages.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70))
    # Where the host time goes (inclusive, so module-level ops show above the kernels they launch).
    tables.append(averages.table(sort_by="cpu_time_total", row_limit=40, max_name_column_width=70))
    table = "\n\n".join(tables)
    print(table)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro", type=int, nargs="+", default=[16], help="micro-batch rows; several: a sweep")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--quick", action="store_true", help="tiny model on the CPU: checks the script runs")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--profile", choices=list(VARIANTS),
                        help="profile one step of this variant on the ragged workload and print the top kernels")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    config = Qwen2Config(**(QUICK if args.quick else QWEN25_05B))
    prompt, response = (24, 8) if args.quick else (PROMPT, RESPONSE)
    rows = 8 if args.quick else args.rows
    micros = [4] if args.quick else args.micro
    init = f"file://{tempfile.mkdtemp()}/pg"
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init, rank=0, world_size=1,
                            timeout=datetime.timedelta(minutes=10))
    if device.type == "cuda":
        torch.cuda.set_device(0)
    counter = FlopsCounter(config, device_name=None if device.type == "cuda" else "cpu")
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "rows": rows, "micro": micros, "cases": {}}
    with tempfile.TemporaryDirectory() as folder:  # the planner reads a model folder's config
        config.save_pretrained(folder)
        shape = model_shape(folder, config_key="bench/train_step.py's model")
    print(f"{'workload':8} {'run':24} {'s/step':>8} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9} {'planned':>8} "
          f"{'vs baseline':>12}")
    if args.profile:
        table = profile(config, make_batch(rows, config.vocab_size, True, device, prompt, response), micros[0],
                        device, args.profile)
        if args.json:
            with open(args.json, "w") as f:
                f.write(table)
        dist.destroy_process_group()
        return
    for workload, micro in ((w, m) for w in ("dense", "ragged") for m in micros):
        data = make_batch(rows, config.vocab_size, workload == "ragged", device, prompt, response)
        seqlens = data.batch["attention_mask"].sum(-1).tolist()
        tokens = sum(seqlens)
        runs = {"baseline": lambda: baseline(config, data, micro, args.steps, device)}
        for variant in args.variants:
            runs[variant] = lambda variant=variant: ours(config, data, micro, args.steps, device, variant)
        base_seconds = None
        if len(micros) > 1:
            workload = f"{workload}/micro{micro}"
        for name, run in runs.items():
            seconds, peak = run()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            achieved, promised = counter.estimate_flops(seqlens, seconds)
            mfu = achieved / promised if promised != float("inf") else 0.0
            base_seconds = base_seconds or seconds
            planned = planned_gib(shape, data, micro, name, device) if name in VARIANTS else None
            results["cases"][f"{workload}/{name}"] = {"seconds": seconds, "tokens_per_s": tokens / seconds,
                                                      "mfu": mfu, "peak_gib": peak, "tokens": tokens,
                                                      "planned_gib": planned}
            print(f"{workload:8} {name:24} {seconds:8.3f} {tokens / seconds:10.0f} {mfu:6.1%} {peak:9.2f} "
                  f"{'' if planned is None else f'{planned:8.2f}':>8} {base_seconds / seconds:11.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
