"""Hand-computed checks of the PPO math. Every expected number is derived in the comments."""

import dataclasses
import math
from enum import Enum
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl import algorithms as core_algos
from verl.algorithms import (
    AdaptiveKLController,
    AdvantageEstimator,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    compute_advantage,
    compute_entropy_loss,
    compute_gae_advantage_return,
    compute_value_loss,
    get_adv_estimator_fn,
    get_kl_controller,
    get_policy_loss_fn,
    kl_penalty,
    register_adv_est,
    register_policy_loss,
)

EPS = 1e-6


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def whiten(xs):
    """Plain-Python whitening with the unbiased std, for the expected values."""
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return [(x - mean) / std for x in xs]


def assert_close(actual, expected, abs=1e-6):
    assert torch.as_tensor(actual).double().flatten().tolist() == pytest.approx(
        torch.as_tensor(expected, dtype=torch.float64).flatten().tolist(), abs=abs
    )


@pytest.fixture
def fresh_registries():
    """Let a test register names without leaking them into other tests: the registries' contents are
    restored afterwards (the registries themselves stay the same objects, which the decorators fill)."""
    registries = (core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.POLICY_LOSS_REGISTRY)
    saved = [dict(registry) for registry in registries]
    yield
    for registry, contents in zip(registries, saved):
        registry.clear()
        registry.update(contents)


# ------------------------------------------------------------------------------------------------
# Outcome-reward fixture shared by the group estimators
# uids a, a, a, b; response_length 2; the reward sits on the last valid token.
#   scores R = [1, 0, 2 | 3]; group a: mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1; b is a singleton.
# ------------------------------------------------------------------------------------------------
GROUP_REWARDS = t([[0, 1], [0, 0], [0, 2], [0, 3]])
GROUP_MASK = t([[1, 1], [1, 0], [1, 1], [1, 1]])
GROUP_INDEX = np.array(["a", "a", "a", "b"], dtype=object)


def per_token(per_seq, mask=GROUP_MASK):
    return t(per_seq).unsqueeze(-1) * mask


# ------------------------------------------------------------------------------------------------
# Advantage estimators
# ------------------------------------------------------------------------------------------------


def test_gae_skips_a_masked_token_in_the_middle():
    gamma, lam = 0.5, 0.5
    rewards = t([[0, 5, 1], [0, 0, 1]])  # the 5 sits on a masked token and is ignored
    values = t([[0.5, 9, 0.25], [0, 0, 0]])
    mask = t([[1, 0, 1], [1, 1, 1]])
    adv, returns = compute_gae_advantage_return(rewards, values, mask, gamma, lam)

    # row 0, valid tokens t=0 and t=2 (t=1 is skipped, so t=2 is t=0's next step):
    a02 = 1 + gamma * 0 - 0.25  # δ = 0.75, A = 0.75
    a00 = (0 + gamma * 0.25 - 0.5) + gamma * lam * a02  # δ = -0.375, A = -0.1875
    # row 1, plain recursion on zero values:
    a12 = 1.0
    a11 = 0 + gamma * lam * a12  # 0.25
    a10 = 0 + gamma * lam * a11  # 0.0625
    assert_close(returns, [[a00 + 0.5, 0, a02 + 0.25], [a10, a11, a12]])
    w = whiten([a00, a02, a10, a11, a12])
    assert_close(adv, [[w[0], 0, w[1]], [w[2], w[3], w[4]]])


def test_grpo_with_singleton_group():
    adv, returns = core_algos.compute_grpo_outcome_advantage(GROUP_REWARDS, GROUP_MASK, GROUP_INDEX, epsilon=EPS)
    # group a: (R - 1) / (1 + eps); singleton b: mean 0, std 1 -> 3 / (1 + eps)
    expected = per_token([(1 - 1) / (1 + EPS), (0 - 1) / (1 + EPS), (2 - 1) / (1 + EPS), (3 - 0) / (1 + EPS)])
    assert_close(adv, expected)
    assert_close(returns, expected)


def test_dr_grpo_does_not_divide_by_std():
    adv, _ = core_algos.compute_grpo_outcome_advantage(
        GROUP_REWARDS, GROUP_MASK, GROUP_INDEX, norm_adv_by_std_in_grpo=False
    )
    assert_close(adv, per_token([1 - 1, 0 - 1, 2 - 1, 3 - 0]))


