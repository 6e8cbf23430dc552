"""Balanced partitions of sequences by token count (Karmarkar–Karp).

Two users. Micro-batches (:func:`micro_batch_rows`, :func:`map_micro_batches`; the original's
:func:`rearrange_micro_batches` / :func:`prepare_dynamic_batch` / :func:`restore_dynamic_batch`): rows, or
with token budgets (``use_dynamic_bsz``) :func:`token_budget_partitions`, which cuts a rank's rows into as
few micro-batches under the budget as it can, with similar token sums. And ``trainer.balance_batch``,
which spreads sequences over data-parallel ranks: the driver partitions the batch's sequence lengths into
as many equal-count groups as the actor has data-parallel ranks, then reorders the batch so that rank r's
contiguous chunk holds group r::

    seqlens = batch.batch["attention_mask"].sum(-1).tolist()
    partitions = balance_batch_partitions(seqlens, k=dp_size)
    batch.reorder(torch.tensor([i for part in partitions for i in part]))
    metrics.update(log_seqlen_unbalance(seqlens, partitions))
"""

from __future__ import annotations

import heapq
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


def _numbers(values) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _partial_solution(groups: list[tuple[float, list[int]]]) -> tuple[tuple, list[tuple[float, list[int]]]]:
    """A heap entry for :func:`karmarkar_karp`: ``groups`` sorted heaviest first (by sum, then size, then
    indices, as the original orders its sets), under a key that pops the largest spread first, ties
    going to the heavier top group (the original's order, so both give the same partitions)."""
    groups.sort(key=lambda g: (g[0], len(g[1]), g[1]), reverse=True)
    top_sum, top_indices = groups[0]
    key = (groups[-1][0] - top_sum, -top_sum, -len(top_indices), [-i for i in top_indices])
    return key, groups


