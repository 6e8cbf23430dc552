import random

import pytest

from verl.utils.seqlen_balancing import balance_batch_partitions, log_seqlen_unbalance


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
