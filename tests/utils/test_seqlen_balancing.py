import random

import pytest

import torch
from tensordict import TensorDict

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import (
    balance_batch_partitions,
    calculate_workload,
    get_group_balanced_partitions,
    get_seqlen_balanced_partitions,
    karmarkar_karp,
    log_seqlen_unbalance,
    prepare_dynamic_batch,
    rearrange_micro_batches,
    restore_dynamic_batch,
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
    # (of the spread-1 pair, the one whose top group is heavier): heaviest with lightest -> 4+7 | 0+8 = 11|8 (3);
    # with 6|5 ->
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


def test_seqlen_balanced_partitions_by_hand():
    # [4, 3, 2, 1], equal counts: runs by length (1, 2) = rows 3, 2 and (3, 4) = rows 1, 0; both spread 1, the
    # heavier top (4) goes first: 4 + 1 | 3 + 2 -> rows {0, 3} = 5 and {1, 2} = 5; equal sums, larger indices first.
    assert get_seqlen_balanced_partitions([4, 3, 2, 1], 2, equal_size=True) == [[1, 2], [0, 3]]
    with pytest.raises(ValueError, match="cannot fill"):
        get_seqlen_balanced_partitions([1], 2, equal_size=False)
    with pytest.raises(ValueError, match="equal size"):
        get_seqlen_balanced_partitions([1, 2, 3], 2, equal_size=True)


def test_ties_break_as_the_original_breaks_them():
    # Four rows of 2, 2 groups, each row alone (spread 2 each): ties pop the state whose top group is larger,
    # by (sum, size, indices): row 3, then row 2 -> 2|2 (rows 3 | 2); rows 1 and 0 -> 2|2 (rows 1 | 0).
    # Spread 0 both; [3] > [1], so {3|2} pops first: 3 joins 0 and 2 joins 1 -> {0, 3}, {1, 2}.
    assert karmarkar_karp([2, 2, 2, 2], 2, equal_size=False) == [[0, 3], [1, 2]]
    assert karmarkar_karp(torch.tensor([2, 2, 2, 2]), 2, False) == [[0, 3], [1, 2]]  # tensors work too


def test_group_balanced_partitions_keep_a_prompts_samples_together():
    assert calculate_workload(2) == 24576 * 2 + 4
    # uids a a b b c c d d, lengths 1 1 2 2 3 3 4 4; workloads per group: a 2*(24576 + 1) = 49154,
    # b 2*(49152 + 4) = 98312, c 2*(73728 + 9) = 147474, d 2*(98304 + 16) = 196640.
    # Runs (a, b) spread 49158 and (c, d) spread 49166: d + a = 245794 | c + b = 245786.
    parts = get_group_balanced_partitions([1, 1, 2, 2, 3, 3, 4, 4], list("aabbccdd"), 2)
    assert parts == [[0, 1, 6, 7], [2, 3, 4, 5]]
    with pytest.raises(ValueError, match="uid groups"):
        get_group_balanced_partitions([1, 1], ["a", "a"], 2)


def padded_batch(lengths, width=4):
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    return TensorDict({"attention_mask": mask, "row": torch.arange(len(lengths))}, batch_size=[len(lengths)])


def test_rearrange_micro_batches_by_hand():
    # Lengths 4 4 2 1 3, budget 4: at least 4 micro-batches (14 tokens; three rows over half the budget);
    # {0}, {1}, {2, 3}, {4}. Workloads: 24576*4 + 16 = 98320 for rows 0 and 1, 24576*3 + 4 + 1 = 73733 for
    # {2, 3}, 24576*3 + 9 = 73737 for {4}. Heaviest first (ties: later first row): [1], [0], [4], [2, 3];
    # lightest at both ends: even places reversed, then odd ones -> [4], [1], [0], [2, 3].
    batch = padded_batch([4, 4, 2, 1, 3])
    micro, parts = rearrange_micro_batches(batch, max_token_len=4)
    assert parts == [[4], [1], [0], [2, 3]]
    assert [m["row"].tolist() for m in micro] == parts
    _, plain = rearrange_micro_batches(batch, max_token_len=4, use_dynamic_bsz_balance=False)
    assert plain == [[0], [1], [2, 3], [4]]
    _, padded = rearrange_micro_batches(batch, max_token_len=4, num_batches_divided_by=5)  # 4 -> 5
    assert len(padded) == 5 and sorted(i for p in padded for i in p) == list(range(5))
    with pytest.raises(RuntimeError, match="micro-batches"):
        rearrange_micro_batches(batch, max_token_len=4, num_batches_divided_by=3)  # 6 micro-batches of 5 rows
    assert len(rearrange_micro_batches(batch, max_token_len=16, min_num_micro_batch=2)[1]) == 2
    dict_micro, _ = rearrange_micro_batches({"attention_mask": batch["attention_mask"]}, max_token_len=4)
    assert dict_micro[1]["attention_mask"].tolist() == [[1, 1, 1, 1]]  # row 1


def test_prepare_and_restore_dynamic_batch_round_trip():
    data = DataProto.from_dict({"attention_mask": padded_batch([4, 4, 2, 1, 3])["attention_mask"],
                                "row": torch.arange(5)})
    micro, parts = prepare_dynamic_batch(data, max_token_len=4)
    assert [m.batch["row"].tolist() for m in micro] == parts
    outputs = torch.cat([m.batch["row"] * 10 for m in micro])  # in micro-batch order
    assert restore_dynamic_batch(outputs, parts).tolist() == [0, 10, 20, 30, 40]
    with pytest.raises(ValueError, match="rows"):
        restore_dynamic_batch(outputs[:3], parts)
