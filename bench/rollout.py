"""Rollout speed: the native engine against transformers ``generate``, same model, same run.

Shapes (``--shape``), random bf16 weights built on the GPU:

- ``qwen2.5-0.5b`` (default): the Qwen2.5-0.5B architecture (24 layers, hidden 896, 14/2 heads, intermediate
  4864, vocab 151,936, tied embeddings).
- ``qwen3-moe``: the Qwen3-30B-A3B layer shape cut to 24 of its 48 layers so that both engines fit one 80 GB GPU
  (hidden 2048, 32/4 heads of 128, 128 experts, top-8 renormalised, moe_intermediate 768, vocab 151,936, untied
  embeddings): 15.6B parameters (31 GB), 2.0B of them used per token. transformers runs its default experts
  implementation (``grouped_mm`` in 5.x; printed).
- ``gemma2-2b``: the Gemma-2-2B architecture (26 layers, hidden 2304, 8/4 heads of 256, GeGLU intermediate 9216,
  vocab 256,000, tied embeddings, attention soft-cap 50 and final soft-cap 30, sliding window 4096 on alternate
  layers); transformers runs it with eager attention (SDPA cannot soft-cap), ours with its explicit soft-capped
  attention.

Prompts of 384 random tokens, 256 response tokens at fixed length (no eos), pure sampling (temperature 1, top_k 0,
top_p 1) for both engines, plus ours with top_k 50 / top_p 0.9 and ours without CUDA graphs, and for the
n=8 case ours with each row reading its own copy of its prompt (the decode attention shares it otherwise).

    python3 bench/rollout.py --json results.json                     # on the GPU machine
    python3 bench/rollout.py --shape qwen3-moe --json moe.json
    python3 bench/rollout.py --shape gemma2-2b --json gemma.json
    python3 bench/rollout.py --quick [--shape ...]                   # a tiny CPU dry run of the script

Each case warms both engines at its own shape first: ours is timed as the better of two calls, the first
warming it (Triton compiles a kernel on first use); ``generate`` as one call after an 8-token call at the same
batch (before 2026-12-08 it had only the first-of-all warm-up, at 8 rows).

Prints per case: tokens/s of each engine (response tokens / wall time of the whole call: prefill,
decode, graph capture, output assembly), their ratio, peak memory, and the fraction of the decode
roofline: bytes one decode step must move (every weight once — of a mixture of experts, the experts
that the step's ``rows * top_k`` uniform draws are expected to hit — + the keys/values in context)
over 4.8 TB/s, summed over the steps.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformers import AutoModelForCausalLM, Gemma2Config, GenerationConfig, Qwen2Config, Qwen3MoeConfig

from verl.protocol import DataProto
from verl.workers.rollout import NativeRollout

HBM_BYTES_PER_S = 4.8e12
QWEN25_05B = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
              "rope_theta": 1000000.0, "tie_word_embeddings": True, "max_position_embeddings": 32768}
QUICK = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
         "max_position_embeddings": 4096}
QWEN3_MOE = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
             "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True, "rms_norm_eps": 1e-06,
             "rope_theta": 1000000.0, "tie_word_embeddings": False, "max_position_embeddings": 40960}
QWEN3_MOE_QUICK = {**QUICK, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "norm_topk_prob": True}
GEMMA2_2B = {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
             "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
             "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
             "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
             "max_position_embeddings": 8192}
GEMMA2_QUICK = {**QUICK, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8,
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
# name: (config class, GPU shape, --quick shape, transformers' attention)
SHAPES = {"qwen2.5-0.5b": (Qwen2Config, QWEN25_05B, QUICK, "sdpa"),
          "qwen3-moe": (Qwen3MoeConfig, QWEN3_MOE, QWEN3_MOE_QUICK, "sdpa"),
          "gemma2-2b": (Gemma2Config, GEMMA2_2B, GEMMA2_QUICK, "eager")}


def build_model(name: str, quick: bool, device: str, dtype: torch.dtype):
    config_class, shape, quick_shape, attention = SHAPES[name]
    config = config_class(bos_token_id=None, eos_token_id=None, pad_token_id=None, **(quick_shape if quick else shape))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    model.generation_config = GenerationConfig()
    return model.eval()


def make_prompts(batch: int, prompt_len: int, vocab: int, device: str, **meta) -> DataProto:
    ids = torch.randint(1, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(batch)).to(device)
    ones = torch.ones_like(ids)
    positions = torch.arange(prompt_len, device=device).expand(batch, -1)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": ones, "position_ids": positions},
                               meta_info={"pad_token_id": 0, **meta})


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn, device: str) -> tuple[float, float, float]:
    """(seconds, peak GiB, peak GiB above what was allocated before) of one call, started from an
    empty allocator cache so that neither engine inherits the other's free blocks."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    sync(device)
    base = peak = 0.0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**30
    tic = time.perf_counter()
    fn()
    sync(device)
    seconds = time.perf_counter() - tic
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
    return seconds, peak, peak - base