def test_grpo_std_is_unbiased():
    rewards = t([[1.0], [0.0], [0.0], [0.0]])  # mean 1/4, unbiased var (9/16 + 3/16) / 3 = 1/4
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, torch.ones(4, 1), np.array([0, 0, 0, 0]), epsilon=0.0)
    assert_close(adv, [[(1 - 0.25) / 0.5], [-0.25 / 0.5], [-0.25 / 0.5], [-0.25 / 0.5]])


def test_grpo_passk_credits_only_the_best_sample():
    rewards = t([[1], [0], [2], [0.5], [3]])
    mask = torch.ones(5, 1)
    index = np.array(["a", "a", "a", "b", "b"], dtype=object)
    # a: best 2, second 1, std 1; b: best 3, second 0.5, std |3 - 0.5| / sqrt(2)
    adv, _ = core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, index, epsilon=EPS)
    assert_close(adv, [[0], [0], [(2 - 1) / (1 + EPS)], [0], [(3 - 0.5) / (2.5 / math.sqrt(2) + EPS)]])
    adv, _ = core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert_close(adv, [[0], [0], [2 - 1], [0], [3 - 0.5]])


def test_grpo_passk_rejects_singleton_groups():
    with pytest.raises(ValueError, match="at least 2 samples.*'b'"):
        core_algos.compute_grpo_passk_outcome_advantage(GROUP_REWARDS, GROUP_MASK, GROUP_INDEX)


def test_rloo_is_score_minus_mean_of_others():
    adv, _ = core_algos.compute_rloo_outcome_advantage(GROUP_REWARDS, GROUP_MASK, GROUP_INDEX)
    # a: 1 - (0 + 2)/2, 0 - (1 + 2)/2, 2 - (1 + 0)/2; singleton b keeps its raw score 3
    assert_close(adv, per_token([1 - 1, 0 - 1.5, 2 - 0.5, 3]))
    # the k/(k-1) form gives the same: (R - mean) * 3/2
    assert_close(adv[:3, 0], [(1 - 1) * 1.5, (0 - 1) * 1.5, (2 - 1) * 1.5])


def test_opo_uses_a_length_weighted_baseline():
    adv, _ = core_algos.compute_opo_outcome_advantage(GROUP_REWARDS, GROUP_MASK, GROUP_INDEX)
    # a: lengths 2, 1, 2 -> baseline (2*1 + 1*0 + 2*2) / 5 = 1.2; singleton b keeps its raw score 3
    assert_close(adv, per_token([1 - 1.2, 0 - 1.2, 2 - 1.2, 3]))


def test_gpg_scales_by_share_of_nonzero_scores():
    adv, _ = core_algos.compute_gpg_outcome_advantage(GROUP_REWARDS, GROUP_MASK, GROUP_INDEX)
    alpha = 4 / 3  # bs 4, three nonzero scores
    assert_close(adv, per_token([alpha * (1 - 1), alpha * (0 - 1), alpha * (2 - 1), alpha * (3 - 0)]))
    adv, _ = core_algos.compute_gpg_outcome_advantage(torch.zeros(2, 2), torch.ones(2, 2), np.array([0, 0]))
    assert_close(adv, torch.zeros(2, 2))  # alpha = 1, no signal


def test_remax_is_suffix_sum_minus_greedy_baseline():
    rewards = t([[0, 1, 2], [3, 0, 7]])
    mask = t([[1, 1, 1], [1, 1, 0]])  # the 7 is on padding
    adv, returns = core_algos.compute_remax_outcome_advantage(rewards, t([1, 2]), mask)
    assert_close(returns, [[0 + 1 + 2, 1 + 2, 2], [3, 0, 0]])
    assert_close(adv, [[3 - 1, 3 - 1, 2 - 1], [3 - 2, 0 - 2, 0]])


