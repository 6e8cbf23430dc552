"""The workers' pure helpers: micro-batch splitting, batch-size normalisation, data checks, score placement."""

import os

import pytest
import torch

from verl.protocol import DataProto
from verl.rewards.model import place_scores
from verl.utils.seqlen_balancing import map_micro_batches, split_micro_batches
from verl.workers.actor import check_finite
from verl.workers.config import CriticConfig
from verl.workers.config.batching import micro_batching, per_rank_mini_batch


def rows_with_lengths(lengths, width=6):
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
    return DataProto.from_dict({"attention_mask": mask, "row": torch.arange(len(lengths))})


def test_split_by_rows_and_by_token_budget():
    data = rows_with_lengths([3, 4, 2, 6, 1])
    assert [p.batch["row"].tolist() for p in split_micro_batches(data, 2)] == [[0, 1], [2, 3], [4]]
    # Budget 7, 16 tokens: at least 3 parts. Karmarkar-Karp over 6, 4, 3, 2, 1: 6 | 4 | 3, then the 2
    # joins the lightest (3 -> 5), then the 1 joins the 4 (-> 5): sums 6, 5, 5, all within the budget.
    parts = split_micro_batches(data, max_token_len=7)
    assert [p.batch["row"].tolist() for p in parts] == [[0, 2], [1, 4], [3]]
    # A row longer than the budget still forms a micro-batch of its own.
    assert [p.batch["row"].tolist() for p in split_micro_batches(data, max_token_len=2)] == [[0], [1], [2], [3], [4]]
    with pytest.raises(ValueError, match="micro_batch_size"):
        split_micro_batches(data, None)


def test_map_micro_batches_returns_rows_in_input_order():
    data = rows_with_lengths([3, 4, 2, 6, 1])
    row = data.batch["row"]
    for micro, budget in ((2, None), (None, 7), (None, 2)):
        doubled, none = map_micro_batches(data, micro, budget, lambda m: (m.batch["row"] * 2, None))
        assert doubled.tolist() == (row * 2).tolist() and none is None
        assert map_micro_batches(data, micro, budget, lambda m: m.batch["row"]).tolist() == row.tolist()


def test_check_finite_names_the_rows():
    data = DataProto.from_dict({"advantages": torch.tensor([[0.0, 1.0], [float("inf"), 0.0], [float("nan"), 1.0]])})
    with pytest.raises(ValueError, match=r"update_actor: batch\['advantages'\] holds NaN or inf in 2 of 3 rows.*\[1, 2\]"):
        check_finite(data, "advantages", "update_actor")
    check_finite(data.slice(0, 1), "advantages", "update_actor")


def test_per_rank_mini_batch_counts_prompts_times_n_over_ranks():
    assert per_rank_mini_batch(4, rollout_n=3, world_size=2, where="actor_rollout_ref.actor") == 6
    with pytest.raises(ValueError, match=r"ppo_mini_batch_size \(4\) x rollout.n \(1\) = 4 sequences .* 3 ranks"):
        per_rank_mini_batch(4, rollout_n=1, world_size=3, where="actor_rollout_ref.actor")


def test_micro_batching_per_gpu_deprecated_global_and_dynamic():
    keys = {"dynamic_key": "use_dynamic_bsz", "token_key": "ppo_max_token_len_per_gpu"}
    where, name = "critic", "ppo_micro_batch_size"
    rows = {**keys, "remove_padding": False}
    critic = CriticConfig.from_dict  # the other keys keep the yaml's defaults (use_dynamic_bsz: null)
    assert micro_batching(critic({"ppo_micro_batch_size_per_gpu": 3}), where, name, 4, **rows) == (3, None)
    assert micro_batching(critic({"ppo_micro_batch_size": 8}), where, name, 4, **rows) == (2, None)
    assert micro_batching(critic({"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 100}), where, name, 4,
                          **rows) == (None, 100)
    with pytest.raises(ValueError, match=r"critic.ppo_micro_batch_size_per_gpu is not set.*critic.use_dynamic_bsz"):
        micro_batching(critic({}), where, name, 4, **rows)
    # Unset with packed forwards: by tokens, whatever the row count says; false keeps rows.
    section = {"ppo_micro_batch_size_per_gpu": 3, "ppo_max_token_len_per_gpu": 100}
    assert micro_batching(critic(section), where, name, 4, **keys, remove_padding=True) == (None, 100)
    assert micro_batching(critic({**section, "use_dynamic_bsz": False}), where, name, 4, **keys,
                          remove_padding=True) == (3, None)


def test_place_scores_at_the_last_valid_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    out = place_scores(torch.tensor([0.5, -2.0, 3.0]), mask)
    assert out.tolist() == [[0, 0, 0.5, 0], [0, 0, 0, -2.0], [3.0, 0, 0, 0]]


def _uneven_ranks(rank, out_dir):
    # rank 0's short rows fit in one part; rank 1's long rows need two
    data = rows_with_lengths([2, 2, 2, 2] if rank == 0 else [6, 6, 6, 6])
    parts = split_micro_batches(data, max_token_len=12)
    torch.save([p.batch["row"].tolist() for p in parts], os.path.join(out_dir, f"rank{rank}.pt"))


def test_dynamic_micro_batches_have_the_same_count_on_every_rank(tmp_path):
    """Each micro-batch is an FSDP forward with collectives: ranks must run the same number of them."""
    from tests.workers.engine.helpers import run_ranks

    run_ranks(_uneven_ranks, 2, tmp_path, str(tmp_path))
    assert torch.load(tmp_path / "rank1.pt") == [[0, 3], [1, 2]]  # 12 tokens per part
    assert torch.load(tmp_path / "rank0.pt") == [[0, 3], [1, 2]]  # 8 tokens fit one part: split to match rank 1
