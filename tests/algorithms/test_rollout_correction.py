"""Rollout correction against values worked out by hand.

The batch used throughout has two sequences; ``r`` is pi_train / pi_rollout per token:
    row 0: r = [3, 0.5, 1]   mask [1, 1, 1]
    row 1: r = [1.5, 4, 7]   mask [1, 1, 0]   (the 7 is padding and must never count)
"""

import math

import pytest
import torch

from verl.algorithms.rollout_correction import (
    compute_offpolicy_metrics, compute_policy_loss_bypass_mode, compute_rollout_correction_weights,
    compute_rollout_rejection_mask, parse_rollout_rs_thresholds, rollout_correction
)

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LOG_RATIO = torch.log(torch.tensor([[3.0, 0.5, 1.0], [1.5, 4.0, 7.0]]))


def approx(x):
    return pytest.approx(x, rel=1e-5, abs=1e-6)


def test_token_is_weights_and_metrics():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0)
    # truncated at 2, zero on padding
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0], [1.5, 2.0, 0.0]]))
    # before truncation the valid weights are 3, .5, 1, 1.5, 4
    assert m["rollout_is_mean"] == approx(10 / 5)
    assert (m["rollout_is_max"], m["rollout_is_min"]) == (approx(4.0), approx(0.5))
    assert m["rollout_is_ratio_fraction_high"] == approx(2 / 5)  # 3 and 4 exceed 2
    assert m["rollout_is_ratio_fraction_low"] == approx(0.0)  # 0.5 is not below 1/2
    # clamped to [1/2, 2]: 2, .5, 1, 1.5, 2 -> mean 1.4, E[b^2] = 2.3
    assert m["rollout_is_std"] == approx(math.sqrt(2.3 - 1.4**2))
    assert m["rollout_is_eff_sample_size"] == approx(1.4**2 / 2.3)
    # per-sequence means of the raw weights: 4.5/3 = 1.5 and 5.5/2 = 2.75
    assert m["rollout_is_seq_mean"] == approx(2.125)
    assert m["rollout_is_seq_std"] == approx(1.25 / math.sqrt(2))
    assert m["rollout_is_seq_max_deviation"] == approx(1.75)
    assert m["rollout_is_seq_fraction_high"] == approx(0.5)


def test_sequence_is_weights_use_the_product_of_ratios():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", 2.0)
    # row 0: 3 * .5 * 1 = 1.5; row 1: 1.5 * 4 = 6, truncated to 2
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]]))
    assert (m["rollout_is_max"], m["rollout_is_min"]) == (approx(6.0), approx(1.5))
    assert m["rollout_is_mean"] == approx((1.5 * 3 + 6 * 2) / 5)
    assert m["rollout_is_ratio_fraction_high"] == approx(0.5)
    assert m["rollout_is_std"] == approx(math.sqrt((3 * 2.25 + 2 * 4) / 5 - 1.7**2))


def test_batch_normalize_makes_the_mean_weight_one():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0, rollout_is_batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == approx(1.4)  # (2 + .5 + 1 + 1.5 + 2) / 5
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0], [1.5, 2.0, 0.0]]) / 1.4)
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", 2.0, rollout_is_batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == approx(1.75)  # mean of the truncated sequence weights 1.5 and 2
    assert torch.allclose(w[0], torch.full((3,), 1.5 / 1.75))


def test_token_k1_rejects_ratios_outside_the_range():
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", "0.6_2.5")
    # keeps 1 and 1.5 only
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    assert m["rollout_rs_masked_fraction"] == approx(3 / 5)
    assert m["rollout_rs_seq_masked_fraction"] == approx(1.0)
    assert m["rollout_rs_token_k1_mean"] == approx(math.log(1 / 9) / 5)  # -log of 3*.5*1*1.5*4 = 9, over 5 tokens
    assert m["rollout_rs_token_k1_fraction_high"] == approx(2 / 5)  # 3 and 4 above 2.5
    assert m["rollout_rs_token_k1_fraction_low"] == approx(1 / 5)  # 0.5 below 0.6


def test_sequence_k1_criteria_keep_or_drop_whole_sequences():
    # one number u means [1/u, u]: row 0's ratio 1.5 stays, row 1's ratio 6 goes
    for option in ("seq_sum_k1", "seq_mean_k1"):  # geometric means: 1.5^(1/3) = 1.14, sqrt(6) = 2.45
        mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, option, 2.0)
        assert torch.equal(mask, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])), option
        assert m["rollout_rs_masked_fraction"] == approx(2 / 5)
        assert m["rollout_rs_seq_masked_fraction"] == approx(0.5)