def test_reinforce_plus_plus_carries_the_return_through_masked_tokens():
    gamma = 0.5
    rewards = t([[1, 2, 4, 8], [0, 1, 0, 5]])
    mask = t([[1, 0, 1, 1], [1, 1, 0, 0]])
    adv, returns = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=gamma)
    g03 = 8.0
    g02 = 4 + gamma * g03  # 8
    g00 = 1 + gamma * g02  # 5: the masked t=1 is skipped (its reward 2 ignored), the return carried through it
    g11 = 1.0  # the padding after it (reward 5 included) contributes nothing
    g10 = 0 + gamma * g11  # 0.5
    assert_close(returns, [[g00, 0, g02, g03], [g10, g11, 0, 0]])
    w = whiten([g00, g02, g03, g10, g11])
    assert_close(adv, [[w[0], 0, w[1], w[2]], [w[3], w[4], 0, 0]])
    # The original's call passes gamma only inside the algorithm config.
    _, from_config = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask,
                                                                              config=SimpleNamespace(gamma=gamma))
    assert_close(from_config, returns)


def test_reinforce_plus_plus_baseline_whitens_group_centred_scores():
    adv, returns = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        GROUP_REWARDS, GROUP_MASK, GROUP_INDEX
    )
    # R - mean_g = [0, -1, 1, 3] (singleton b keeps its score); valid tokens: 2, 1, 2, 2
    w = whiten([0, 0, -1, 1, 1, 3, 3])
    assert_close(adv, [[w[0], w[1]], [w[2], 0], [w[3], w[4]], [w[5], w[6]]])
    assert_close(returns, adv)


# ------------------------------------------------------------------------------------------------
# Estimator registry and dispatcher
# ------------------------------------------------------------------------------------------------


def test_every_builtin_estimator_is_registered():
    for member in AdvantageEstimator:
        assert callable(get_adv_estimator_fn(member))
        assert get_adv_estimator_fn(member) is get_adv_estimator_fn(member.value)


@pytest.mark.parametrize("name", [e.value for e in AdvantageEstimator if e is not AdvantageEstimator.GRPO_PASSK])
def test_dispatcher_runs_every_builtin_estimator(name):
    adv, returns = compute_advantage(
        name,
        token_level_rewards=GROUP_REWARDS,
        response_mask=GROUP_MASK,
        index=GROUP_INDEX,
        values=t([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]]),
        reward_baselines=t([0, 0, 0, 0]),
        gamma=0.9,
        lam=0.95,
    )
    assert adv.shape == returns.shape == GROUP_REWARDS.shape
    assert torch.all(adv[GROUP_MASK == 0] == 0)


def test_dispatcher_passes_the_named_arguments():
    values = t([[0.5, 9, 0.25], [0, 0, 0]])
    rewards, mask = t([[0, 5, 1], [0, 0, 1]]), t([[1, 0, 1], [1, 1, 1]])
    got = compute_advantage("gae", token_level_rewards=rewards, response_mask=mask, values=values, gamma=0.5, lam=0.5)
    want = compute_gae_advantage_return(rewards, values, mask, 0.5, 0.5)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    dr = compute_advantage(
        AdvantageEstimator.GRPO,
        token_level_rewards=GROUP_REWARDS,
        response_mask=GROUP_MASK,
        index=list(GROUP_INDEX),
        norm_adv_by_std_in_grpo=False,
    )
    assert_close(dr[0], per_token([0, -1, 1, 3]))


def test_dispatcher_names_a_missing_input():
    with pytest.raises(ValueError, match="'gae' needs `values`"):
        compute_advantage("gae", token_level_rewards=GROUP_REWARDS, response_mask=GROUP_MASK)
    with pytest.raises(ValueError, match="needs `index`"):
        compute_advantage("grpo", token_level_rewards=GROUP_REWARDS, response_mask=GROUP_MASK)


def test_dispatcher_checks_shapes_and_index_length():
    with pytest.raises(ValueError, match="same"):
        compute_advantage("grpo", token_level_rewards=GROUP_REWARDS, response_mask=GROUP_MASK[:, :1], index=GROUP_INDEX)
    with pytest.raises(ValueError, match="3 uids but the batch has 4"):
        compute_advantage("grpo", token_level_rewards=GROUP_REWARDS, response_mask=GROUP_MASK, index=GROUP_INDEX[:3])


