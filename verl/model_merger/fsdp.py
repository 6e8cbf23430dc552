"""Merge the per-rank shards of an FSDP checkpoint into one Hugging Face model folder."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import torch

from verl.models.vision import is_vision_language
from verl.workers.engine.checkpoint import HF_DIR, load_full_model_state_dict, read_fsdp_config

logger = logging.getLogger(__name__)

# Files of the huggingface/ folder that describe the model rather than the tokenizer.
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                "adapter_config.json", "adapter_model.safetensors")


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
                          trust_remote_code: bool = False, overwrite: bool = False, merge_lora: bool = False,
                          base_model: str | None = None) -> str:
    """Write ``target_dir`` (safetensors weights, config, tokenizer, a vision-language model's processor files) from
    the checkpoint in ``local_dir``.

    ``dtype`` (e.g. ``bfloat16``) converts the weights; by default they keep the training master dtype.
    A LoRA checkpoint (its shards hold the adapter only) becomes a PEFT adapter folder, or with
    ``merge_lora`` the full model: the base weights (``base_model``, default the model the run started
    from) with ``scaling · B·A`` added. The folder is built under a temporary name and renamed, so a
    failure leaves no half-written model.
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
    lora_config = read_fsdp_config(local_dir).get("lora")
    if merge_lora and not lora_config:
        raise ValueError(f"--merge_lora: {local_dir} is not a LoRA checkpoint (its shards hold the full model); "
                         "drop --merge_lora")
    state = load_full_model_state_dict(local_dir)
    config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    if lora_config and merge_lora:
        state = _merged_with_base(state, lora_config, config, base_model, trust_remote_code)
    if dtype is not None:
        target = getattr(torch, dtype)
        state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
    parent = os.path.dirname(target_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target_dir)}.", dir=parent)
    try:
        if lora_config and not merge_lora:
            from verl.models.lora import write_adapter_folder

            write_adapter_folder(staging, state, lora_config)
        else:
            _empty_model(config, trust_remote_code).save_pretrained(staging, state_dict=state)
        for name in os.listdir(hf_dir):  # the tokenizer (and a vision-language model's processor) files
            source = os.path.join(hf_dir, name)
            if name not in _MODEL_FILES and os.path.isfile(source):
                shutil.copy2(source, os.path.join(staging, name))
        if is_vision_language(config) and not os.path.isfile(os.path.join(staging, "preprocessor_config.json")):
            logger.warning("%s has no preprocessor_config.json (a checkpoint written before checkpoints carried the "
                           "processor): %s loads as a model but not with AutoProcessor; copy preprocessor_config.json "
                           "and any chat_template.json / processor_config.json from the model folder the run started "
                           "from (actor_rollout_ref.model.path) into it", hf_dir, target_dir)
        if os.path.exists(target_dir):
            shutil.rmtree(target_dir)
        os.replace(staging, target_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target_dir


def _merged_with_base(adapter: dict, lora_config: dict, config, base_model: str | None,
                      trust_remote_code: bool) -> dict:
    """The base model's weights with the adapter folded in, under the plain parameter names."""
    from verl.models.lora import ADAPTER_NAME, merged_state_dict

    base_path = base_model or lora_config.get("base_model_name_or_path")
    if not base_path or not os.path.isdir(os.path.expanduser(base_path)):
        raise FileNotFoundError(f"--merge_lora needs the base model the adapter was trained on: {base_path!r} is not a "
                                "folder; pass --base_model <folder of actor_rollout_ref.model.path>")
    shell = _empty_model(config, trust_remote_code)
    base = type(shell).from_pretrained(os.path.expanduser(base_path), config=config,
                                       trust_remote_code=trust_remote_code)
    state = dict(base.state_dict())
    for name in adapter:
        if f".lora_A.{ADAPTER_NAME}." in name:  # this module took the adapter: its weight is the base layer
            module = name.split(f".lora_A.{ADAPTER_NAME}.")[0]
            for part in ("weight", "bias"):
                if f"{module}.{part}" in state:
                    state[f"{module}.base_layer.{part}"] = state.pop(f"{module}.{part}")
    state.update({k: v for k, v in adapter.items() if "lora_" not in k})  # a value head trained in full
    state.update({k: v for k, v in adapter.items() if "lora_" in k})
    merged = merged_state_dict(state, lora_config)
    expected = set(shell.state_dict())
    missing = sorted(expected - set(merged))
    if missing:
        raise ValueError(f"{base_path} lacks {missing[:4]} for this checkpoint's model; is it the base model the "
                         "adapter was trained on?")
    return {k: v for k, v in merged.items() if k in expected}


def compare_with_hf(local_dir: str, hf_dir: str, atol: float = 0.0) -> list[str]:
    """Names of the weights whose merged value differs from ``hf_dir``'s (empty when all match)."""
    from safetensors.torch import load_file

    merged = load_full_model_state_dict(local_dir)
    if read_fsdp_config(local_dir).get("lora"):  # compared with a PEFT adapter folder's names
        from verl.models.lora import peft_state_dict

        merged = peft_state_dict(merged)
    reference: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            reference.update(load_file(os.path.join(hf_dir, name)))
    problems = [f"{k}: missing from the checkpoint" for k in reference if k not in merged]
    for key, value in reference.items():
        if key in merged and not torch.allclose(merged[key].to(value.dtype), value, atol=atol, rtol=0):
            problems.append(f"{key}: max abs diff {(merged[key].to(value.dtype) - value).abs().max().item():.3g}")
    return problems
