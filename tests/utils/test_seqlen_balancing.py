import random

import pytest

from verl.utils.seqlen_balancing import (
    balance_batch_partitions,
    karmarkar_karp,
    log_seqlen_unbalance,
    token_budget_partitions,
)


def check_partition(partitions, n, k):
    assert len(partitions) == k
    assert all(len(p) == n // k for p in partitions)
    assert sorted(i for p in partitions for i in p) == list(range(n))
    assert all(p == sorted(p) for p in partitions)


def test_hand_case():
    seqlens = [10, 1, 1, 10]
    parts = balance_batch_partitions(seqlens, 2)
    check_partition(parts, 4, 2)
    assert sorted(sum(seqlens[i] for i in p) for p in parts) == [11, 11]


def test_metrics_hand_case():
    seqlens = [10, 10, 1, 1]  # contiguous halves: 20 and 2
    parts = balance_batch_partitions(seqlens, 2)
    assert log_seqlen_unbalance(seqlens, parts) == {
        "global_seqlen/min": 2.0, "global_seqlen/max": 20.0, "global_seqlen/minmax_diff": 18.0,
        "global_seqlen/balanced_min": 11.0, "global_seqlen/balanced_max": 11.0, "global_seqlen/mean": 11.0,
    }
    assert "x/mean" in log_seqlen_unbalance(seqlens, parts, prefix="x")


@pytest.mark.parametrize("n,k", [(64, 8), (96, 4), (7, 7), (6, 1), (256, 8)])
def test_random_batches_are_valid_and_better_than_contiguous(n, k):
    rng = random.Random(n * 31 + k)
    seqlens = [rng.randint(20, 2000) for _ in range(n)]
    parts = balance_batch_partitions(seqlens, k)
    check_partition(parts, n, k)
    assert parts == balance_batch_partitions(seqlens, k)  # deterministic
    m = log_seqlen_unbalance(seqlens, parts)
    spread = m["global_seqlen/balanced_max"] - m["global_seqlen/balanced_min"]
    assert spread <= m["global_seqlen/minmax_diff"]
    if n // k >= 8:
        assert spread <= max(seqlens) - min(seqlens)  # differencing cancels most of the imbalance


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple"):
        balance_batch_partitions([1, 2, 3], 2)
    with pytest.raises(ValueError, match="k must be"):
        balance_batch_partitions([1, 2], 0)
    assert balance_batch_partitions([], 3) == [[], [], []]


def test_unequal_karmarkar_karp_hand_case():
    # Lengths 8, 7, 6, 5, 4 (rows 0..4), 2 groups; each row starts alone: [8|0] ... [4|0].
    # Largest spreads first: 8 with 7 -> 8|7 (spread 1); 6 with 5 -> 6|5 (1); 4|0 (spread 4) with 8|7
    # (the older of the spread-1 pair): heaviest with lightest -> 4+7 | 0+8 = 11|8 (3); with 6|5 ->
    # 11+5 | 8+6 = 16|14: rows {1, 3, 4} and {0, 2}.
    assert karmarkar_karp([8, 7, 6, 5, 4], 2, equal_size=False) == [[1, 3, 4], [0, 2]]


@pytest.mark.parametrize("seed", range(5))
def test_token_budget_partitions_fit_the_budget_with_few_parts(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(50, 900) for _ in range(rng.randint(20, 300))]
    budget = rng.choice([1000, 4096, 16384])
    parts = token_budget_partitions(lengths, budget)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= budget for p in parts)
    consecutive, tokens = 1, 0  # what packing rows in their order would need
    for length in lengths:
        if tokens and tokens + length > budget:
            consecutive, tokens = consecutive + 1, 0
        tokens += length
    assert -(-sum(lengths) // budget) <= len(parts) <= consecutive
    forced = token_budget_partitions(lengths, budget, min_parts=len(parts) + 3)
    assert len(forced) == len(parts) + 3 and sorted(i for p in forced for i in p) == list(range(len(lengths)))


def test_token_budget_partitions_long_rows_and_bad_budget():
    assert token_budget_partitions([5, 1, 1], 3) == [[0], [1, 2]]  # the 5-token row alone, over the budget
    assert token_budget_partitions([], 10) == []
    with pytest.raises(ValueError, match="max_token_len must be positive"):
        token_budget_partitions([1], 0)