def step_weight_bytes(model, rows: int) -> float:
    """Weight bytes one decode step of ``rows`` tokens reads: every dense weight, and of each expert group the
    fraction ``1 - (1 - k/E)^rows`` of experts that ``rows`` uniform top-k draws are expected to hit."""
    c = model.config
    experts = getattr(c, "num_experts", 0) or 0
    hit = 1 - (1 - c.num_experts_per_tok / experts) ** rows if experts else 1.0
    total = 0.0
    for name, p in {id(p): (n, p) for n, p in model.named_parameters()}.values():
        total += p.numel() * p.element_size() * (hit if ".experts." in name else 1.0)
    return total


def roofline_seconds(model, rows: int, prompt_len: int, response_len: int) -> float:
    """Decode steps 1..R-1 (the first token comes from the prefill): weights once per step plus the
    keys/values of every row's context."""
    weights = step_weight_bytes(model, rows)
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 2
    total = sum(weights + rows * (prompt_len + t) * kv_per_token for t in range(1, response_len))
    return total / HBM_BYTES_PER_S


def run_ours(model, prompts, response_len, n, device, repeats, **overrides):
    config = {"response_length": response_len, "n": n, "temperature": 1.0, "top_k": -1, "top_p": 1.0,
              "do_sample": True, "ignore_eos": True, "gpu_memory_utilization": 0.5, "max_num_seqs": 1024,
              "max_num_batched_tokens": 8192, "free_cache_engine": True, "enforce_eager": False, **overrides}
    rollout = NativeRollout(config, model, None)
    rollout.profile = True
    best = None
    for _ in range(repeats):
        seconds, peak, extra = measure(lambda: rollout.generate_sequences(prompts), device)
        if best is None or seconds < best[0]:
            best = (seconds, peak, extra, dict(rollout.last_stats))
    return best


def run_hf(model, prompts, response_len, n, device, top_k=0, top_p=1.0):
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=top_k, top_p=top_p, max_new_tokens=response_len,
                              num_return_sequences=n, pad_token_id=0, eos_token_id=None, use_cache=True)
    out = {}

    def call():
        out["seq"] = model.generate(input_ids=prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"],
                                    generation_config=config)

    seconds, peak, extra = measure(call, device)
    assert out["seq"].shape[1] == prompts.batch["input_ids"].shape[1] + response_len
    return seconds, peak, extra