def test_custom_estimator_through_the_dispatcher(fresh_registries):
    @register_adv_est("sign_of_score")
    def sign_of_score(token_level_rewards, response_mask, gamma):
        adv = torch.sign(token_level_rewards.sum(-1, keepdim=True)) * gamma * response_mask
        return adv, adv

    seen = {}

    @register_adv_est("takes_everything")
    def takes_everything(token_level_rewards, **kwargs):
        seen.update(kwargs)
        return token_level_rewards, token_level_rewards

    adv, _ = compute_advantage(
        "sign_of_score", token_level_rewards=t([[0, -2], [1, 0]]), response_mask=t([[1, 1], [1, 0]]), gamma=0.5
    )
    assert_close(adv, [[-0.5, -0.5], [0.5, 0]])
    compute_advantage("takes_everything", token_level_rewards=GROUP_REWARDS, response_mask=GROUP_MASK, lam=0.7)
    assert seen["lam"] == 0.7 and "response_mask" in seen and "values" not in seen  # None inputs are left out


def test_custom_estimator_with_an_unknown_required_parameter(fresh_registries):
    @register_adv_est("needs_magic")
    def needs_magic(token_level_rewards, magic):
        raise AssertionError("not reached")

    with pytest.raises(ValueError, match="`magic`, which compute_advantage does not provide"):
        compute_advantage("needs_magic", token_level_rewards=GROUP_REWARDS, response_mask=GROUP_MASK)


def test_unknown_estimator_lists_registered_names():
    with pytest.raises(ValueError, match=r"^Unknown advantage estimator simply: nope\. Registered: .*gae.*grpo"):
        get_adv_estimator_fn("nope")


def test_registration_accepts_enums_and_rejects_duplicate_estimators(fresh_registries):
    class MyEstimators(Enum):
        ZERO = "zero_adv"

    @register_adv_est(MyEstimators.ZERO)
    def zero(token_level_rewards, response_mask):
        return torch.zeros_like(token_level_rewards), torch.zeros_like(token_level_rewards)

    assert get_adv_estimator_fn("zero_adv") is zero
    register_adv_est("zero_adv")(zero)  # the same function again is fine (e.g. a module reload)
    with pytest.raises(ValueError, match="Adv estimator gae has already been registered"):
        register_adv_est("gae")(zero)


# ------------------------------------------------------------------------------------------------
# agg_loss
# ------------------------------------------------------------------------------------------------

LOSS = t([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
LOSS_MASK = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])  # the third sequence has no valid token


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 4 + 5 + 6) / 5),
        ("seq-mean-token-sum", ((1 + 2) + (4 + 5 + 6)) / 2),
        ("seq-mean-token-mean", ((1 + 2) / 2 + (4 + 5 + 6) / 3) / 2),
        ("seq-mean-token-sum-norm", ((1 + 2) + (4 + 5 + 6)) / (2 * 3)),  # C = response_length = 3
    ],
)
def test_agg_loss_modes(mode, expected):
    assert agg_loss(LOSS, LOSS_MASK, mode).item() == pytest.approx(expected)


def test_agg_loss_scale_factor_and_empty_mask():
    assert agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm", loss_scale_factor=6).item() == pytest.approx(
        18 / (2 * 6)
    )
    for mode in core_algos.LOSS_AGG_MODES:
        assert agg_loss(LOSS, torch.zeros_like(LOSS), mode).item() == 0.0


def test_agg_loss_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="valid modes: token-mean, seq-mean-token-sum"):
        agg_loss(LOSS, LOSS_MASK, "token-sum")


# ------------------------------------------------------------------------------------------------
# Policy losses
# Vanilla tokens (old log-prob 0, so r = exp(logp)), ε_low = 0.2, ε_high = 0.28, c = 3:
#   t0: r=1,    A= 1: max(-1, -1)          = -1     not clipped
#   t1: r=1.5,  A= 1: max(-1.5, -1.28)     = -1.28  clipped
#   t2: r=0.5,  A=-1: max(0.5, 0.8)        =  0.8   clipped, below the dual bound 3
#   t3: r=4,    A=-1: max(4, 1.28) = 4 -> min(4, 3) = 3   dual clip
#   t4: r=1.25, A= 1: max(-1.25, -1.25)    = -1.25  inside [0.8, 1.28]: not clipped
#   t5: masked
# ------------------------------------------------------------------------------------------------
RATIOS = t([[1.0, 1.5, 0.5], [4.0, 1.25, 50.0]])
PPO_ADV = t([[1, 1, -1], [-1, 1, 1]])
PPO_MASK = t([[1, 1, 1], [1, 1, 0]])
CLIP_HIGHER = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}


