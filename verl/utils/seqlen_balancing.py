"""Spread sequences over data-parallel ranks so that every rank gets a similar number of tokens.

Used by ``trainer.balance_batch``: the driver partitions the batch's sequence lengths into as many
equal-count groups as the actor has data-parallel ranks, then reorders the batch so that rank r's
contiguous chunk holds group r::

    seqlens = batch.batch["attention_mask"].sum(-1).tolist()
    partitions = balance_batch_partitions(seqlens, k=dp_size)
    batch.reorder(torch.tensor([i for part in partitions for i in part]))
    metrics.update(log_seqlen_unbalance(seqlens, partitions))
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


def balance_batch_partitions(seqlens: Sequence[int], k: int) -> list[list[int]]:
    """Split the indices of ``seqlens`` into ``k`` groups of exactly ``len(seqlens) / k`` indices each,
    keeping the groups' token sums close.

    Method: Karmarkar–Karp largest differencing, in its equal-count form. The indices, sorted by
    length, are cut into runs of k consecutive items; each run is a partial solution with one item
    per group. Repeatedly the two partial solutions with the largest spread (max − min group sum)
    are merged by joining the heaviest group of one with the lightest group of the other, the second
    heaviest with the second lightest, and so on, so the two spreads largely cancel. Every merge
    adds one item from each run to each group, so the counts stay equal.

    Returns ``k`` lists of indices, each sorted ascending (rows keep their original relative order
    inside a rank, so samples of one prompt stay next to each other where they can). Deterministic.
    """
    n = len(seqlens)
    if k < 1:
        raise ValueError(f"balance_batch_partitions: k must be >= 1, got {k}")
    if n % k != 0:
        raise ValueError(
            f"balance_batch_partitions: {n} sequences cannot be split into {k} equal-count groups; "
            f"the batch size must be a multiple of the number of data-parallel ranks ({k})"
        )
    if n == 0:
        return [[] for _ in range(k)]

    order = sorted(range(n), key=lambda i: (seqlens[i], i))
    tie_breaker = itertools.count()
    heap = []  # entries: (-spread, tie, groups); groups is a list of (sum, [indices]), heaviest first
    for start in range(0, n, k):
        groups = sorted(((seqlens[i], [i]) for i in order[start:start + k]), key=lambda g: -g[0])
        heapq.heappush(heap, (-(groups[0][0] - groups[-1][0]), next(tie_breaker), groups))

    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a_sum + b_sum, a_idx + b_idx)
                  for (a_sum, a_idx), (b_sum, b_idx) in zip(first, reversed(second))]
        merged.sort(key=lambda g: -g[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), next(tie_breaker), merged))

    return [sorted(indices) for _, indices in heap[0][2]]


def log_seqlen_unbalance(seqlens: Sequence[int], partitions: list[list[int]],
                         prefix: str = "global_seqlen") -> dict[str, float]:
    """Token-count balance metrics, before and after balancing.

    - ``<prefix>/min``, ``/max``, ``/minmax_diff``: token sums per rank if the batch were split into
      ``len(partitions)`` contiguous chunks in its current order (what every rank gets without
      balancing);
    - ``<prefix>/balanced_min``, ``/balanced_max``: token sums per rank of ``partitions``;
    - ``<prefix>/mean``: total tokens / number of ranks.
    """
    k = len(partitions)
    if k == 0:
        raise ValueError("log_seqlen_unbalance: partitions is empty")
    n = len(seqlens)
    chunk = -(-n // k)  # ceil, as DataProto.chunk would split
    naive = [sum(seqlens[start:start + chunk]) for start in range(0, chunk * k, chunk)]
    balanced = [sum(seqlens[i] for i in part) for part in partitions]
    return {
        f"{prefix}/min": float(min(naive)),
        f"{prefix}/max": float(max(naive)),
        f"{prefix}/minmax_diff": float(max(naive) - min(naive)),
        f"{prefix}/balanced_min": float(min(balanced)),
        f"{prefix}/balanced_max": float(max(balanced)),
        f"{prefix}/mean": float(sum(seqlens)) / k,
    }
