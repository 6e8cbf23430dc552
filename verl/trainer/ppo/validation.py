"""Validation: generate for the whole validation set, score it, and report per data source."""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from verl.data import collate_fn
from verl.protocol import DataProto
from verl.rewards.loading import compute_reward
from verl.trainer.ppo.metric_utils import flatten_validation_metrics, process_validation_metrics


def validate(config, actor_rollout, val_dataset, val_reward_fn, tokenizer, global_step: int) -> dict:
    """``val-core/<data_source>/...`` and ``val-aux/...`` metrics of one pass over ``val_dataset``.

    Every prompt is sampled ``rollout.val_kwargs.n`` times with the validation sampling settings
    (greedy by default), in one batch.
    """
    prompts = DataProto.from_single_dict(collate_fn([val_dataset[i] for i in range(len(val_dataset))]),
                                         meta_info={"validate": True, "global_steps": global_step})
    prompts.non_tensor_batch["uid"] = np.array([f"val-{i}" for i in range(len(prompts))], dtype=object)
    outputs = actor_rollout.generate_sequences(prompts)
    reward_tensor, extra_info = compute_reward(outputs, val_reward_fn)
    scores = reward_tensor.sum(-1)
    infos = {"reward": scores.tolist(), **extra_info}
    key = config.data.reward_fn_key
    nested = process_validation_metrics(outputs.non_tensor_batch[key].tolist(),
                                        outputs.non_tensor_batch["uid"].tolist(), infos)
    if config.trainer.validation_data_dir:
        dump_generations(tokenizer, outputs, scores, global_step, config.trainer.validation_data_dir)
    return flatten_validation_metrics(nested)


def dump_generations(tokenizer, batch: DataProto, scores: torch.Tensor, global_step: int, folder: str) -> str:
    """Append one JSON line per sample (prompt, response, score, step) to ``<folder>/<step>.jsonl``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{global_step}.jsonl")
    prompts = tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
    responses = [tokenizer.decode(ids[m], skip_special_tokens=True)
                 for ids, m in zip(batch.batch["responses"], batch.batch["response_mask"].bool())]
    with open(path, "a") as f:
        for i, (prompt, response) in enumerate(zip(prompts, responses)):
            row = {"step": global_step, "input": prompt, "output": response, "score": float(scores[i])}
            for key in ("data_source", "uid"):
                if key in batch.non_tensor_batch:
                    row[key] = str(batch.non_tensor_batch[key][i])
            f.write(json.dumps(row) + "\n")
    return path
