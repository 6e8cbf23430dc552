"""Whole GRPO steps through the real CLI on one GPU, for a mixture of experts and a vision-language model.

    python3 bench/model_step.py --shape moe --out /tmp/moe_step [--steps 5]
    python3 bench/model_step.py --shape vlm --out /tmp/vlm_step [--steps 5] [--engine native]
    python3 bench/model_step.py --shape moe --out /tmp/plan --plan-only --device-gib 80   # no GPU needed
    python3 bench/model_step.py --shape vlm --out /tmp/quick --quick                      # tiny, on the CPU

Each shape runs ``python3 -m verl.trainer.main_ppo`` (one GPU, FSDP2, packed sequences, GRPO with the KL loss
to the reference policy, 256 response tokens at fixed length, ``ignore_eos``) on random weights, then prints the
median over the steps after the first (which captures CUDA graphs and warms the allocator) of: seconds per
step, ``perf/throughput`` (prompt and response tokens per second per GPU), ``perf/mfu/actor``, the peak memory
(``perf/max_memory_allocated_gb``, the largest of any step) beside the memory planner's estimate, and each
stage's ``timing_s/*``. The reward is ``bench/peer_grpo.py``'s (the decoded response's length / 100), so that
GRPO's advantages are not all zero.

``--shape moe``: Qwen3-30B-A3B's layer shape (``bench/rollout.py``'s ``QWEN3_MOE``: hidden 2048, 32/4 heads of
128, 128 experts of 768, top-8 renormalised, vocab 151,936, untied embeddings) cut to MOE_LAYERS = 5 layers,
the most whose peak the memory planner (``python -m verl.trainer.plan``) puts within 97% of an 80 GiB GPU for
full fine-tuning (fp32 master weights, gradients and AdamW state, bf16 reference weights, one layer's gradient
reduction; 76.3 GiB, against 76.6 measured on an H100; 6 layers plan 86.9 GiB; ``--plan-only`` prints both):
3.74B parameters,
0.91B of them active per token (the top-8 experts; the embeddings and lm_head are 0.62B of either). 16 prompts x 8 samples, prompts of about 256 tokens (the GSM8K fixture's questions as one chat turn),
the native rollout engine, ``+actor_rollout_ref.model.override_config.output_router_logits=true`` so the
router's load-balancing loss is added and the ``actor/moe/*`` metrics are logged. ``perf/mfu/actor`` already
counts active parameters: ``verl.utils.flops_counter`` charges a qwen3_moe token 6 x (attention + router +
the top-k experts' weights + embedding and lm_head) plus attention, not all 128 experts.

``--shape vlm``: Qwen2.5-VL-3B's vision tower (32 ViT blocks of hidden 1280, 16 heads, gated MLP 3420, patch
14, 2 x 2 merge, windows of 112 pixels, full attention in blocks 7/15/23/31) and its language model (hidden
2048, 16/2 heads, intermediate 11008, vocab 151,936, tied embeddings) cut to VLM_LAYERS = 24 of its 36
layers: 2.83B parameters, 0.67B of them the vision tower's; planned 52.1 GiB, which leaves room for the vision
tower's activations that the planner does not count. Gradient checkpointing is on
(vision blocks included), as the original's Qwen2.5-VL script sets it. 16 prompts x 8 samples in
geo3k's format (``examples/data_preprocess/geo3k.py`` run on a generated raw copy): each prompt has one or
two 448 x 448 pictures (256 image tokens each) and about 60 text tokens. The vision tower is trained (not
frozen). The shape runs twice: with the native engine (the vision tower once per prompt, the language model
under CUDA graphs) and with ``rollout.name=hf`` (transformers' ``generate``, the baseline); the last line compares
their generation times. Where time goes: the stages, and the vision tower's share of the model FLOPs of
a training pass (its 6·N·patches + attention over its windows, against the language model's count from
``verl.utils.flops_counter``, whose qwen2_5_vl formula counts the language model only -- so
``perf/mfu/actor`` leaves the vision tower out, and the table also prints it scaled to include the tower). The
tower's count takes every sample's images. A micro-batch encodes its identical images once
(``verl.models.vision.multi_modal_batch``), but the update's balanced micro-batches take a group's samples apart,
so that saves little; the count is an upper bound. Every prompt and picture is distinct (checked when the data is
written).

The random vision-language model never writes its image/video placeholders into a response: both engines
suppress them (``verl.models.vision.placeholder_token_ids``), since the actor's forward refuses an image slot
without an image.

``--quick`` runs the same script on a tiny model of each shape on the CPU (hf rollout there, 4 prompts x 4
samples, 16 response tokens, 3 steps) and prints the same table; its numbers check the script, nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.peer_grpo import REWARD, numbered_prompts, write_prompts  # noqa: E402
from bench.ppo_step import planned_peak_gib, run_main_ppo  # noqa: E402

MOE_LAYERS = 5  # the most layers whose planned peak is within FIT_SHARE of an 80 GiB GPU (--plan-only shows 5 and 6)
VLM_LAYERS = 24  # of Qwen2.5-VL-3B's 36: about 50 GiB planned, room for the vision activations the plan leaves out
FIT_SHARE = 0.97  # headroom for what the planner does not model: the CUDA context, allocator fragmentation
PROMPTS, SAMPLES, PROMPT_TOKENS, RESPONSE = 16, 8, 256, 256
QUICK = {"prompts": 4, "samples": 4, "prompt_tokens": 48, "response": 16, "image": 112}
IMAGE_SIDE = 448  # pixels: 32 x 32 patches of 14, merged 2 x 2 into 256 image tokens

# Qwen2.5-VL-3B-Instruct's config.json, the language model cut to VLM_LAYERS layers.
QWEN25_VL_3B_TEXT = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008,
                     "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
                     "rms_norm_eps": 1e-06, "max_position_embeddings": 128000, "tie_word_embeddings": True,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                         "mrope_section": [16, 24, 24]}}
QWEN25_VL_3B_VISION = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                       "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2}
QWEN25_VL_QUICK_TEXT = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
                        "tie_word_embeddings": True,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
QWEN25_VL_QUICK_VISION = {**QWEN25_VL_3B_VISION, "depth": 2, "hidden_size": 32, "intermediate_size": 64,
                          "num_heads": 2, "out_hidden_size": 64, "window_size": 56, "fullatt_block_indexes": [1]}


def workload(quick: bool) -> dict:
    if quick:
        return dict(QUICK)
    return {"prompts": PROMPTS, "samples": SAMPLES, "prompt_tokens": PROMPT_TOKENS, "response": RESPONSE,
            "image": IMAGE_SIDE}


# ------------------------------------------------------------------------------------------------ models
def moe_config(tokenizer, layers: int, quick: bool):
    from transformers import Qwen3MoeConfig

    from bench.rollout import QWEN3_MOE, QWEN3_MOE_QUICK

    shape = QWEN3_MOE_QUICK if quick else {**QWEN3_MOE, "num_hidden_layers": layers}
    return Qwen3MoeConfig(bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, **shape)


def vlm_tokenizer(tokenizer_dir: str):
    """The tiny BPE with Qwen2.5-VL's vision tokens and an image-aware chat template (as the tests' tiny VLM)."""
    from transformers import AutoTokenizer

    from tests.models.vlm_models import QWEN2_VL_TEMPLATE, VISION_TOKENS

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    return tokenizer


def vlm_config(tokenizer, layers: int, quick: bool):
    from transformers import Qwen2_5_VLConfig

    from tests.models.vlm_models import VISION_TOKENS

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = QWEN25_VL_QUICK_TEXT if quick else {**QWEN25_VL_3B_TEXT, "num_hidden_layers": layers}
    text = {**text, "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}
    return Qwen2_5_VLConfig(text_config=text, vision_config=QWEN25_VL_QUICK_VISION if quick else QWEN25_VL_3B_VISION,
                            image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                            tie_word_embeddings=True)


def save_model(config, tokenizer, save_dir: str, weights: bool, quick: bool) -> str:
    """``config`` and ``tokenizer`` in ``save_dir``, and random weights unless ``weights`` is false (the memory
    plan reads config.json only). Full-size weights are drawn in bf16 on the GPU when there is one."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2_5_VLForConditionalGeneration

    os.makedirs(save_dir, exist_ok=True)
    tokenizer.save_pretrained(save_dir)
    if not weights:
        config.save_pretrained(save_dir)
        return save_dir
    device = "cuda" if torch.cuda.is_available() and not quick else "cpu"
    dtype = torch.float32 if quick else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        if config.model_type == "qwen2_5_vl":
            model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(save_dir)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return save_dir


