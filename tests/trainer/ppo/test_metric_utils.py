import json
import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_rollout_probs_diff,
    compute_throughout_metrics,
    compute_timing_metrics,
    explained_variance,
    flatten_validation_metrics,
    process_validation_metrics,
    reduce_metrics,
)

PAD = 99.0  # values at masked positions; no metric may see them


def two_sample_batch(with_values=True):
    """P = 3, R = 4. Sample 0: prompt length 2, response length 4 (hits R). Sample 1: prompt length
    3 (hits P), response length 2."""
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    tensors = {
        "prompts": torch.zeros(2, 3, dtype=torch.long),
        "responses": torch.zeros(2, 4, dtype=torch.long),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "response_mask": response_mask,
        # Scores and rewards are zero outside the response (a reward manager writes only inside it).
        "token_level_scores": torch.tensor([[0, 0, 0, 1.0], [0, 0.5, 0, 0]]),
        "token_level_rewards": torch.tensor([[0, 0, -0.1, 1.0], [0.2, 0.5, 0, 0]]),
        "advantages": torch.tensor([[1.0, 2, 3, 4], [-1, -2, PAD, PAD]]),
        "returns": torch.tensor([[1.0, 1, 1, 1], [3, 3, PAD, PAD]]),
    }
    if with_values:
        tensors["values"] = torch.tensor([[1.0, 1, 1, 2], [3, 2, PAD, PAD]])
    return DataProto.from_dict(tensors)


def test_data_metrics_hand_computed():
    m = compute_data_metrics(two_sample_batch(), use_critic=True)
    expected = {
        # per-sequence sums: scores 1.0 and 0.5; rewards 0.9 and 0.7
        "critic/score/mean": 0.75, "critic/score/max": 1.0, "critic/score/min": 0.5,
        "critic/rewards/mean": 0.8, "critic/rewards/max": 0.9, "critic/rewards/min": 0.7,
        # valid tokens: advantages 1,2,3,4,-1,-2; returns 1,1,1,1,3,3; values 1,1,1,2,3,2
        "critic/advantages/mean": 7 / 6, "critic/advantages/max": 4.0, "critic/advantages/min": -2.0,
        "critic/returns/mean": 10 / 6, "critic/returns/max": 3.0, "critic/returns/min": 1.0,
        "critic/values/mean": 10 / 6, "critic/values/max": 3.0, "critic/values/min": 1.0,
        # sample variances: returns 16/15, residuals 0,0,0,-1,0,1 -> 2/5; 1 - (2/5)/(16/15 + 1e-5)
        "critic/vf_explained_var": 1 - 0.4 / (16 / 15 + 1e-5),
        "response_length/mean": 3.0, "response_length/max": 4.0, "response_length/min": 2.0,
        "response_length/clip_ratio": 0.5,
        "prompt_length/mean": 2.5, "prompt_length/max": 3.0, "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 0.5,
        # no empty response: the non-aborted lengths are the lengths
        "response_length_non_aborted/mean": 3.0, "response_length_non_aborted/max": 4.0,
        "response_length_non_aborted/min": 2.0, "response_length_non_aborted/clip_ratio": 0.5,
        "response/aborted_ratio": 0.0,
    }
    assert set(m) == set(expected)
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, abs=1e-6), key
        assert isinstance(m[key], float)


def test_data_metrics_without_critic():
    m = compute_data_metrics(two_sample_batch(with_values=False), use_critic=False)
    assert not any(k.startswith("critic/values") or k == "critic/vf_explained_var" for k in m)
    with pytest.raises(KeyError, match="use_critic=False"):
        compute_data_metrics(two_sample_batch(with_values=False), use_critic=True)


