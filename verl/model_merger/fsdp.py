"""Merge the per-rank shards of an FSDP checkpoint into one Hugging Face model folder."""

from __future__ import annotations

import os
import shutil
import tempfile

import torch

from verl.workers.engine.checkpoint import HF_DIR, load_full_model_state_dict

# Files of the huggingface/ folder that describe the model rather than the tokenizer.
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")


def _empty_model(config, trust_remote_code: bool):
    """The model class named in config.json, built on the meta device (no memory, no init)."""
    import transformers

    architectures = getattr(config, "architectures", None) or []
    with torch.device("meta"):
        for name in architectures:
            cls = getattr(transformers, name, None)
            if cls is not None:
                return cls(config)
        if trust_remote_code:
            return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    raise ValueError(f"config.json names the architecture(s) {architectures}, which this transformers does not "
                     "provide; pass --trust-remote-code for a model with custom code")


def merge_fsdp_checkpoint(local_dir: str, target_dir: str, *, dtype: str | None = None,
                          trust_remote_code: bool = False, overwrite: bool = False) -> str:
    """Write ``target_dir`` (safetensors weights, config, tokenizer) from the checkpoint in ``local_dir``.

    ``dtype`` (e.g. ``bfloat16``) converts the weights; by default they keep the training master dtype.
    The folder is built under a temporary name and renamed, so a failure leaves no half-written model.
    """
    from transformers import AutoConfig

    hf_dir = os.path.join(local_dir, HF_DIR)
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(f"{hf_dir}/config.json not found: --local_dir must be a checkpoint folder written by "
                                "verl, such as checkpoints/<project>/<experiment>/global_step_N/actor")
    target_dir = os.path.abspath(target_dir)
    if os.path.exists(target_dir) and os.listdir(target_dir) and not overwrite:
        raise FileExistsError(f"--target_dir {target_dir} exists and is not empty; choose another folder or pass "
                              "--overwrite")
    state = load_full_model_state_dict(local_dir)
    if dtype is not None:
        target = getattr(torch, dtype)
        state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
    config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    shell = _empty_model(config, trust_remote_code)
    parent = os.path.dirname(target_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target_dir)}.", dir=parent)
    try:
        shell.save_pretrained(staging, state_dict=state)
        for name in os.listdir(hf_dir):  # the tokenizer files saved beside the config
            source = os.path.join(hf_dir, name)
            if name not in _MODEL_FILES and os.path.isfile(source):
                shutil.copy2(source, os.path.join(staging, name))
        if os.path.exists(target_dir):
            shutil.rmtree(target_dir)
        os.replace(staging, target_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target_dir


def compare_with_hf(local_dir: str, hf_dir: str, atol: float = 0.0) -> list[str]:
    """Names of the weights whose merged value differs from ``hf_dir``'s (empty when all match)."""
    from safetensors.torch import load_file

    merged = load_full_model_state_dict(local_dir)
    reference: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            reference.update(load_file(os.path.join(hf_dir, name)))
    problems = [f"{k}: missing from the checkpoint" for k in reference if k not in merged]
    for key, value in reference.items():
        if key in merged and not torch.allclose(merged[key].to(value.dtype), value, atol=atol, rtol=0):
            problems.append(f"{key}: max abs diff {(merged[key].to(value.dtype) - value).abs().max().item():.3g}")
    return problems