def parameter_counts(config) -> dict:
    """Total parameters, and those one token uses (all but the experts outside its top-k), counted on the meta
    device; for a vision-language model also the vision tower's."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = (Qwen2_5_VLForConditionalGeneration._from_config(config) if config.model_type == "qwen2_5_vl"
                 else AutoModelForCausalLM.from_config(config))
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    counts = {"total": total, "active": total}
    if experts:
        counts["active"] = total - experts + experts * config.num_experts_per_tok // config.num_experts
    visual = getattr(getattr(model, "model", None), "visual", None)
    if visual is not None:
        counts["vision"] = sum(p.numel() for p in visual.parameters())
    return counts


# ------------------------------------------------------------------------------------------------ data
def moe_data(out: str, quick: bool) -> tuple[str, list[int]]:
    """GSM8K fixture questions joined into prompts of about ``prompt_tokens`` templated tokens; the tokenizer
    (trained on them) under ``out/tokenizer``. Returns the parquet path and the prompts' lengths."""
    import pandas as pd
    from transformers import AutoTokenizer

    from verl.utils.tiny_model import build_tiny_tokenizer

    work = workload(quick)
    fixture = os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k/main/train-00000-of-00001.parquet")
    questions = list(pd.read_parquet(fixture)["question"])
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_tokenizer(os.path.join(out, "tokenizer"), corpus=questions))
    prompts, lengths = numbered_prompts(tokenizer, questions, work["prompts"], work["prompt_tokens"])
    path = os.path.join(out, "train.parquet")
    write_prompts(prompts, "model_step_bench", path)
    return path, lengths