def test_aborted_samples_are_left_out_of_scores_and_non_aborted_lengths():
    batch = two_sample_batch()
    # Sample 1 aborted: no response token, yet a score of 5 somewhere in its row.
    batch.batch["response_mask"][1] = 0
    batch.batch["attention_mask"][1, 3:] = 0
    batch.batch["token_level_scores"][1] = torch.tensor([5.0, 0, 0, 0])
    m = compute_data_metrics(batch, use_critic=False)
    assert m["critic/score/mean"] == 1.0 and m["critic/score/min"] == 1.0  # sample 0 only
    assert m["response_length/mean"] == 2.0 and m["response_length/min"] == 0.0  # (4 + 0) / 2
    assert m["response_length_non_aborted/mean"] == 4.0 and m["response_length_non_aborted/clip_ratio"] == 1.0
    assert m["response/aborted_ratio"] == 0.5
    batch.batch["response_mask"][0] = 0
    with pytest.raises(ValueError, match="aborted"):
        compute_data_metrics(batch, use_critic=False)


def test_response_mask_falls_back_to_attention_mask():
    batch = two_sample_batch()
    batch.batch.pop("response_mask")
    assert compute_data_metrics(batch)["response_length/mean"] == 3.0


def test_explained_variance_by_hand():
    r = torch.tensor([1.0, 2.0, 3.0])  # sample variance 1
    assert explained_variance(r, r) == 1.0
    assert explained_variance(r, torch.full_like(r, 2.0)) == pytest.approx(1 - 1 / (1 + 1e-5))
    # values off by [0, 0, 3]: residuals have sample variance 3 -> 1 - 3 / 1.00001
    assert explained_variance(r, torch.tensor([1.0, 2.0, 0.0])) == pytest.approx(1 - 3 / 1.00001)
    # constant returns, residual variance 1/3 (values 0, 1, 1 against 1): 1 - (1/3) / 1e-5, not -1e14
    assert explained_variance(torch.ones(3), torch.tensor([0.0, 1.0, 1.0])) == pytest.approx(1 - (1 / 3) / 1e-5)
    assert math.isnan(explained_variance(torch.ones(1), torch.zeros(1)))


def test_timing_metrics_per_token():
    # 5 prompt tokens + 6 response tokens
    timing = {"gen": 0.6, "ref": 1.1, "update_actor": 2.2, "step": 3.0, "testing": 2.0}
    m = compute_timing_metrics(two_sample_batch(), timing)
    assert m["timing_s/gen"] == 0.6 and m["timing_s/testing"] == 2.0 and m["timing_s/step"] == 3.0
    assert m["timing_per_token_ms/gen"] == pytest.approx(100.0)  # 600 ms / 6 response tokens
    assert m["timing_per_token_ms/ref"] == pytest.approx(100.0)  # 1100 ms / 11 tokens
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(200.0)
    assert "timing_per_token_ms/step" not in m and "timing_per_token_ms/testing" not in m


def test_throughput_metrics():
    batch = two_sample_batch()
    m = compute_throughout_metrics(batch, {"step": 0.5}, n_gpus=2)  # Σ attention_mask = 5 + 6 = 11
    assert m == {"perf/total_num_tokens": 11.0, "perf/time_per_step": 0.5, "perf/throughput": 11.0}
    batch.meta_info["global_token_num"] = [100, 200, 300]  # as the trainer sets it: 600 tokens
    m = compute_throughout_metrics(batch, {"step": 2.0}, n_gpus=2)
    assert m["perf/total_num_tokens"] == 600 and m["perf/throughput"] == 600 / (2.0 * 2)
    with pytest.raises(KeyError, match="step"):
        compute_throughout_metrics(batch, {}, n_gpus=1)


def test_reduce_metrics():
    from verl.utils.metric import reduce_metrics as utils_reduce_metrics

    assert reduce_metrics is utils_reduce_metrics
    metrics = {"a": [1.0, 2.0]}
    assert reduce_metrics(metrics) is metrics and metrics == {"a": 1.5}  # in place, as the original
    out = reduce_metrics({"a": [1.0, 2.0, 6.0], "b": 3, "c": [torch.tensor(1.0), 2], "d": [],
                          "e": torch.tensor([2.0, 4.0]), "f": np.array([[1.0, 3.0]])})
    assert out["a"] == 3.0 and out["b"] == 3.0 and out["c"] == 1.5 and math.isnan(out["d"])
    assert out["e"] == 3.0 and out["f"] == 2.0
    # Peaks stay peaks: one entry per rank or mini-batch.
    out = reduce_metrics({"perf/max_memory_allocated_gb": [3.0, 7.0], "x/min": [4.0, -1.0], "y/max": [1, 5],
                          "actor/pg_clipfrac_lower": [0.0, 1.0], "timing_min_s": [2.0, 6.0], "maxima": [1.0, 3.0]})
    assert out == {"perf/max_memory_allocated_gb": 7.0, "x/min": -1.0, "y/max": 5.0,
                   "actor/pg_clipfrac_lower": 0.5, "timing_min_s": 4.0, "maxima": 2.0}


