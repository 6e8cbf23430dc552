"""DAPO reward manager: naive rule scoring plus the soft overlong penalty of DAPO (Yu et al., 2025).

Responses that run into the last ``overlong_buffer.len`` tokens before ``max_resp_len`` lose reward
linearly with how far they go in, down to ``-penalty_factor`` at the maximum length::

    expected = max_resp_len - buffer_len
    penalty  = min(-(valid_len - expected) / buffer_len * penalty_factor, 0)

so a response that stops before the buffer keeps its score, and one truncated at the limit pays the
full factor.
"""

from __future__ import annotations

from typing import Any, Callable

from verl.rewards.managers.naive import NaiveRewardManager, ScoringInput
from verl.rewards.managers.registry import register
from verl.workers.config.reward_model import OverlongBufferConfig

__all__ = ["DAPORewardManager", "overlong_penalty"]


def overlong_penalty(valid_len: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """The (non-positive) reward added to a response of ``valid_len`` tokens; formula in the module doc."""
    expected = max_resp_len - buffer_len
    return min(-(valid_len - expected) / buffer_len * penalty_factor, 0.0)


@register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """``overlong_buffer_cfg`` is ``reward_model.overlong_buffer`` (an `OverlongBufferConfig` or a dict of its
    keys: ``enable``, ``len``, ``penalty_factor`` and ``log``, which records ``overlong_reward`` and ``overlong``
    per sample)."""

    def __init__(self, tokenizer, num_examine: int, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", max_resp_len: int | None = None,
                 overlong_buffer_cfg: Any = None, **kwargs) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        cfg = OverlongBufferConfig.from_config(overlong_buffer_cfg)
        self.overlong_enabled, self.buffer_len = cfg.enable, int(cfg.len)
        self.penalty_factor, self.log_overlong = float(cfg.penalty_factor), cfg.log
        self.max_resp_len = max_resp_len
        if self.overlong_enabled:
            if max_resp_len is None:
                raise ValueError("reward_model.overlong_buffer.enable=True needs max_resp_len "
                                 "(data.max_response_length)")
            if not 0 < self.buffer_len <= max_resp_len:
                raise ValueError(f"reward_model.overlong_buffer.len={self.buffer_len} must be positive "
                                 f"and at most the maximum response length ({max_resp_len}, "
                                 "data.max_response_length)")

    def score(self, samples: list[ScoringInput]) -> list[tuple[float, dict]]:
        # A scorer returning a plain number records it as ``acc`` (before any overlong penalty), as
        # the original's DAPO manager does: algorithm.filter_groups.metric=acc reads it.
        results = [(reward, info if info else {"acc": reward}) for reward, info in super().score(samples)]
        if not self.overlong_enabled:
            return results
        shaped = []
        for sample, (reward, info) in zip(samples, results):
            penalty = overlong_penalty(sample.valid_response_length, self.max_resp_len, self.buffer_len,
                                       self.penalty_factor)
            if self.log_overlong:
                info = {**info, "overlong_reward": penalty, "overlong": penalty < 0}
            shaped.append((reward + penalty, info))
        return shaped
