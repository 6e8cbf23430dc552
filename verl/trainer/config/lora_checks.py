"""Checks of the LoRA keys (``*.model.lora_rank``, ``lora_alpha``, ``target_modules``,
``exclude_modules``, ``lora_adapter_path``) before any worker starts: peft installed, the adapter folder
readable, and the adapter injectable into the model ``model.path`` names (built on the meta device)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from verl.trainer.config import checks
from verl.trainer.config.checks import AR, Issue, Run, error


def check_lora(run: Run) -> Iterator[Issue]:
    sections = [(f"{AR}.model", False)] + ([("critic.model", True)] if run.uses_critic else [])
    for section, value_head in sections:
        model_config = run.get(section) or {}
        if not (model_config.get("lora_rank") or model_config.get("lora_adapter_path")):
            continue
        if not checks._module_available("peft"):
            yield error(f"{section}.lora_rank", "needs the peft package, which is not installed. Install it "
                                                "(pip install peft, or pip install -e '.[lora]'), or set lora_rank=0")
            continue
        from verl.models.lora import LoraSettings, meta_model_with_adapter

        try:
            settings = LoraSettings.from_config(model_config, section)
        except (ValueError, FileNotFoundError, KeyError) as err:
            # LoraSettings' messages start with the key they are about ("<section>.<key>=... : ...").
            named = re.match(rf"({re.escape(section)}\.\w+)", str(err))
            yield error(named.group(1) if named else f"{section}.lora_rank", str(err))
            continue
        path = model_config.get("path")
        if not path or not os.path.isfile(os.path.join(os.path.expanduser(str(path)), "config.json")):
            continue  # a missing model folder is reported by the path checks; a hub id is checked by the worker
        try:
            from verl.models.loader import load_hf_config
            from verl.models.vision import is_vision_language

            hf_config = load_hf_config(path, trust_remote_code=bool(model_config.get("trust_remote_code")),
                                       override_config=model_config.get("override_config"),
                                       config_key=f"{section}.path")
            if value_head and is_vision_language(hf_config):
                yield error(f"{section}.lora_rank", f"a LoRA adapter on a vision-language critic ({path}) is not "
                                                    "supported here. Train the whole critic (lora_rank=0), or use an "
                                                    "estimator without a critic (algorithm.adv_estimator=grpo)")
                continue
            meta_model_with_adapter(hf_config, settings, value_head=value_head)
        except ValueError as err:
            yield error(f"{section}.target_modules", str(err))