def profile_decode(model, prompts, device) -> None:
    """Kernel time breakdown of a short eager generation (graph replays hide kernels from the profiler;
    the kernels are the same)."""
    from torch.profiler import ProfilerActivity, profile

    run_ours(model, prompts, 16, 1, device, 1, enforce_eager=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_ours(model, prompts, 16, 1, device, 1, enforce_eager=True)
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model on CPU: checks the script runs")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--profile", action="store_true", help="print the top kernels of 16 eager steps")
    parser.add_argument("--profile-batch", type=int, default=256, help="the batch --profile generates for")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b", help="the model architecture")
    args = parser.parse_args(argv)

    device = "cpu" if args.quick else "cuda"
    prompt_len, response_len = (16, 8) if args.quick else (384, 256)
    cases = [(4, 1), (8, 1), (4, 2)] if args.quick else [(64, 1), (256, 1), (32, 8)]
    dtype = torch.float32 if args.quick else torch.bfloat16
    model = build_model(args.shape, args.quick, device, dtype)
    vocab = model.config.vocab_size
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    info = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "shape": args.shape, "params": params,
            "hf_attention": model.config._attn_implementation,
            "hf_experts": model.config._experts_implementation if getattr(model.config, "num_experts", 0) else None,
            "prompt_len": prompt_len, "response_len": response_len, "cases": []}
    print(f"# {info['device']}, torch {torch.__version__}, {args.shape} ({params / 1e9:.2f}B parameters; transformers "
          f"attention {info['hf_attention']}, experts {info['hf_experts']}), prompt {prompt_len}, response "
          f"{response_len}", flush=True)

    # Warm-up: CUDA context, cuBLAS handles, kernels of both engines.
    warm = make_prompts(8, prompt_len, vocab, device, seed=0)
    run_ours(model, warm, 8, 1, device, 1)
    if not args.no_hf:
        run_hf(model, warm, 8, 1, device)

    rows_out = []
    for batch, n in cases:
        prompts = make_prompts(batch, prompt_len, vocab, device, seed=1)
        rows = batch * n
        tokens = rows * response_len
        label = f"batch {batch}" if n == 1 else f"{batch} prompts x n={n}"
        case = {"case": label, "rows": rows}
        if not args.no_hf:
            run_hf(model, prompts, 8, n, device)  # warm at this case's shape, as ours is by its first call
            hf = run_hf(model, prompts, response_len, n, device)
            case["hf_s"], case["hf_peak_gib"], case["hf_extra_gib"] = hf
            case["hf_tok_s"] = tokens / hf[0]
            print(f"{label}: transformers generate {case['hf_tok_s']:.0f} tok/s ({hf[0]:.2f} s), peak {hf[1]:.2f} GiB "
                  f"(+{hf[2]:.2f})", flush=True)
        ours = run_ours(model, prompts, response_len, n, device, repeats=2)
        case["ours_s"], case["ours_peak_gib"], case["ours_extra_gib"], stats = ours
        case["ours_tok_s"] = tokens / ours[0]
        case["ours_stats"] = stats
        roof = roofline_seconds(model, rows, prompt_len, response_len)
        case["roofline_decode_tok_s"] = rows * (response_len - 1) / roof
        case["roofline_fraction_total"] = roof / ours[0]
        if stats.get("decode_s"):
            case["roofline_fraction_decode"] = roof / stats["decode_s"]
        print(f"{label}: ours {case['ours_tok_s']:.0f} tok/s ({ours[0]:.2f} s; prefill {stats['prefill_s']:.2f} s, "
              f"decode {stats['decode_s']:.2f} s over {stats['decode_steps']} steps, {stats['graph_captures']} graph "
              f"captures), peak {ours[1]:.2f} GiB (+{ours[2]:.2f})", flush=True)
        if batch * n == max(b * m for b, m in cases) and n == 1:
            for name, extra in (("top_k=50 top_p=0.9", {"top_k": 50, "top_p": 0.9}),
                                ("top_p=0.9 only", {"top_p": 0.9}),
                                ("top_k=50 only", {"top_k": 50}),
                                ("enforce_eager", {"enforce_eager": True})):
                seconds, _, _, extra_stats = run_ours(model, prompts, response_len, n, device, 2, **extra)  # 1st warms
                step_ms = 1000 * extra_stats["decode_s"] / max(extra_stats["decode_steps"], 1)
                case[f"ours_{name}_tok_s"] = tokens / seconds
                case[f"ours_{name}_decode_ms_per_step"] = step_ms
                print(f"{label}: ours {name}: {tokens / seconds:.0f} tok/s, decode {step_ms:.2f} ms per step "
                      f"(pure sampling: {1000 * stats['decode_s'] / max(stats['decode_steps'], 1):.2f})", flush=True)
        if n > 1 and device == "cuda":  # the same case with each row reading its own copy of its prompt
            from unittest import mock

            from verl.workers.rollout.native import scheduler
            with mock.patch.object(scheduler, "decode_shared_chunk", lambda w, n: 0):
                seconds, _, _, own_stats = run_ours(model, prompts, response_len, n, device, repeats=2)
            step_ms = 1000 * own_stats["decode_s"] / max(own_stats["decode_steps"], 1)
            case["ours_unshared_tok_s"] = tokens / seconds
            case["ours_unshared_decode_ms_per_step"] = step_ms
            print(f"{label}: ours without shared prompts {tokens / seconds:.0f} tok/s, decode {step_ms:.2f} ms per "
                  f"step (shared, chunks of {stats['shared_prompt_chunk']}: "
                  f"{1000 * stats['decode_s'] / max(stats['decode_steps'], 1):.2f})", flush=True)
        if "hf_tok_s" in case:
            case["ratio"] = case["ours_tok_s"] / case["hf_tok_s"]
            print(f"{label}: ratio {case['ratio']:.2f}x", flush=True)
        info["cases"].append(case)
        rows_out.append(case)

    print("\n| case | generate tok/s | ours tok/s | ratio | ours peak GiB (+over weights) | generate peak GiB "
          "| roofline tok/s | fraction (total / decode only) |")
    print("|---|---|---|---|---|---|---|---|")
    for c in rows_out:
        print(f"| {c['case']} | {c.get('hf_tok_s', float('nan')):.0f} | {c['ours_tok_s']:.0f} | "
              f"{c.get('ratio', float('nan')):.2f}x | {c['ours_peak_gib']:.2f} (+{c['ours_extra_gib']:.2f}) | "
              f"{c.get('hf_peak_gib', float('nan')):.2f} | {c['roofline_decode_tok_s']:.0f} | "
              f"{c['roofline_fraction_total']:.2f} / {c.get('roofline_fraction_decode', float('nan')):.2f} |")
    if args.profile and device == "cuda":
        profile_decode(model, make_prompts(args.profile_batch, prompt_len, vocab, device, seed=2), device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1, default=str)


if __name__ == "__main__":
    main()