def vlm_raw_rows(quick: bool) -> list[dict]:
    """geometry3k-shaped raw rows (images, problem, answer): the fixture's problems, one picture for even rows
    and two for odd ones, drawn at ``image`` x ``image`` pixels by the fixture's own ``draw``. Every row and
    every picture is distinct (a numbered problem; corners moved and the label numbered per picture): the
    trainer encodes identical images once, so repeated ones would do less work than the workload describes."""
    import hashlib

    sys.path.insert(0, os.path.join(REPO, "examples/data_preprocess/fixtures"))
    from make_geo3k_fixture import PROBLEMS, draw

    work = workload(quick)
    side, rows = work["image"], []
    scale = side / 56  # the fixture draws its triangles in a 56-pixel square
    for i in range(work["prompts"]):
        problem, answer, corners, label = PROBLEMS[i % len(PROBLEMS)]
        pictures = 1 + i % 2
        images = []
        for k in range(pictures):
            shift = (i + 3 * k) % 5  # fixture pixels
            moved = [(x * scale, (y - shift) * scale) for x, y in corners]
            images.append({"bytes": draw(moved, f"{label} {i}.{k}", size=(side, side)), "path": f"train_{i}_{k}.png"})
        text = problem.replace("<image>", "")
        rows.append({"images": images, "problem": "<image>" * pictures + f"Figure {i}. " + text, "answer": answer})
    pictures = [hashlib.sha256(image["bytes"]).hexdigest() for row in rows for image in row["images"]]
    if len({row["problem"] for row in rows}) != len(rows) or len(set(pictures)) != len(pictures):
        raise RuntimeError("vlm_raw_rows: expected distinct problems and pictures")
    return rows


