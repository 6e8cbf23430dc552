"""A policy loss declares at registration the aggregation it applies itself; the actor weighs by it."""

import pytest
import torch

from verl.algorithms import POLICY_LOSS_REGISTRY, agg_loss, get_policy_loss_fn, register_policy_loss
from verl.algorithms.registry import policy_loss_agg_mode


@pytest.mark.parametrize("name", ["gspo", "sapo", "geo_mean"])
def test_per_sequence_losses_declare_their_aggregation(name):
    assert policy_loss_agg_mode(get_policy_loss_fn(name), "token-mean") == "seq-mean-token-mean"


@pytest.mark.parametrize("name", ["vanilla", "gpg", "clip_cov", "kl_cov", "cispo", "bypass_mode"])
def test_losses_following_the_config_declare_nothing(name):
    assert policy_loss_agg_mode(get_policy_loss_fn(name), "seq-mean-token-sum") == "seq-mean-token-sum"


def test_declared_mode_is_what_the_loss_computes():
    """sapo at ratio 1 is -(2/tau)·A per token (tau_pos=1 for A > 0): its value is the seq-mean-token-mean
    aggregate, whatever loss_agg_mode it is passed."""
    advantages = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    logp = torch.zeros(2, 3)
    loss, _ = get_policy_loss_fn("sapo")(logp, logp, advantages, mask, loss_agg_mode="token-mean")
    assert float(loss) == pytest.approx(float(agg_loss(-2 * advantages, mask, "seq-mean-token-mean")))
    assert float(loss) == pytest.approx(-(2 * 2 + 2 * 4) / 2)


def test_user_losses_keep_the_configured_mode_unless_they_declare_one():
    def mine(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
        return agg_loss(-advantages * log_prob, response_mask, "seq-mean-token-sum"), {}

    try:
        register_policy_loss("test_mine_undeclared")(mine)
        assert policy_loss_agg_mode(get_policy_loss_fn("test_mine_undeclared"), "token-mean") == "token-mean"
        register_policy_loss("test_mine_declared", loss_agg_mode="seq-mean-token-sum")(mine)
        assert policy_loss_agg_mode(get_policy_loss_fn("test_mine_declared"), "token-mean") == "seq-mean-token-sum"
    finally:
        POLICY_LOSS_REGISTRY.pop("test_mine_undeclared", None)
        POLICY_LOSS_REGISTRY.pop("test_mine_declared", None)


def test_an_unknown_declared_mode_is_refused_at_registration():
    with pytest.raises(ValueError, match=r"register_policy_loss\('test_bad', loss_agg_mode='seq-mean'\).*token-mean"):
        register_policy_loss("test_bad", loss_agg_mode="seq-mean")
    assert "test_bad" not in POLICY_LOSS_REGISTRY