def vanilla(config, **kwargs):
    log_prob = RATIOS.log().requires_grad_()
    loss, metrics = get_policy_loss_fn("vanilla")(torch.zeros(2, 3, dtype=torch.float64), log_prob, PPO_ADV, PPO_MASK,
                                                   config=config, **kwargs)
    loss.backward()
    return loss, metrics, log_prob.grad


def test_vanilla_ppo_with_clip_higher_and_dual_clip():
    loss, metrics, grad = vanilla(CLIP_HIGHER)
    assert loss.item() == pytest.approx((-1 - 1.28 + 0.8 + 3 - 1.25) / 5)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)  # t1, t2
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)  # t3
    ppo_kl = -(0 + math.log(1.5) + math.log(0.5) + math.log(4) + math.log(1.25)) / 5
    assert metrics["ppo_kl"].item() == pytest.approx(ppo_kl)
    # d(-A r)/d logp = -A r on unclipped tokens; clipped and dual-clipped tokens get no gradient
    assert_close(grad, [[-1 / 5, 0, 0], [0, -1.25 / 5, 0]])


def test_vanilla_ppo_symmetric_clip_also_clips_t4():
    loss, metrics, _ = vanilla(SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None))
    assert loss.item() == pytest.approx((-1 - 1.2 + 0.8 + 3 - 1.2) / 5)
    assert metrics["pg_clipfrac"].item() == pytest.approx(3 / 5)


def test_vanilla_ppo_reads_omegaconf_and_dataclass_configs():
    @dataclasses.dataclass
    class ActorConfig:
        clip_ratio: float = 0.2
        clip_ratio_low: float | None = 0.2
        clip_ratio_high: float | None = 0.28
        clip_ratio_c: float = 3.0

    expected = (-1 - 1.28 + 0.8 + 3 - 1.25) / 5
    assert vanilla(ActorConfig())[0].item() == pytest.approx(expected)
    assert vanilla(OmegaConf.create(CLIP_HIGHER))[0].item() == pytest.approx(expected)
    # no config at all: clip 0.2 both ways, c = 3
    assert vanilla(None)[0].item() == pytest.approx((-1 - 1.2 + 0.8 + 3 - 1.2) / 5)


def test_vanilla_ppo_rollout_is_weights_scale_token_losses():
    weights = t([[2, 1, 1], [1, 1, 1]])
    loss, _, _ = vanilla(CLIP_HIGHER, rollout_is_weights=weights)
    assert loss.item() == pytest.approx((2 * -1 - 1.28 + 0.8 + 3 - 1.25) / 5)


def test_vanilla_ppo_rejects_dual_clip_constant_not_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        vanilla({"clip_ratio_c": 1.0})