def vlm_data(out: str, quick: bool) -> str:
    """The raw rows written as a geometry3k download, turned into verl's parquet by examples/data_preprocess/geo3k.py;
    the tokenizer (trained on the problems and geo3k's instruction) under ``out/tokenizer``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl.utils.tiny_model import build_tiny_tokenizer

    rows = vlm_raw_rows(quick)
    raw = os.path.join(out, "geo3k_raw", "data")
    os.makedirs(raw, exist_ok=True)
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(raw, f"{split}-00000-of-00001.parquet"))
    data = os.path.join(out, "geo3k")
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/geo3k.py"), "--local_dataset_path",
                    os.path.dirname(raw), "--local_dir", data], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")})
    import pandas as pd

    corpus = [m["content"] for chat in pd.read_parquet(os.path.join(data, "train.parquet"))["prompt"] for m in chat]
    build_tiny_tokenizer(os.path.join(out, "tokenizer"), corpus=corpus)
    return os.path.join(data, "train.parquet")


def vlm_prompt_lengths(model: str, parquet: str) -> tuple[list[int], list[int]]:
    """Each prompt's tokens (text and image tokens, as the dataset builds them) and each image's patches."""
    import io

    import pandas as pd
    from PIL import Image

    from verl.models.vision import IMAGE_PLACEHOLDER, load_processor

    processor = load_processor(model)
    lengths, patches = [], []
    for _, row in pd.read_parquet(parquet).iterrows():
        content = row["prompt"][0]["content"]
        items = []
        for k, piece in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if k:
                items.append({"type": "image"})
            if piece:
                items.append({"type": "text", "text": piece})
        text = processor.tokenizer.apply_chat_template([{"role": "user", "content": items}], add_generation_prompt=True,
                                                       tokenize=False)
        images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
        ids, inputs = processor(text, images)
        lengths.append(len(ids))
        patches += [int(g.prod()) for g in inputs["image_grid_thw"]]
    return lengths, patches


def vit_flops(vision: dict, images_patches: list[int]) -> float:
    """Model FLOPs of one training pass (forward + backward = 3 forwards) of the Qwen2.5-VL vision tower over
    images of ``images_patches`` patches: 6·N·patches for the patch embedding (a conv), the blocks (qkv and
    output projections 4·D², gated MLP 3·D·I) and the patch merger (an MLP of 4D -> 4D -> out on merged patches,
    a quarter as many), plus attention 12·d·heads per query-key pair: all of an image's patch pairs in the
    full-attention blocks, pairs within a window (``window_size`` pixels square) in the others."""
    dim, depth = vision["hidden_size"], vision["depth"]
    patch, merge = vision["patch_size"], vision["spatial_merge_size"]
    patch_embed = dim * 3 * vision["temporal_patch_size"] * patch * patch
    blocks = (4 * dim * dim + 3 * dim * vision["intermediate_size"]) * depth
    merged = dim * merge * merge
    merger = merged * merged + merged * vision["out_hidden_size"]
    window = (vision["window_size"] // patch) ** 2
    full = len(vision["fullatt_block_indexes"])
    pairs = sum(p * p * full + p * min(p, window) * (depth - full) for p in images_patches)
    patches = sum(images_patches)
    return 6 * ((patch_embed + blocks) * patches + merger * patches / merge ** 2) + 12 * pairs * dim


# ------------------------------------------------------------------------------------------------ commands
def common_overrides(steps: int, quick: bool, work: dict, name: str, out: str) -> list[str]:
    return [
        "algorithm.adv_estimator=grpo", f"data.train_batch_size={work['prompts']}",
        f"data.max_response_length={work['response']}", "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.optim.lr=1e-6", f"actor_rollout_ref.actor.ppo_mini_batch_size={work['prompts']}",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.rollout.n={work['samples']}", "actor_rollout_ref.rollout.ignore_eos=True",
        f"custom_reward_function.path={out}/reward.py", "custom_reward_function.name=compute_score",
        "trainer.logger=['console','file']", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
        f"trainer.device={'cpu' if quick else 'cuda'}", f"trainer.experiment_name=model_step_{name}",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={out}/ckpt",
    ]


def moe_command(out: str, data: str, model: str, max_prompt: int, steps: int, quick: bool) -> list[str]:
    work = workload(quick)
    return common_overrides(steps, quick, work, "moe", out) + [
        f"data.train_files={data}", f"data.max_prompt_length={max_prompt}", f"actor_rollout_ref.model.path={model}",
        "+actor_rollout_ref.model.override_config.output_router_logits=true",
        f"actor_rollout_ref.rollout.name={'hf' if quick else 'native'}",
    ]


def vlm_command(out: str, data: str, model: str, max_prompt: int, steps: int, quick: bool) -> list[str]:
    work = workload(quick)
    return common_overrides(steps, quick, work, "vlm", out) + [
        f"data.train_files={data}", f"data.max_prompt_length={max_prompt}", "data.image_key=images",
        "data.truncation=error", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=16384",
    ]


# ------------------------------------------------------------------------------------------------ shapes
def prepare(shape: str, out: str, quick: bool, weights: bool, layers: int | None = None) -> dict:
    """Data, tokenizer and model folder of ``shape``; returns what the command and the report need."""
    from transformers import AutoTokenizer

    with open(os.path.join(out, "reward.py"), "w") as f:
        f.write(REWARD)
    work = workload(quick)
    if shape == "moe":
        layers = MOE_LAYERS if layers is None else layers
        data, lengths = moe_data(out, quick)
        tokenizer = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
        config = moe_config(tokenizer, layers, quick)
        model = save_model(config, tokenizer, os.path.join(out, f"model_moe_{layers}"), weights, quick)
        return {"data": data, "model": model, "config": config, "prompt_lengths": lengths, "layers": layers,
                "max_prompt": max(lengths)}
    layers = VLM_LAYERS if layers is None else layers
    data = vlm_data(out, quick)
    tokenizer = vlm_tokenizer(os.path.join(out, "tokenizer"))
    config = vlm_config(tokenizer, layers, quick)
    model = save_model(config, tokenizer, os.path.join(out, f"model_vlm_{layers}"), weights, quick)
    write_image_processor(model, work["image"])
    lengths, patches = vlm_prompt_lengths(model, data)
    return {"data": data, "model": model, "config": config, "prompt_lengths": lengths, "layers": layers,
            "max_prompt": max(lengths), "image_patches": patches}


def write_image_processor(model: str, side: int) -> None:
    """Qwen2.5-VL's image processor (patch 14, 2 x 2 merge) in the model folder, with the pixel bounds at the
    bench's picture size so each picture keeps its ``side`` x ``side`` pixels (preprocessor_config.json)."""
    from transformers import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=28 * 28,
                             max_pixels=side * side).save_pretrained(model)


