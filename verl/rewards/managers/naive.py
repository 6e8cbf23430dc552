"""The default reward manager: decode each sample, score it with a rule, reward the last token.

Also holds the pieces the other managers share: decoding a ``DataProto`` into per-sample strings,
reading a scorer's result, and assembling the reward tensor and ``reward_extra_info``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from verl.rewards.managers.abstract import AbstractRewardManager
from verl.rewards.managers.registry import register
from verl.rewards.scorers import default_compute_score

__all__ = ["NaiveRewardManager", "ScoringInput", "decode_samples", "split_result"]


@dataclass
class ScoringInput:
    """One decoded sample, with what a scorer needs to judge it."""

    prompt: str
    response: str
    valid_response_length: int
    data_source: Any
    ground_truth: Any
    extra_info: Any


def decode_samples(data, tokenizer, reward_fn_key: str = "data_source") -> list[ScoringInput]:
    """Decode the real (unpadded) prompt and response of every row of ``data``.

    ``prompts`` are left-padded and ``responses`` right-padded; ``attention_mask`` covers both, so
    its sums over the prompt and response columns give the real lengths.
    """
    present = sorted(data.batch.keys()) if data.batch is not None else []
    for key in ("prompts", "responses", "attention_mask"):
        if key not in present:
            raise KeyError(f"reward managers need data.batch[{key!r}]; the batch has {present}")
    for key in (reward_fn_key, "reward_model"):
        if key not in data.non_tensor_batch:
            hint = " (the column named by data.reward_fn_key)" if key == reward_fn_key else ""
            raise KeyError(f"reward managers need data.non_tensor_batch[{key!r}]{hint}; the batch has "
                           f"{sorted(data.non_tensor_batch)}")
    prompts, responses = data.batch["prompts"], data.batch["responses"]
    attention_mask = data.batch["attention_mask"]
    prompt_len, response_len = prompts.shape[-1], responses.shape[-1]
    if response_len == 0:
        raise ValueError("data.batch['responses'] has no columns; there is nothing to reward")
    if attention_mask.shape[-1] != prompt_len + response_len:
        raise ValueError(f"attention_mask has {attention_mask.shape[-1]} columns but prompts + responses "
                         f"have {prompt_len} + {response_len}")
    extra_infos = data.non_tensor_batch["extra_info"] if "extra_info" in data.non_tensor_batch else None

    samples = []
    for i in range(len(data)):
        valid_prompt_len = int(attention_mask[i, :prompt_len].sum())
        valid_response_len = int(attention_mask[i, prompt_len:].sum())
        prompt_ids = prompts[i, prompt_len - valid_prompt_len:]
        response_ids = responses[i, :valid_response_len]
        reward_model = data.non_tensor_batch["reward_model"][i]
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise ValueError(f"row {i}: non_tensor_batch['reward_model'] must be a dict with a "
                             f"'ground_truth' key, got {reward_model!r}")
        if reward_model["ground_truth"] is None:
            index = data.non_tensor_batch["index"][i] if "index" in data.non_tensor_batch else None
            raise ValueError(f"sample {i} of the batch (dataset row index {index}) has reward_model.ground_truth "
                             "None: a rule reward has nothing to compare with, and scoring it 0 would train on a "
                             "wrong signal. Fix or drop that row of the data file")
        samples.append(ScoringInput(prompt=tokenizer.decode(prompt_ids.tolist(), skip_special_tokens=True),
                                    response=tokenizer.decode(response_ids.tolist(), skip_special_tokens=True),
                                    valid_response_length=valid_response_len,
                                    data_source=data.non_tensor_batch[reward_fn_key][i],
                                    ground_truth=reward_model["ground_truth"],
                                    extra_info=None if extra_infos is None else extra_infos[i]))
    return samples


def _number(value) -> bool:
    """A real number: int, float, bool, numpy scalars (np.float32, np.bool_ ...) and 0-d arrays/tensors."""
    import numbers

    if isinstance(value, (numbers.Real, np.bool_)):
        return True
    if isinstance(value, (np.ndarray, np.generic, torch.Tensor)) and value.ndim == 0:
        return isinstance(value.item(), (numbers.Real, bool))
    return False


def split_result(result, index: int, where: str = "the scoring function") -> tuple[float, dict]:
    """A scorer's result for sample ``index`` as ``(reward, extra_info)``. Only a real number (int,
    float, bool, a 0-d numpy/torch value) or a dict holding one under ``score`` is a reward: a string,
    None or anything else stops the run, naming ``where`` the result came from and the sample."""
    score = result
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"{where} returned a dict without a 'score' key for sample {index} of the batch "
                             f"(keys: {sorted(result)}); put the reward under 'score'")
        score = result["score"]
    if not _number(score):
        raise TypeError(f"{where} returned {score!r} ({type(score).__name__}) for sample {index} of the batch; a "
                        "reward must be a number (or a dict with a numeric 'score'). Return a float, e.g. "
                        "float(correct)")
    value = float(score)
    if not np.isfinite(value):
        raise ValueError(f"{where} returned {value} for sample {index} of the batch; rewards must be finite")
    return value, dict(result) if isinstance(result, dict) else {}


@register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """Scores each sample with ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

    The reward sits on the last valid response token; all other tokens get 0. A response with no
    valid token (empty generation) gets its reward on token 0, so sequence-level sums still see it.
    Extra keyword arguments are passed to every ``compute_score`` call.
    """

    # The keyword arguments a custom scoring function must accept (checked when it is loaded).
    compute_score_params = ("data_source", "solution_str", "ground_truth", "extra_info")

    def __init__(self, tokenizer, num_examine: int, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", **kwargs) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.score_kwargs = kwargs

    def __call__(self, data, return_dict: bool = False):
        if data.batch is not None and "rm_scores" in data.batch.keys():
            # A reward model already scored this batch.
            rm_scores = data.batch["rm_scores"]
            return {"reward_tensor": rm_scores, "reward_extra_info": {}} if return_dict else rm_scores

        samples = decode_samples(data, self.tokenizer, self.reward_fn_key)
        results = self.score(samples)
        responses = data.batch["responses"]
        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        for i, (sample, (reward, _)) in enumerate(zip(samples, results)):
            reward_tensor[i, max(sample.valid_response_length - 1, 0)] = reward
        reward_extra_info = self._collect_extra_info([info for _, info in results])
        self._print_examples(samples, results)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": reward_extra_info}
        return reward_tensor

    def score(self, samples: list[ScoringInput]) -> list[tuple[float, dict]]:
        """``(reward, extra_info)`` for every sample, in order."""
        return [self.score_one(i, sample) for i, sample in enumerate(samples)]

    def score_one(self, i: int, sample: ScoringInput) -> tuple[float, dict]:
        """``(reward, extra_info)`` of sample ``i``; a failing scoring function is reported with the sample."""
        try:
            result = self.compute_score(data_source=sample.data_source, solution_str=sample.response,
                                        ground_truth=sample.ground_truth, extra_info=sample.extra_info,
                                        **self.score_kwargs)
        except Exception as exc:
            raise RuntimeError(f"compute_score raised {type(exc).__name__}: {exc} (data_source={sample.data_source!r}, "
                               f"sample {i} of the batch, ground_truth={sample.ground_truth!r}, response starts "
                               f"{sample.response[:200]!r})") from exc
        return split_result(result, i, f"compute_score (data_source={sample.data_source!r})")

    @staticmethod
    def _collect_extra_info(infos: list[dict]) -> dict[str, list]:
        """Per-key lists over the batch; every sample must report the same keys."""
        collected: dict[str, list] = defaultdict(list)
        for info in infos:
            for key, value in info.items():
                collected[key].append(value)
        for key, values in collected.items():
            if len(values) != len(infos):
                raise ValueError(f"the scoring function returned {key!r} for {len(values)} of {len(infos)} "
                                 "samples; it must return the same keys for every sample")
        return dict(collected)

    def _print_examples(self, samples: list[ScoringInput], results: list[tuple[float, dict]]) -> None:
        printed: dict[Any, int] = defaultdict(int)
        for sample, (reward, info) in zip(samples, results):
            if printed[sample.data_source] >= self.num_examine:
                continue
            printed[sample.data_source] += 1
            print("[prompt]", sample.prompt)
            print("[response]", sample.response)
            print("[ground_truth]", sample.ground_truth)
            print("[score]", reward)
            for key, value in info.items():
                if key != "score":
                    print(f"[{key}]", value)