def test_gspo_uses_one_ratio_per_sequence():
    # row 0: logp - old = [log 2, 0] -> s = exp(log(2) / 2) = sqrt(2); A = 1: max(-sqrt 2, -1.2) = -1.2, clipped
    # row 1: logp - old = 0 -> s = 1; A = -1: loss 1 per token, unclipped
    old = t([[0, 0, 0], [0, 0, 0]])
    log_prob = t([[math.log(2), 0, 7], [0, 0, 0]]).requires_grad_()
    adv = t([[1, 1, 1], [-1, -1, -1]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    loss, metrics = get_policy_loss_fn("gspo")(old, log_prob, adv, mask, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx((-1.2 + 1) / 2)  # seq-mean-token-mean regardless of the mode passed
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    loss.backward()
    # unclipped row 1: d/d logp_t of -A * s * exp(logp_t - sg(logp_t)) = -A * s = 1, averaged over 3 tokens, 2 seqs
    assert_close(log_prob.grad, [[0, 0, 0], [1 / 6, 1 / 6, 1 / 6]])


def test_gpg_policy_loss():
    log_prob = t([[-1.0, -2.0]]).requires_grad_()
    loss, metrics = get_policy_loss_fn("gpg")(t([[0, 0]]), log_prob, t([[1, -1]]), t([[1, 1]]))
    assert loss.item() == pytest.approx((-(-1) * 1 + -(-2) * -1) / 2)
    assert metrics["pg_clipfrac"].item() == 0.0


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    log_prob = t([[-1.0, -2.0, -0.5]]).requires_grad_()
    ratio = [1.5, 1.0, 0.5]
    old = log_prob.detach() - t([ratio]).log()
    adv = t([[1, 1, -1]])
    loss, metrics = get_policy_loss_fn("cispo")(old, log_prob, adv, torch.ones(1, 3), config=CLIP_HIGHER)
    # weights clip(r, 0.8, 1.28) = [1.28, 1, 0.8]; loss = -w * A * logp
    assert loss.item() == pytest.approx((-1.28 * 1 * -1 + -1 * 1 * -2 + -0.8 * -1 * -0.5) / 3)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 3)
    loss.backward()
    assert_close(log_prob.grad, [[-1.28 / 3, -1 / 3, 0.8 / 3]])


# Covariance fixture: A = [2, 2, -2, -2] (mean 0), logp = [1, 3, -1, 1] (mean 1)
#   -> cov = A * (logp - 1) = [0, 4, 4, 0]
COV_ADV = t([[2, 2, -2, -2]])
COV_LOGP = [[1.0, 3.0, -1.0, 1.0]]


def test_clip_cov_detaches_in_range_tokens_not_already_clipped():
    log_prob = t(COV_LOGP).requires_grad_()
    ratio = t([[1, 2, 1, 1]])  # token 1 is PPO-clipped: max(-2*2, -2*1.2) = -2.4
    old = log_prob.detach() - ratio.log()
    config = {"policy_loss": {"clip_cov_ratio": 1.0, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}}
    loss, metrics = get_policy_loss_fn("clip_cov")(old, log_prob, COV_ADV, torch.ones(1, 4), config=config)
    # tokens 1 and 2 have cov 4 in [1, 5]; token 1 is already clipped, so only token 2 is detached
    assert loss.item() == pytest.approx((-2 - 2.4 + 2 + 2) / 4)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 4)
    assert metrics["pg_clipcov_frac"].item() == pytest.approx(1 / 4)
    loss.backward()
    assert_close(log_prob.grad, [[-2 / 4, 0, 0, 2 / 4]])


def test_clip_cov_random_choice_is_reproducible_under_manual_seed():
    # A = logp = [2, 2, 0, 0 | -2, -2, 0, 0], both mean 0 -> cov = [4, 4, 0, 0, 4, 4, 0, 0]
    # four candidates, k = floor(0.25 * 8) = 2 of them are detached
    adv = t([[2, 2, 1e-3, 1e-3], [-2, -2, 1e-3, 1e-3]])  # tiny A off the candidates keeps their gradient nonzero
    config = {"policy_loss": {"clip_cov_ratio": 0.25}}

    def detached_tokens(seed):
        torch.manual_seed(seed)
        log_prob = t([[2, 2, 0, 0], [-2, -2, 0, 0]]).requires_grad_()
        loss, _ = get_policy_loss_fn("clip_cov")(log_prob.detach(), log_prob, adv, torch.ones(2, 4), config=config)
        loss.backward()
        return {(i, j) for i in range(2) for j in range(4) if log_prob.grad[i, j] == 0}

    chosen = detached_tokens(0)
    assert len(chosen) == 2 and chosen <= {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert detached_tokens(0) == chosen
    assert len({frozenset(detached_tokens(seed)) for seed in range(20)}) > 1


def test_kl_cov_penalises_the_top_covariance_tokens():
    # logp = [1, 3, -2, 2] (mean 1) -> cov = A * (logp - 1) = [0, 4, 6, -2]; k = max(1, floor(0.25 * 4)) = 1 -> token 2
    log_prob = t([[1.0, 3.0, -2.0, 2.0]]).requires_grad_()
    ratio = t([[1, 1, 2, 1]])
    old = log_prob.detach() - ratio.log()
    config = {"policy_loss": {"kl_cov_ratio": 0.25, "ppo_kl_coef": 0.1}}
    loss, metrics = get_policy_loss_fn("kl_cov")(old, log_prob, COV_ADV, torch.ones(1, 4), config=config)
    # -A r = [-2, -2, 2*2, 2]; token 2 also gets 0.1 * |log 2|
    assert loss.item() == pytest.approx((-2 - 2 + 4 + 0.1 * math.log(2) + 2) / 4)
    assert metrics["pg_klcov_frac"].item() == pytest.approx(1 / 4)
    loss.backward()
    # d/d logp: -A r, plus 0.1 * sign(logp - old) on token 2
    assert_close(log_prob.grad, [[-2 / 4, -2 / 4, (4 + 0.1) / 4, 2 / 4]])


@pytest.mark.parametrize("name", ["vanilla", "gspo", "sapo", "geo_mean", "gpg", "clip_cov", "kl_cov", "cispo"])
def test_every_policy_loss_reports_the_standard_metrics(name):
    torch.manual_seed(0)
    log_prob = torch.randn(3, 4, requires_grad=True)
    loss, metrics = get_policy_loss_fn(name)(torch.randn(3, 4), log_prob, torch.randn(3, 4), torch.ones(3, 4))
    assert loss.dim() == 0 and loss.requires_grad
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        assert metrics[key].dim() == 0 and metrics[key].dtype == torch.float32 and not metrics[key].requires_grad


def test_custom_policy_loss_by_name(fresh_registries):
    @register_policy_loss("always_one")
    def always_one(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                   rollout_is_weights=None):
        zero = torch.zeros(())
        return log_prob.sum() * 0 + 1, {"pg_clipfrac": zero, "pg_clipfrac_lower": zero, "ppo_kl": zero}

    assert get_policy_loss_fn("always_one") is always_one
    with pytest.raises(ValueError, match=r"^Unsupported loss mode: ppo2\. Supported modes are: \[.*'vanilla'.*'always_one'"):
        get_policy_loss_fn("ppo2")


# ------------------------------------------------------------------------------------------------
# KL
# logp - ref = [0.5, -1.0]
# ------------------------------------------------------------------------------------------------
LOGP, REF = [-1.0, -2.0], [-1.5, -1.0]
KL_VALUES = {
    "kl": [0.5, -1.0],
    "k1": [0.5, -1.0],
    "abs": [0.5, 1.0],
    "mse": [0.5 * 0.5**2, 0.5 * 1.0**2],
    "k2": [0.5 * 0.5**2, 0.5 * 1.0**2],
    # exp(ref - logp) - (ref - logp) - 1 with ref - logp = [-0.5, 1]
    "low_var_kl": [math.exp(-0.5) + 0.5 - 1, math.e - 1 - 1],
    "k3": [math.exp(-0.5) + 0.5 - 1, math.e - 1 - 1],
}


@pytest.mark.parametrize("kind", list(KL_VALUES))
def test_kl_penalty_values(kind):
    assert_close(kl_penalty(t(LOGP), t(REF), kind), KL_VALUES[kind])


def test_low_var_kl_is_clamped_to_ten():
    assert kl_penalty(t([-30.0]), t([-10.0]), "k3").item() == 10.0  # exp(20) - 21 clamps to 10


@pytest.mark.parametrize("kind", list(KL_VALUES))
def test_straight_through_kl_has_the_value_of_its_estimator_and_the_gradient_of_k2(kind):
    log_prob = t(LOGP).requires_grad_()
    value = kl_penalty(log_prob, t(REF), kind + "+")
    assert_close(value.detach(), KL_VALUES[kind])
    (grad,) = torch.autograd.grad(value.sum(), log_prob)
    k2_log_prob = t(LOGP).requires_grad_()
    (k2_grad,) = torch.autograd.grad(kl_penalty(k2_log_prob, t(REF), "k2").sum(), k2_log_prob)
    assert_close(grad, k2_grad)
    assert_close(grad, [0.5, -1.0])  # d/d logp of ½(logp - ref)² = logp - ref


def test_kl_penalty_errors_list_the_options():
    with pytest.raises(ValueError, match="'full' .* not supported; use one of kl, k1, abs"):
        kl_penalty(t(LOGP), t(REF), "full")
    with pytest.raises(ValueError, match="unknown kl_penalty 'k4'; use one of .*low_var_kl"):
        kl_penalty(t(LOGP), t(REF), "k4")


def test_fixed_kl_controller():
    ctrl = FixedKLController(kl_coef=0.1)
    ctrl.update(current_kl=5.0, n_steps=100)
    assert ctrl.value == 0.1


def test_adaptive_kl_controller():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.15, n_steps=10)  # error 0.5 clipped to 0.2
    assert ctrl.value == pytest.approx(0.2 * (1 + 0.2 * 10 / 100))
    ctrl.update(current_kl=0.09, n_steps=10)  # error -0.1
    assert ctrl.value == pytest.approx(0.2 * 1.02 * (1 - 0.1 * 10 / 100))


def test_get_kl_controller():
    fixed = get_kl_controller({"type": "fixed", "kl_coef": 0.05})
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    adaptive = get_kl_controller(OmegaConf.create({"type": "adaptive", "kl_coef": 0.1, "target_kl": 1.0, "horizon": 7}))
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.1, 1.0, 7)
    with pytest.raises(ValueError, match="unknown algorithm.kl_ctrl.type 'pid'"):
        get_kl_controller({"type": "pid"})