def command_of(shape: str, out: str, prepared: dict, steps: int, quick: bool) -> list[str]:
    build = moe_command if shape == "moe" else vlm_command
    return build(out, prepared["data"], prepared["model"], prepared["max_prompt"], steps, quick)


def plan_only(shape: str, out: str, quick: bool, device_gib: float | None) -> None:
    """The planned peak at the chosen layer count and at one more (for the MoE: to show the next does not fit)."""
    chosen = (MOE_LAYERS if shape == "moe" else VLM_LAYERS) if not quick else None
    for layers in ([chosen, chosen + 1] if chosen else [None]):
        prepared = prepare(shape, out, quick, weights=False, layers=layers)
        counts = parameter_counts(prepared["config"])
        gib = planned_peak_gib(command_of(shape, out, prepared, 1, quick), device_gib)
        verdict = (f" on a {device_gib:g} GiB GPU: {'within' if gib <= FIT_SHARE * device_gib else 'over'} "
                   f"{FIT_SHARE:.0%} of it" if device_gib else "")
        print(f"{shape}: {prepared['layers'] if not quick else 'quick'} layers, {describe_counts(counts)}: "
              f"planned peak {gib:.2f} GiB{verdict}", flush=True)


def describe_counts(counts: dict) -> str:
    def count(n: int) -> str:
        return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"

    text = f"{count(counts['total'])} parameters, {count(counts['active'])} active per token"
    if "vision" in counts:
        text += f", vision tower {count(counts['vision'])}"
    return text


def run_shape(shape: str, out: str, steps: int, quick: bool, device_gib: float | None,
              engines: list[str] | None = None) -> dict:
    prepared = prepare(shape, out, quick, weights=True)
    counts = parameter_counts(prepared["config"])
    work = workload(quick)
    lengths = prepared["prompt_lengths"]
    print(f"{shape}: {'quick (tiny)' if quick else str(prepared['layers']) + ' layers'}, {describe_counts(counts)}; "
          f"{work['prompts']} prompts x {work['samples']}, prompt tokens {min(lengths)}..{max(lengths)}, "
          f"{work['response']} response tokens", flush=True)
    # The vision-language shape runs twice, the native engine then transformers' generate (the baseline).
    engines = (engines or ["native", "hf"]) if shape == "vlm" else [None]
    results = [measure(shape, out, prepared, steps, quick, device_gib, engine) for engine in engines]
    if len(results) == 2:
        ours, baseline = (r["median"].get("timing_s/gen", 0.0) for r in results)
        print(f"\nvlm generation (timing_s/gen, median): native {ours:.3f} s, hf {baseline:.3f} s: "
              f"{baseline / ours if ours else float('nan'):.2f}x; step {results[0]['median'].get('timing_s/step', 0):.3f}"
              f" s vs {results[1]['median'].get('timing_s/step', 0):.3f} s")
    return results[0]


