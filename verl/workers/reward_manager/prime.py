"""The ``prime`` reward manager: the samples of a batch scored concurrently, each with a time limit.

As the original's: up to ``num_workers`` samples at once (64), and a sample whose score is not ready
``timeout`` seconds (300) after the batch was handed out scores 0.0 with a warning. A plain-number score is
also recorded as ``acc`` (the original puts it in the batch as ``acc``; ``algorithm.filter_groups.metric=acc``
reads it).

The work runs on threads. The scorers that run model text -- code sources and ``numina_*`` -- grade in
sandbox processes, so they run side by side; a pure-Python scoring function gains little (one
interpreter lock). A scoring function that raises stops the run naming the sample, as with ``naive`` (the
original scores it 0.0).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Callable

from verl.workers.reward_manager.naive import NaiveRewardManager, ScoringInput
from verl.workers.reward_manager.registry import register

__all__ = ["PrimeRewardManager"]

logger = logging.getLogger(__name__)


@register("prime")
class PrimeRewardManager(NaiveRewardManager):
    def __init__(self, tokenizer, num_examine: int, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", num_workers: int = 64, timeout: float = 300.0,
                 **kwargs) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        if num_workers < 1 or timeout <= 0:
            raise ValueError(f"the prime reward manager needs num_workers >= 1 and timeout > 0, got "
                             f"num_workers={num_workers}, timeout={timeout}")
        self.num_workers = int(num_workers)
        self.timeout = float(timeout)

    def score(self, samples: list[ScoringInput]) -> list[tuple[float, dict]]:
        pool = concurrent.futures.ThreadPoolExecutor(min(self.num_workers, max(1, len(samples))),
                                                     thread_name_prefix="prime-reward")
        try:
            futures = [pool.submit(self.score_one, i, sample) for i, sample in enumerate(samples)]
            deadline = time.monotonic() + self.timeout
            results = []
            for i, (sample, future) in enumerate(zip(samples, futures)):
                try:
                    reward, info = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    logger.warning("prime reward manager: sample %d (data_source=%r) was not scored within %g s; "
                                   "it scores 0.0. Response starts %r", i, sample.data_source, self.timeout,
                                   sample.response[:120])
                    reward, info = 0.0, {}
                results.append((reward, info))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # a scorer still running past the limit is left behind
        # every sample reports the same keys: ``acc`` for plain numbers, a dict scorer's keys (0 when timed out)
        keys = next((list(info) for _, info in results if info), None)
        if keys is None:
            return [(reward, {"acc": reward}) for reward, _ in results]
        return [(reward, info or dict.fromkeys(keys, 0.0)) for reward, info in results]
