"""Balanced partitions of sequences by token count (Karmarkar–Karp).

Two users. Token-budget micro-batches (``use_dynamic_bsz``): :func:`token_budget_partitions` cuts a
rank's rows into as few micro-batches under the budget as it can, with similar token sums. And
``trainer.balance_batch``, which spreads sequences over data-parallel ranks: the driver partitions
the batch's sequence lengths into as many equal-count groups as the actor has data-parallel ranks,
then reorders the batch so that rank r's contiguous chunk holds group r::

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
    keeping the groups' token sums close (:func:`karmarkar_karp` in its equal-count form).

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
    return karmarkar_karp(seqlens, k, equal_size=True)


def karmarkar_karp(seqlens: Sequence[int], k: int, *, equal_size: bool) -> list[list[int]]:
    """Partition the indices of ``seqlens`` into ``k`` groups with close token sums.

    Method: Karmarkar–Karp largest differencing. Every partial solution holds ``k`` groups. With
    ``equal_size`` the indices, sorted by length, are cut into runs of k consecutive items, one item
    per group (``len(seqlens)`` must be a multiple of ``k``); otherwise each item starts as a partial
    solution of its own (one group holding it, k-1 empty). Repeatedly the two partial solutions with
    the largest spread (max − min group sum) are merged by joining the heaviest group of one with the
    lightest group of the other, the second heaviest with the second lightest, and so on, so the two
    spreads largely cancel. With ``equal_size`` every merge adds one item to each group, so the counts
    stay equal.

    Returns ``k`` lists of indices, each sorted ascending; deterministic. Groups may be empty when
    ``k > len(seqlens)``.
    """
    n = len(seqlens)
    if k < 1:
        raise ValueError(f"karmarkar_karp: k must be >= 1, got {k}")
    if n == 0:
        return [[] for _ in range(k)]
    order = sorted(range(n), key=lambda i: (seqlens[i], i))
    runs = ([order[start:start + k] for start in range(0, n, k)] if equal_size else [[i] for i in order])
    tie_breaker = itertools.count()
    heap = []  # entries: (-spread, tie, groups); groups is a list of (sum, [indices]), heaviest first
    for run in runs:
        groups = sorted(((seqlens[i], [i]) for i in run), key=lambda g: -g[0])
        groups += [(0, []) for _ in range(k - len(groups))]
        heapq.heappush(heap, (-(groups[0][0] - groups[-1][0]), next(tie_breaker), groups))

    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a_sum + b_sum, a_idx + b_idx)
                  for (a_sum, a_idx), (b_sum, b_idx) in zip(first, reversed(second))]
        merged.sort(key=lambda g: -g[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), next(tie_breaker), merged))

    return [sorted(indices) for _, indices in heap[0][2]]


def token_budget_partitions(seqlens: Sequence[int], max_token_len: int, min_parts: int = 1) -> list[list[int]]:
    """Micro-batches of at most ``max_token_len`` tokens each (a sequence longer than the budget gets
    one of its own), with balanced token sums, and at least ``min_parts`` of them (so that data-parallel
    ranks can agree on one count). Returns index lists ordered by their first index; every index once.

    Method: first-fit decreasing gives a count that surely fits; :func:`karmarkar_karp` then tries to
    balance the rows over fewer parts (from the lower bound: the tokens over the budget, and one part
    per row longer than half of it), keeping the first try that fits. When none does, the first-fit
    parts are kept, their heaviest halved until there are ``min_parts``.
    """
    n = len(seqlens)
    if max_token_len <= 0:
        raise ValueError(f"max_token_len must be positive, got {max_token_len}")
    if n == 0:
        return []
    fitting = [length for length in seqlens if length <= max_token_len]
    lower = (n - len(fitting)) + max(-(-sum(fitting) // max_token_len),
                                     sum(1 for length in fitting if 2 * length > max_token_len))
    first_fit = _first_fit_decreasing(seqlens, max_token_len)
    start = min(max(min_parts, lower, 1), n)
    for k in range(start, max(start + 1, min(start + 3, len(first_fit)))):  # a few balanced tries
        if k == n:
            return [[i] for i in range(n)]
        parts = _exactly(karmarkar_karp(seqlens, k, equal_size=False), k, seqlens)
        if all(len(p) == 1 or sum(seqlens[i] for i in p) <= max_token_len for p in parts):
            return sorted(parts, key=lambda p: p[0])
    return sorted(_exactly(first_fit, max(min_parts, len(first_fit)), seqlens), key=lambda p: p[0])


def _first_fit_decreasing(seqlens: Sequence[int], budget: int) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(seqlens)), key=lambda i: (-seqlens[i], i)):
        target = next((b for b, load in enumerate(loads) if load + seqlens[i] <= budget), None)
        if target is None:
            bins.append([i])
            loads.append(seqlens[i])
        else:
            bins[target].append(i)
            loads[target] += seqlens[i]
    return [sorted(b) for b in bins]


def _exactly(parts: list[list[int]], k: int, seqlens: Sequence[int]) -> list[list[int]]:
    """``parts`` without empty ones, the heaviest multi-row part halved until there are ``k``."""
    parts = [p for p in parts if p]
    while len(parts) < k:
        heaviest = max((p for p in parts if len(p) > 1), key=lambda p: sum(seqlens[i] for i in p))
        parts.remove(heaviest)
        parts += [heaviest[:len(heaviest) // 2], heaviest[len(heaviest) // 2:]]
    return parts


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