def measure(shape: str, out: str, prepared: dict, steps: int, quick: bool, device_gib: float | None,
            engine: str | None) -> dict:
    """One ``main_ppo`` run of the shape (with ``rollout.name=engine`` when given); its summary, printed."""
    work = workload(quick)
    lengths = prepared["prompt_lengths"]
    counts = parameter_counts(prepared["config"])
    command = command_of(shape, out, prepared, steps, quick)
    name = shape if engine is None else f"{shape}_{engine}"
    if engine is not None:
        command.append(f"actor_rollout_ref.rollout.name={engine}")
    planned = planned_peak_gib(command, device_gib)
    steps_metrics = run_main_ppo(command, os.path.join(out, f"{name}.jsonl"), out)[1:]  # step 1 warms up
    median = {key: statistics.median(s[key] for s in steps_metrics if key in s)
              for key in sorted({k for s in steps_metrics for k in s})
              if all(isinstance(s.get(key, 0.0), (int, float)) for s in steps_metrics)}
    result = {"shape": shape, "engine": engine, "quick": quick, "layers": prepared["layers"], "parameters": counts,
              "planned_gib": planned, "median": median, "command": command,
              "peak_gib": max(s.get("perf/max_memory_allocated_gb", 0.0) for s in steps_metrics),
              "steps_measured": len(steps_metrics)}
    if shape == "vlm":
        from verl.utils.flops_counter import FLOPS_ESTIMATORS

        seqlens = [n + work["response"] for n in lengths for _ in range(work["samples"])]
        # Each sample's images: the update's micro-batches take a group's samples apart, so each encodes its own
        # (a micro-batch holding two samples of one prompt encodes them once: this count is an upper bound).
        patches = prepared["image_patches"] * work["samples"]
        vision = prepared["config"].vision_config.to_dict()
        text_flops = FLOPS_ESTIMATORS["qwen2_5_vl"](prepared["config"], seqlens)
        result["vision_flops_share"] = vit_flops(vision, patches) / (vit_flops(vision, patches) + text_flops)
    with open(os.path.join(out, f"summary_{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    report(result)
    return result


def report(result: dict) -> None:
    median = result["median"]
    engine = f", rollout.name={result['engine']}" if result["engine"] else ""
    print(f"\n{result['shape']}{engine}{' (quick, CPU)' if result['quick'] else ''}: median over steps 2..N "
          f"({result['steps_measured']} steps)")
    print(f"  {'s/step':24}{median.get('timing_s/step', 0.0):12.3f}")
    print(f"  {'tokens/s/GPU':24}{median.get('perf/throughput', 0.0):12.1f}   (perf/throughput)")
    mfu = median.get("perf/mfu/actor", 0.0)
    if result["shape"] == "moe":
        print(f"  {'MFU actor (active)':24}{mfu:12.4f}   (perf/mfu/actor: top-k experts counted)")
    else:
        share = result["vision_flops_share"]
        print(f"  {'MFU actor (text only)':24}{mfu:12.4f}   (perf/mfu/actor: the language model's FLOPs)")
        print(f"  {'MFU actor (with ViT)':24}{mfu / (1 - share):12.4f}   (vision tower {100 * share:.1f}% of a "
              "training pass's model FLOPs)")
    print(f"  {'peak GiB':24}{result['peak_gib']:12.2f}   (planned {result['planned_gib']:.2f})")
    stages = {k.split("/", 1)[1]: v for k, v in median.items() if k.startswith("timing_s/") and k != "timing_s/step"}
    step = median.get("timing_s/step", 0.0) or 1.0
    print("  stages (s, % of step): " + ", ".join(f"{k} {v:.3f} ({100 * v / step:.0f}%)" for k, v in stages.items()))
    moe = {k: v for k, v in median.items() if k.startswith("actor/moe/")}
    if moe:
        print("  " + ", ".join(f"{k} {v:.4f}" for k, v in moe.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["moe", "vlm"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, help="training steps; the first is left out (default 5, --quick 3)")
    parser.add_argument("--quick", action="store_true", help="a tiny model of the shape on the CPU (checks the script)")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the memory planner's peak for the shape and stop (no weights, no GPU)")
    parser.add_argument("--device-gib", type=float, help="the GPU size the plan assumes (default: this one's)")
    parser.add_argument("--engine", choices=["native", "hf"], action="append",
                        help="--shape vlm: run only this rollout engine (repeatable; default both, native first)")
    args = parser.parse_args()
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    if args.plan_only:
        plan_only(args.shape, args.out, args.quick, args.device_gib)
        return
    steps = args.steps or (3 if args.quick else 5)
    run_shape(args.shape, args.out, steps, args.quick, args.device_gib, args.engine)


if __name__ == "__main__":
    main()