def test_several_criteria_must_all_pass():
    # k2 = (log r)^2 / 2: 0.604 (r=3) and 0.961 (r=4) exceed 0.3;
    # max k3 per row (k3 = r - 1 - log r): 0.901 (row 0) <= 1.0, 1.614 (row 1) > 1.0
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k2, seq_max_k3", "0.3,1.0")
    assert torch.equal(mask, torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert m["rollout_rs_token_k2_masked_fraction"] == approx(2 / 5)
    assert m["rollout_rs_seq_max_k3_masked_fraction"] == approx(2 / 5)
    assert m["rollout_rs_seq_max_k3_max"] == approx(4 - 1 - math.log(4))
    assert m["rollout_rs_masked_fraction"] == approx(3 / 5)  # row 0 token 0, row 1 tokens 0 and 1


@pytest.mark.parametrize("options, spec, message", [
    (["token_k2"], "0.5_2.0", "not one number"),
    (["token_k1", "seq_sum_k2"], "1,2,3", "3 entries for 2 criteria"),
    (["token_k1"], None, "rollout_rs_threshold is None"),
    (["token_k1"], "2_0.5", "lower <= upper"),
])
def test_threshold_errors_name_the_key(options, spec, message):
    with pytest.raises(ValueError, match="algorithm.rollout_correction.rollout_rs_threshold") as err:
        parse_rollout_rs_thresholds(options, spec)
    assert message in str(err.value)


def test_unknown_criterion_names_the_key():
    with pytest.raises(ValueError, match="algorithm.rollout_correction.rollout_rs.*seq_max_k1"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_max_k1", 2.0)


def test_offpolicy_metrics():
    train = torch.log(torch.tensor([[0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.25, 0.5]]))
    m = compute_offpolicy_metrics(train, rollout, torch.ones(1, 2))
    ln2 = math.log(2)
    assert m["kl"] == approx(-ln2 / 2)
    assert m["k3_kl"] == approx((1 - ln2) / 2)
    assert (m["training_ppl"], m["rollout_ppl"]) == (approx(2.0), approx(2**1.5))
    assert m["log_ppl_diff"] == approx(-ln2 / 2)
    assert m["ppl_ratio"] == approx(2**-0.5)
    assert m["chi2_token"] == approx(1.5)  # (2^2 + 1^2) / 2 - 1
    assert m["chi2_seq"] == approx(3.0)  # (2 * 1)^2 - 1


def test_rollout_correction_prefixes_metrics_and_skips_an_empty_batch():
    weights, mask, m = rollout_correction(LOG_RATIO, torch.zeros_like(LOG_RATIO), MASK, rollout_is="token",
                                          rollout_rs="token_k1", rollout_rs_threshold="0.6_2.5")
    assert weights is not None and mask.sum() == 2
    assert all(k.startswith("rollout_corr/") for k in m) and "rollout_corr/kl" in m
    none_valid = torch.zeros_like(MASK)
    assert rollout_correction(LOG_RATIO, LOG_RATIO, none_valid, rollout_is="token") == (None, none_valid, {})


def _bypass_config(**corr):
    corr = {"rollout_is": None, "rollout_rs": None, "rollout_rs_threshold": None, "loss_type": "ppo_clip", **corr}
    return {"policy_loss": {"loss_mode": "bypass_mode", "rollout_correction": corr}}


def test_bypass_reinforce_weights_the_log_prob_gradient():
    rollout_lp = torch.log(torch.tensor([[0.25, 0.5]]))
    log_prob = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0]])
    loss, m = compute_policy_loss_bypass_mode(rollout_lp, log_prob, adv, torch.ones(1, 2), "token-mean",
                                              _bypass_config(rollout_is="token", loss_type="reinforce"))
    # w = [2, 1]; L = mean(-A * w * log p) = (2 ln2 - ln2) / 2
    assert loss.item() == approx(math.log(2) / 2)
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[-1.0, 0.5]]))  # -A * w / 2, weights detached
    assert m["rollout_corr/rollout_is_mean"].item() == approx(1.5)


def test_bypass_ppo_clip_anchors_at_the_rollout_policy_and_applies_rejection():
    rollout_lp = torch.log(torch.tensor([[0.25, 0.5]]))
    log_prob = torch.log(torch.tensor([[0.5, 0.5]]))
    adv = torch.tensor([[1.0, -1.0]])
    # ratio [2, 1], clip 0.2: token 0 -> -1.2 (clipped), token 1 -> 1
    loss, m = compute_policy_loss_bypass_mode(rollout_lp, log_prob, adv, torch.ones(1, 2), "token-mean",
                                              _bypass_config())
    assert loss.item() == approx(-0.1)
    assert m["pg_clipfrac"].item() == approx(0.5)
    # rejecting ratios above 1.5 leaves token 1 only
    loss, m = compute_policy_loss_bypass_mode(rollout_lp, log_prob, adv, torch.ones(1, 2), "token-mean",
                                              _bypass_config(rollout_rs="token_k1", rollout_rs_threshold="0.6_1.5"))
    assert loss.item() == approx(1.0)
    assert m["rollout_corr/rollout_rs_masked_fraction"].item() == approx(0.5)
