"""Balanced partitions of sequences by token count (Karmarkar–Karp).

Two users. Micro-batches (:func:`micro_batch_rows`, :func:`map_micro_batches`): rows, or with token budgets
(``use_dynamic_bsz``) :func:`token_budget_partitions`, which cuts a rank's rows into as few micro-batches
under the budget as it can, with similar token sums. And
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

import torch
import torch.distributed as dist

from verl.protocol import DataProto


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
        raise ValueError(f"balance_batch_partitions: {n} sequences cannot be split into {k} equal-count groups; "
                         f"the batch size must be a multiple of the number of data-parallel ranks ({k})")
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


# ------------------------------------------------------------------------------------------------ micro-batches
def all_reduce_scalar(value: float, op=dist.ReduceOp.SUM) -> float:
    """``value`` reduced over the ranks of the default process group (itself without one), in float64."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return float(tensor.item())


def micro_batch_rows(data: DataProto, micro_batch_size: int | None = None,
                     max_token_len: int | None = None) -> list[list[int]] | list[slice]:
    """The rows of each micro-batch of ``data``: consecutive slices of ``micro_batch_size`` rows or, when
    ``max_token_len`` is given (``use_dynamic_bsz``), index lists of as few micro-batches as hold at
    most that many real tokens (attention-mask sum) each, with balanced token sums
    (:func:`~verl.utils.seqlen_balancing.token_budget_partitions`). A row longer than the budget is a
    micro-batch of its own.

    With token budgets every rank uses the same number of micro-batches (the largest any rank needs):
    each micro-batch is an FSDP forward with collectives, so ranks that ran different numbers would hang.
    """
    if max_token_len is None:
        if not micro_batch_size or micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be a positive number of rows, got {micro_batch_size!r}")
        return [slice(start, start + micro_batch_size) for start in range(0, len(data), micro_batch_size)]
    if max_token_len <= 0:
        raise ValueError(f"max_token_len must be positive, got {max_token_len}")
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    parts = token_budget_partitions(lengths, max_token_len)
    count = int(all_reduce_scalar(len(parts), dist.ReduceOp.MAX))
    while True:  # every rank leaves this loop in the same round: `agreed` and `count` are global
        if len(parts) != count:
            parts = token_budget_partitions(lengths, max_token_len, min_parts=count)
        agreed = int(all_reduce_scalar(len(parts), dist.ReduceOp.MAX))
        if agreed == count:
            if len(parts) < count:  # fewer rows here than micro-batches elsewhere: the collectives would hang
                raise RuntimeError(f"this rank has {len(lengths)} rows but the ranks agreed on {count} micro-batches; "
                                   "every rank must receive the same number of rows")
            return parts
        count = agreed


def split_micro_batches(data: DataProto, micro_batch_size: int | None = None,
                        max_token_len: int | None = None) -> list[DataProto]:
    """The micro-batches of :func:`micro_batch_rows` (for the update, where row order does not matter)."""
    return [data[rows] for rows in micro_batch_rows(data, micro_batch_size, max_token_len)]


def map_micro_batches(data: DataProto, micro_batch_size: int | None, max_token_len: int | None, fn):
    """``fn`` on each micro-batch of ``data``; its output tensors (or tuples of tensors and Nones) are
    concatenated back in the rows' input order."""
    parts = micro_batch_rows(data, micro_batch_size, max_token_len)
    outputs = [fn(data[rows]) for rows in parts]
    if not outputs:
        raise ValueError("map_micro_batches: the batch has no rows")
    # With token budgets the micro-batches hold rows out of order: the inverse permutation puts them back.
    inverse = None if max_token_len is None else torch.argsort(torch.tensor([i for rows in parts for i in rows]))

    def join(tensors):
        joined = torch.cat(tensors)
        return joined if inverse is None else joined[inverse.to(joined.device)]

    if isinstance(outputs[0], tuple):
        return tuple(None if outs[0] is None else join(outs) for outs in zip(*outputs))
    return join(outputs)