def karmarkar_karp(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Partition the indices of ``seqlen_list`` into ``k_partitions`` groups with close sums.

    Method: Karmarkar–Karp largest differencing. Every partial solution holds k groups. With
    ``equal_size`` the indices, sorted by (length, index), are cut into runs of k consecutive items, one
    item per group (``len(seqlen_list)`` must be a multiple of k); otherwise each item starts as a partial
    solution of its own (one group holding it, k-1 empty). Repeatedly the two partial solutions with the
    largest spread (max − min group sum) are merged by joining the heaviest group of one with the
    lightest group of the other, the second heaviest with the second lightest, and so on, so the two
    spreads largely cancel. With ``equal_size`` every merge adds one item to each group, so the counts
    stay equal. Ties are broken as the original breaks them, so the partitions are the same.

    Returns k lists of indices, each sorted ascending, heaviest group first; deterministic. Groups may be
    empty when k > ``len(seqlen_list)``.
    """
    seqlens = _numbers(seqlen_list)
    n, k = len(seqlens), k_partitions
    if k < 1:
        raise ValueError(f"karmarkar_karp: k_partitions must be >= 1, got {k}")
    if equal_size and n % k != 0:
        raise ValueError(f"karmarkar_karp: {n} items cannot be split into {k} groups of equal size")
    if n == 0:
        return [[] for _ in range(k)]
    order = sorted(range(n), key=lambda i: (seqlens[i], i))
    runs = [order[start:start + k] for start in range(0, n, k)] if equal_size else [[i] for i in order]
    heap = [_partial_solution([(seqlens[i], [i]) for i in run] + [(0, []) for _ in range(k - len(run))])
            for run in runs]
    heapq.heapify(heap)
    while len(heap) > 1:
        _, first = heapq.heappop(heap)
        _, second = heapq.heappop(heap)
        merged = [(a_sum + b_sum, a_idx + b_idx) for (a_sum, a_idx), (b_sum, b_idx) in zip(first, reversed(second))]
        heapq.heappush(heap, _partial_solution(merged))
    return [sorted(indices) for _, indices in heap[0][1]]


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int,
                                   equal_size: bool) -> list[list[int]]:
    """:func:`karmarkar_karp` for at least as many items as partitions: ``k_partitions`` non-empty lists
    of indices (each sorted) with close sums of ``seqlen_list``; with ``equal_size`` of equal counts."""
    if len(seqlen_list) < k_partitions:
        raise ValueError(f"get_seqlen_balanced_partitions: {len(seqlen_list)} items cannot fill "
                         f"{k_partitions} partitions")
    partitions = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    if not all(partitions):  # only an item-less merge could leave one empty; say so rather than return it
        raise ValueError(f"get_seqlen_balanced_partitions: a partition came out empty for {k_partitions} "
                         f"partitions of {len(seqlen_list)} items")
    return partitions


def calculate_workload(seqlen_list):
    """Relative cost of sequences of these lengths for a 7B-sized model (hidden 4096): the matmuls grow
    as 12·h²·s and attention as 2·h·s², i.e. ∝ 24576·s + s². Works on tensors, arrays and numbers."""
    return 24576 * seqlen_list + seqlen_list ** 2


def get_group_balanced_partitions(seqlen_list: Sequence[int], uid_list: Sequence, k_partitions: int) -> list[list[int]]:
    """Partition samples into ``k_partitions`` ranks keeping each group of consecutive samples with the
    same uid (the n responses of one prompt) together: the groups, weighed by the summed
    :func:`calculate_workload` of their samples, are spread by :func:`karmarkar_karp` in equal numbers
    per rank. Returns the sample indices of each rank, sorted."""
    if len(seqlen_list) != len(uid_list):
        raise ValueError(f"get_group_balanced_partitions: {len(seqlen_list)} sequence lengths but "
                         f"{len(uid_list)} uids")
    seqlens = _numbers(seqlen_list)
    groups: list[list[int]] = []
    for i, uid in enumerate(uid_list):
        if groups and uid_list[groups[-1][0]] == uid:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) < k_partitions:
        raise ValueError(f"get_group_balanced_partitions: {len(groups)} uid groups cannot fill {k_partitions} "
                         "partitions; use fewer ranks or a larger batch")
    workloads = [sum(calculate_workload(int(seqlens[i])) for i in group) for group in groups]
    partitions = get_seqlen_balanced_partitions(workloads, k_partitions, equal_size=True)
    return [sorted(i for g in part for i in groups[g]) for part in partitions]


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


def log_seqlen_unbalance(seqlen_list: Sequence[int], partitions: list[list[int]],
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
    seqlens = _numbers(seqlen_list)
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
def all_reduce_scalar(value: float, op=dist.ReduceOp.SUM, group=None) -> float:
    """``value`` reduced over the ranks of ``group`` (default: the default process group; itself without
    one), in float64."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op, group=group)
    return float(tensor.item())


def _agreed_partitions(lengths: list[int], max_token_len: int, min_parts: int = 1, group=None,
                       same_count: bool = True, divisible_by: int | None = None) -> list[list[int]]:
    """:func:`token_budget_partitions` of ``lengths``, their count agreed by the ranks of ``group`` (the
    largest any rank needs, when ``same_count``) and rounded up to a multiple of ``divisible_by``.

    Every micro-batch is an FSDP forward with collectives, so ranks that ran different numbers would hang.
    """
    if max_token_len <= 0:
        raise ValueError(f"max_token_len must be positive, got {max_token_len}")

    def target(count: int) -> int:
        if same_count:
            count = int(all_reduce_scalar(count, dist.ReduceOp.MAX, group))
        return -(-count // divisible_by) * divisible_by if divisible_by else count

    parts = token_budget_partitions(lengths, max_token_len, min_parts)
    count = target(len(parts))
    while True:  # every rank leaves this loop in the same round: `agreed` and `count` are global
        if len(parts) != count:
            parts = token_budget_partitions(lengths, max_token_len, min_parts=count)
        agreed = target(len(parts))
        if agreed == count:
            if len(parts) < count:  # fewer rows here than micro-batches elsewhere: the collectives would hang
                raise RuntimeError(f"this rank has {len(lengths)} rows but needs {count} micro-batches (the most any "
                                   "rank needs, rounded up to a multiple of num_batches_divided_by); every rank must "
                                   "receive the same number of rows, at least that many")
            return parts
        count = agreed


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
    return _agreed_partitions(data.batch["attention_mask"].sum(-1).tolist(), max_token_len)


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

    def join(tensors):
        joined = torch.cat(tensors)
        # With token budgets the micro-batches hold rows out of order: put them back.
        return joined if max_token_len is None else restore_dynamic_batch(joined, parts)

    if isinstance(outputs[0], tuple):
        return tuple(None if outs[0] is None else join(outs) for outs in zip(*outputs))
    return join(outputs)


def _select_rows(batch, rows: list[int]):
    index = torch.tensor(rows, dtype=torch.long)
    if isinstance(batch, dict):
        return {key: value[index.to(value.device)] for key, value in batch.items()}
    return batch[index.to(batch.device) if batch.device is not None else index]


def rearrange_micro_batches(batch, max_token_len: int, dp_group=None, num_batches_divided_by: int | None = None,
                            same_micro_num_in_dp: bool = True, min_num_micro_batch: int | None = None,
                            use_dynamic_bsz_balance: bool = True):
    """Split ``batch`` (a TensorDict or a dict of tensors with an ``attention_mask``) into micro-batches of
    at most ``max_token_len`` real tokens each (:func:`token_budget_partitions`; a longer row alone).

    - ``dp_group``, ``same_micro_num_in_dp``: the ranks of the group agree on one count (the largest);
    - ``num_batches_divided_by``: the count is rounded up to a multiple of it (pipeline stages);
    - ``min_num_micro_batch``: at least that many;
    - ``use_dynamic_bsz_balance``: the micro-batches are ordered by :func:`calculate_workload`, the
      heaviest in the middle and the lightest at both ends (smaller pipeline bubbles); otherwise by
      their first row.

    Returns ``(micro_batches, partitions)``: the micro-batches and, for each, the indices of its rows in
    ``batch`` (ascending); :func:`restore_dynamic_batch` puts outputs back in the batch's order.
    """
    lengths = batch["attention_mask"].sum(-1).tolist()
    parts = _agreed_partitions(lengths, max_token_len, max(1, min_num_micro_batch or 1), group=dp_group,
                               same_count=same_micro_num_in_dp, divisible_by=num_batches_divided_by)
    if use_dynamic_bsz_balance:
        workloads = [calculate_workload(length) for length in lengths]
        parts.sort(key=lambda part: (sum(workloads[i] for i in part), part[0]), reverse=True)
        parts = parts[::2][::-1] + parts[1::2]
    return [_select_rows(batch, part) for part in parts], parts


def prepare_dynamic_batch(data: DataProto, max_token_len: int, dp_group=None,
                          num_batches_divided_by: int | None = None, same_micro_num_in_dp: bool = True,
                          min_num_micro_batch: int | None = None,
                          use_dynamic_bsz_balance: bool = True) -> tuple[list[DataProto], list[list[int]]]:
    """:func:`rearrange_micro_batches` for a ``DataProto``: ``(micro-batch DataProtos, row indices of each)``."""
    _, parts = rearrange_micro_batches(data.batch, max_token_len, dp_group, num_batches_divided_by,
                                       same_micro_num_in_dp, min_num_micro_batch, use_dynamic_bsz_balance)
    return [data[part] for part in parts], parts


def restore_dynamic_batch(data: torch.Tensor, batch_idx_list: list[list[int]]) -> torch.Tensor:
    """The rows of ``data`` (micro-batch outputs concatenated in the order of ``batch_idx_list``) put back in
    the order of the batch they came from."""
    order = torch.tensor([i for part in batch_idx_list for i in part], dtype=torch.long)
    if order.numel() != data.shape[0]:
        raise ValueError(f"restore_dynamic_batch: {data.shape[0]} rows but the partitions index {order.numel()}")
    return data[torch.argsort(order).to(data.device)]
