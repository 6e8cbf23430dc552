"""Reward manager that scores the whole batch with one call (for scorers that batch internally,
e.g. a remote judge or a vectorised checker)."""

from __future__ import annotations

from typing import Callable

from verl.rewards.managers.naive import NaiveRewardManager, ScoringInput, split_result
from verl.rewards.managers.registry import register

__all__ = ["BatchRewardManager"]


@register("batch")
class BatchRewardManager(NaiveRewardManager):
    """Calls ``compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...],
    extra_infos=[...], **kwargs)`` once per batch; it must return one float or dict per sample."""

    compute_score_params = ("data_sources", "solution_strs", "ground_truths", "extra_infos")

    def __init__(self, tokenizer, num_examine: int, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", **kwargs) -> None:
        if compute_score is None:
            raise ValueError("the 'batch' reward manager needs a batch scoring function: set "
                             "custom_reward_function.path to a file defining compute_score(data_sources, "
                             "solution_strs, ground_truths, extra_infos)")
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)

    def score(self, samples: list[ScoringInput]) -> list[tuple[float, dict]]:
        try:
            results = self.compute_score(data_sources=[s.data_source for s in samples],
                                         solution_strs=[s.response for s in samples],
                                         ground_truths=[s.ground_truth for s in samples],
                                         extra_infos=[s.extra_info for s in samples], **self.score_kwargs)
        except Exception as exc:
            sources = sorted({str(s.data_source) for s in samples})
            raise RuntimeError(f"the batch compute_score raised {type(exc).__name__}: {exc} "
                               f"(batch of {len(samples)}, data sources {sources})") from exc
        if isinstance(results, (str, bytes, dict)) or not hasattr(results, "__len__"):
            raise TypeError(f"the batch compute_score must return a list with one score per sample, "
                            f"got {type(results).__name__}")
        if len(results) != len(samples):
            raise ValueError(f"the batch compute_score returned {len(results)} scores for a batch of "
                             f"{len(samples)} samples; it must return exactly one per sample, in order")
        return [split_result(result, i, "the batch compute_score") for i, result in enumerate(results)]