def test_rollout_probs_diff():
    rollout = torch.tensor([[0.5, 0.25, 0.75, 0.9]]).log()
    actor = torch.tensor([[0.4, 0.25, 0.9, 0.1]]).log()
    mask = torch.tensor([[1, 1, 1, 0]])
    m = compute_rollout_probs_diff(rollout, actor, mask)
    # |diff| over valid tokens: 0.1, 0, 0.15
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(0.25 / 3)
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.15)
    assert m["training/rollout_probs_diff_std"] == pytest.approx(np.std([0.1, 0.0, 0.15]))
    assert m["training/rollout_probs_diff_valid"] == 1.0
    expected_corr = np.corrcoef([0.5, 0.25, 0.75], [0.4, 0.25, 0.9])[0, 1]
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(expected_corr)
    same = compute_rollout_probs_diff(actor, actor, mask)
    assert same["training/rollout_probs_diff_max"] == 0.0
    assert same["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------- validation


def test_validation_all_equal_samples():
    n = 4
    res = process_validation_metrics(["ds"] * n, ["p0"] * n, {"reward": [0.7] * n})
    metrics = res["ds"]["reward"]
    assert set(metrics) == {"mean@4", "std@4"} | {f"{s}@{k}/{t}" for s in ("best", "worst")
                                                   for k in (2, 4) for t in ("mean", "std")}
    for key, value in metrics.items():
        assert value == pytest.approx(0.0 if "std" in key else 0.7), key


def test_validation_bootstrap_is_seeded_and_close_to_exact():
    # one prompt, samples 0 and 1: max of two draws with replacement is 1 with prob 3/4
    data = (["ds"] * 2, ["p"] * 2, {"reward": [0.0, 1.0]})
    a = process_validation_metrics(*data, seed=42)
    assert a == process_validation_metrics(*data, seed=42)
    assert a != process_validation_metrics(*data, seed=7)
    m = a["ds"]["reward"]
    assert m["mean@2"] == 0.5 and m["std@2"] == 0.5
    assert m["best@2/mean"] == pytest.approx(0.75, abs=0.05)
    assert m["worst@2/mean"] == pytest.approx(0.25, abs=0.05)
    # a Bernoulli(3/4) over 1000 subsets has std sqrt(3/16)
    assert m["best@2/std"] == pytest.approx(math.sqrt(3 / 16), abs=0.03)


def test_validation_majority_vote_and_tie_break():
    # answers A, A, B with acc 1, 1, 0.
    # maj@2: AA (4/9) -> A, BB (1/9) -> B, a tie goes to the answer drawn first: AB (2/9) -> A, BA (2/9) -> B;
    # A wins with 4/9 + 2/9 = 2/3.
    # maj@3: A wins when it has >= 2 of 3 draws: 3*(2/3)^2*(1/3) + (2/3)^3 = 20/27.
    res = process_validation_metrics(["ds"] * 3, ["p"] * 3,
                                     {"acc": [1.0, 1.0, 0.0], "pred": ["A", "A", "B"]})
    m = res["ds"]["acc"]
    assert "pred" not in res["ds"]
    assert m["mean@3"] == pytest.approx(2 / 3)
    assert m["maj@2/mean"] == pytest.approx(2 / 3, abs=0.04)
    assert m["maj@3/mean"] == pytest.approx(20 / 27, abs=0.04)
    assert m["best@3/mean"] == pytest.approx(26 / 27, abs=0.03)


def test_validation_groups_by_source_and_prompt():
    sources = ["a", "a", "a", "a", "b", "b"]
    uids = ["x", "x", "y", "y", "z", "z"]
    res = process_validation_metrics(sources, uids, {"reward": [1, 1, 0, 0, 0.5, 0.5], "note": ["s"] * 6})
    assert res["a"]["reward"]["mean@2"] == 0.5
    assert res["a"]["reward"]["best@2/mean"] == 0.5  # each prompt constant: 1 and 0
    assert res["b"]["reward"]["mean@2"] == 0.5
    assert "note" not in res["a"]  # non-numeric variables are skipped
    with pytest.raises(ValueError, match="infos"):
        process_validation_metrics(sources, uids, {"reward": [1.0]})


def test_flatten_core_and_aux():
    greedy = process_validation_metrics(["gsm8k", "gsm8k"], ["p", "q"], {"reward": [1.0, 0.0]})
    assert flatten_validation_metrics(greedy) == {"val-core/gsm8k/reward/mean@1": 0.5}

    n = 4
    res = process_validation_metrics(["d"] * n, ["p"] * n,
                                     {"reward": [1.0, 0, 0, 1], "acc": [1.0, 0, 0, 1], "pred": list("abba")})
    flat = flatten_validation_metrics(res)
    core = {k for k in flat if k.startswith("val-core/")}
    assert core == {"val-core/d/acc/mean@4", "val-core/d/acc/best@4/mean", "val-core/d/acc/maj@4/mean",
                    "val-core/d/acc/best@4/std", "val-core/d/acc/maj@4/std"}
    assert "val-aux/d/reward/mean@4" in flat and "val-aux/d/acc/best@2/mean" in flat
    assert "val-aux/d/acc/std@4" in flat and "val-aux/d/acc/worst@4/mean" in flat
    assert all(k.startswith(("val-core/", "val-aux/")) for k in flat)
    json.dumps(flat)  # plain floats


def test_validation_is_vectorised_for_large_runs():
    rng = np.random.default_rng(0)
    prompts, n = 1000, 8
    preds = rng.integers(0, 4, prompts * n)
    res = process_validation_metrics(["ds"] * (prompts * n), np.repeat(np.arange(prompts), n).tolist(),
                                     {"acc": (preds == 0).astype(float).tolist(), "pred": preds.tolist()})
    m = res["ds"]["acc"]
    assert m["mean@8"] == pytest.approx(float((preds == 0).mean()))
    assert m["worst@8/mean"] <= m["mean@8"] <= m["best@8/mean"]
    assert m["best@2/mean"] <= m["best@4/mean"] <= m["best@8/mean"]


def test_agent_loop_metrics_by_hand():
    from verl.trainer.ppo.metric_utils import agent_loop_metrics

    batch = two_sample_batch()
    assert agent_loop_metrics(batch) == {}  # single-turn rollouts: no agent_loop/* keys
    # Sample 1's response: 2 model tokens, then 1 tool-result token inside attention_mask but not response_mask.
    batch.batch["attention_mask"][1, 5] = 1
    batch.non_tensor_batch.update({
        "__num_turns__": np.array([1, 3]), "__tool_calls__": np.array([0, 2]), "__tool_errors__": np.array([0, 1]),
        "__tool_seconds__": np.array([0.0, 0.5]), "__tool_reward__": np.array([0.0, 1.0]),
        "__turn_score__": np.array([0.25, 0.75])})
    metrics = agent_loop_metrics(batch)
    assert metrics["agent_loop/num_turns/mean"] == 2 and metrics["agent_loop/num_turns/max"] == 3
    assert metrics["agent_loop/tool_calls/mean"] == 1 and metrics["agent_loop/tool_errors/mean"] == 0.5
    assert metrics["agent_loop/tool_time_s/mean"] == 0.25 and metrics["agent_loop/tool_reward/mean"] == 0.5
    assert metrics["agent_loop/turn_score/mean"] == 0.5
    assert metrics["agent_loop/response_length_with_tools/mean"] == 3.5  # (4 + 3) / 2
    del batch.non_tensor_batch["__turn_score__"]
    assert "agent_loop/turn_score/mean" not in agent_loop_metrics(batch)


# ---------------------------------------------------------------------------- the original's helpers


def test_bootstrap_indices_are_the_originals_draws_without_touching_global_state():
    from verl.trainer.ppo.metric_utils import bootstrap_indices

    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    idx = bootstrap_indices(5, 3, n_bootstrap=20, seed=42)
    assert np.array_equal(np.random.get_state()[1], before)  # numpy's global generator untouched
    np.random.seed(42)
    assert np.array_equal(idx, np.random.choice(5, size=(20, 3), replace=True))
    assert idx.shape == (20, 3) and idx.min() >= 0 and idx.max() <= 4


def test_bootstrap_metric_by_hand():
    from verl.trainer.ppo.metric_utils import bootstrap_indices, bootstrap_metric

    # A constant list: every subset's mean and max is 2, with no spread.
    assert bootstrap_metric([2, 2, 2], 2, [np.mean, np.max], n_bootstrap=10) == [(2.0, 0.0), (2.0, 0.0)]
    # Data [0, 1], subsets of one draw: each subset's value is its index, so (mean, std) of the draws.
    draws = bootstrap_indices(2, 1, n_bootstrap=50, seed=3)[:, 0]
    [(mean, std)] = bootstrap_metric([0, 1], 1, [np.max], n_bootstrap=50, seed=3)
    assert mean == pytest.approx(draws.mean()) and std == pytest.approx(draws.std())
    with pytest.raises(ValueError):
        bootstrap_metric([], 1, [np.mean])


def test_calc_maj_val_majority_then_first_drawn():
    from verl.trainer.ppo.metric_utils import calc_maj_val

    data = [{"pred": "A", "val": 0.9}, {"pred": "B", "val": 0.8}, {"pred": "A", "val": 0.7}]
    assert calc_maj_val(data, vote_key="pred", val_key="val") == 0.9  # A twice; A's first value
    tie = [{"pred": "B", "val": 0.8}, {"pred": "A", "val": 0.9}, {"pred": "A", "val": 0.6}, {"pred": "B", "val": 0.1}]
    assert calc_maj_val(tie, "pred", "val") == 0.8  # 2 - 2: B was drawn first


def test_vectorised_validation_equals_bootstrap_metric_per_prompt():
    from functools import partial

    from verl.trainer.ppo.metric_utils import bootstrap_metric, calc_maj_val

    # Two prompts of 4 samples; answers with ties, values that differ within one answer.
    preds = ["a", "b", "b", "a", "c", "c", "d", "e"]
    reward = [1.0, 0.0, 0.5, 0.25, 1.0, 0.0, 0.75, 0.5]
    res = process_validation_metrics(["s"] * 8, ["p"] * 4 + ["q"] * 4, {"reward": reward, "pred": preds})["s"]
    for k in (2, 4):
        per_prompt = []
        for rows in (range(0, 4), range(4, 8)):
            values = [reward[i] for i in rows]
            votes = [{"pred": preds[i], "val": reward[i]} for i in rows]
            (best, worst) = bootstrap_metric(values, k, [np.max, np.min])
            [maj] = bootstrap_metric(votes, k, [partial(calc_maj_val, vote_key="pred", val_key="val")])
            per_prompt.append({"best": best, "worst": worst, "maj": maj})
        for name in ("best", "worst", "maj"):
            for i, stat in enumerate(("mean", "std")):
                expected = (per_prompt[0][name][i] + per_prompt[1][name][i]) / 2
                assert res["reward"][f"{name}@{k}/{stat}"] == pytest.approx(expected, abs=1e-12), (name, k, stat)


def test_numeric_pred_is_a_variable_too():
    # As in the original, a numeric "pred" column is also summarised (mean@2 of 3 and 5 is 4).
    res = process_validation_metrics(["s"] * 2, ["p"] * 2, {"acc": [1.0, 0.0], "pred": [3, 5]})["s"]
    assert res["pred"]["mean@2"] == 4.0 and res["acc"]["mean@2"] == 0.5
