"""The ``prime`` reward manager: the samples of a batch scored concurrently, each with a time limit.

As the original's: up to ``num_workers`` samples at once (64), and a sample whose score is not ready
``timeout`` seconds (300) after the batch was handed out scores 0.0 with a warning. A plain-number score is
also recorded as ``acc`` (the original puts it in the batch as ``acc``; ``algorithm.filter_groups.metric=acc``
reads it).

The work runs on daemon threads (a scorer still running past the limit is left behind and does not keep
the trainer from exiting). The scorers that run model text -- code sources and ``numina_*`` -- grade in
sandbox processes, so they run side by side (``numina_*``: as many workers as CPUs, at most 16); a
pure-Python scoring function gains little (one interpreter lock). A scoring function that raises stops the
run naming the sample, as with ``naive`` (the original scores it 0.0).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from typing import Callable

from verl.rewards.managers.naive import NaiveRewardManager, ScoringInput
from verl.rewards.managers.registry import register

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
        futures = [concurrent.futures.Future() for _ in samples]
        todo = queue.SimpleQueue()
        for item in enumerate(samples):
            todo.put(item)

        def work() -> None:
            while True:
                try:
                    i, sample = todo.get_nowait()
                except queue.Empty:
                    return
                if not futures[i].set_running_or_notify_cancel():
                    continue  # the batch was given up on
                try:
                    futures[i].set_result(self.score_one(i, sample))
                except BaseException as exc:
                    futures[i].set_exception(exc)

        # Daemon threads: a scorer still running past the limit must not keep the trainer from exiting.
        for _ in range(min(self.num_workers, len(samples))):
            threading.Thread(target=work, name="prime-reward", daemon=True).start()
        deadline = time.monotonic() + self.timeout
        results: list[tuple[float, dict] | None] = []
        try:
            for i, (sample, future) in enumerate(zip(samples, futures)):
                try:
                    results.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
                except concurrent.futures.TimeoutError:
                    logger.warning("prime reward manager: sample %d (data_source=%r) was not scored within %g s; "
                                   "it scores 0.0. Response starts %r", i, sample.data_source, self.timeout,
                                   sample.response[:120])
                    results.append(None)
        finally:
            for future in futures:
                future.cancel()  # those not started yet
        scored = [info for result in results if result is not None for info in [result[1]]]
        if not any(scored):  # plain numbers: recorded as acc
            return [(0.0, {"acc": 0.0}) if r is None else (r[0], {"acc": r[0]}) for r in results]
        keys = next(info for info in scored if info)
        # a timed-out sample reports 0 for the scorer's keys; others must agree as with naive (checked there)
        return [(0.0, dict.fromkeys(keys, 0.0)) if r is None else r for r in results]