def test_apply_kl_penalty():
    scores = t([[0, 0, 1], [0, 2, 0]])
    old = t([[-1, -1, -1], [-1, -1, -1]])
    ref = t([[-1.5, -1, -0.5], [-2, -1, 0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    # KL = old - ref = [[0.5, 0, -0.5], [1, 0, (masked)]]
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.5, horizon=10)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, kl_type="kl")
    assert_close(rewards, [[0 - 0.1 * 0.5, 0, 1 + 0.1 * 0.5], [0 - 0.1 * 1, 2, 0]])
    current_kl = ((0.5 + 0 - 0.5) / 3 + (1 + 0) / 2) / 2  # 0.25
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current_kl)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    # error clip(0.25 / 0.5 - 1) = -0.2, n_steps = bs = 2
    assert ctrl.value == pytest.approx(0.1 * (1 - 0.2 * 2 / 10))


# ------------------------------------------------------------------------------------------------
# Value and entropy losses
# ------------------------------------------------------------------------------------------------


def test_value_loss_clipping():
    # c = 0.2
    #   t0: v=1, v_old=0.5 -> clipped 0.7;  (1-2)² = 1,  (0.7-2)² = 1.69 -> 1.69 (clipped term larger)
    #   t1: v=2, v_old=2   -> clipped 2;    (2-0)² = 4 both            -> 4
    #   t2: v=4, v_old=3.5 -> clipped 3.7;  (4-3.5)² = 0.25, (3.7-3.5)² = 0.04 -> 0.25
    #   t3: masked
    vpreds = t([[1.0, 2.0, 4.0, 100.0]])
    values = t([[0.5, 2.0, 3.5, 0.0]])
    returns = t([[2.0, 0.0, 3.5, 0.0]])
    mask = t([[1, 1, 1, 0]])
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    assert vf_loss.item() == pytest.approx(0.5 * (1.69 + 4 + 0.25) / 3)
    assert vf_clipfrac.item() == pytest.approx(1 / 3)
    vf_sum, _ = compute_value_loss(vpreds, returns, values, mask, 0.2, loss_agg_mode="seq-mean-token-sum")
    assert vf_sum.item() == pytest.approx(0.5 * (1.69 + 4 + 0.25))


def test_entropy_loss_of_uniform_logits_is_log_vocab():
    logits = torch.zeros(2, 3, 5)
    mask = t([[1, 1, 0], [1, 0, 0]])
    assert compute_entropy_loss(logits, mask, "token-mean").item() == pytest.approx(math.log(5))
    # p = (1/4, 3/4) on every token
    two_class = torch.tensor([0.0, math.log(3.0)]).expand(2, 3, 2)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert compute_entropy_loss(two_class, mask, "seq-mean-token-mean").item() == pytest.approx(expected)
