"""`verl.trainer.ppo.core_algos` as code written for the original verl uses it: the registries (dicts, their
registration rules and error texts), the vectorized GRPO/RLOO names, the sapo and geo_mean losses, the
deprecated `compute_policy_loss`, and the public functions' names and parameters. Expected numbers are
worked out by hand in the comments."""

import inspect
import logging
import math
from enum import Enum

import numpy as np
import pytest
import torch

import verl.trainer.ppo.core_algos as core_algos
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    agg_loss,
    compute_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_policy_loss,
    compute_policy_loss_geo_mean,
    compute_rewards,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    compute_value_loss,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    kl_penalty_forward,
    register_adv_est,
    register_policy_loss,
)
from verl.workers.config import ActorConfig

EPS = 1e-6


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def assert_close(actual, expected, abs=1e-6):
    assert torch.as_tensor(actual).double().flatten().tolist() == pytest.approx(
        torch.as_tensor(expected, dtype=torch.float64).flatten().tolist(), abs=abs)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


@pytest.fixture
def restore_registries():
    saved = [(registry, dict(registry)) for registry in (ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY)]
    yield
    for registry, contents in saved:
        registry.clear()
        registry.update(contents)


# ------------------------------------------------------------------------------------------------
# Registries
# ------------------------------------------------------------------------------------------------


def test_registries_are_dicts_of_name_to_function():
    assert isinstance(ADV_ESTIMATOR_REGISTRY, dict) and isinstance(POLICY_LOSS_REGISTRY, dict)
    assert "grpo" in ADV_ESTIMATOR_REGISTRY and ADV_ESTIMATOR_REGISTRY["grpo"] is compute_grpo_outcome_advantage
    assert "nope" not in ADV_ESTIMATOR_REGISTRY
    assert POLICY_LOSS_REGISTRY["vanilla"] is core_algos.compute_policy_loss_vanilla
    assert {"sapo", "geo_mean"} <= set(POLICY_LOSS_REGISTRY.keys())
    assert {e.value for e in AdvantageEstimator} <= set(ADV_ESTIMATOR_REGISTRY)


def test_register_estimator_by_string_or_enum(restore_registries):
    class Mine(str, Enum):
        HALF = "half_score"

    @register_adv_est(Mine.HALF)
    def half(token_level_rewards, response_mask, **kwargs):
        adv = token_level_rewards * 0.5
        return adv, adv

    @register_adv_est("double_score")
    def double(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards * 2, token_level_rewards * 2

    assert ADV_ESTIMATOR_REGISTRY["half_score"] is half and get_adv_estimator_fn(Mine.HALF) is half
    assert get_adv_estimator_fn("double_score") is double
    adv, _ = compute_advantage(Mine.HALF, token_level_rewards=t([[0, 4]]), response_mask=t([[1, 1]]))
    assert_close(adv, [[0, 2]])


def test_estimator_registered_twice_same_function_ok_different_function_error(restore_registries):
    @register_adv_est("twice")
    def first(token_level_rewards, response_mask):
        return token_level_rewards, token_level_rewards

    assert register_adv_est("twice")(first) is first
    assert register_adv_est(AdvantageEstimator.GRPO)(compute_grpo_outcome_advantage) is compute_grpo_outcome_advantage
    with pytest.raises(ValueError, match=r"^Adv estimator twice has already been registered: .*first.* vs .*second"):
        @register_adv_est("twice")
        def second(token_level_rewards, response_mask):
            return token_level_rewards, token_level_rewards
    assert ADV_ESTIMATOR_REGISTRY["twice"] is first


def test_policy_loss_registered_twice_replaces_the_first_with_a_warning(restore_registries, caplog):
    def my_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                   rollout_is_weights=None):
        return log_prob.sum(), {}

    with caplog.at_level(logging.WARNING, logger="verl.utils.registry"):
        assert register_policy_loss("vanilla")(my_vanilla) is my_vanilla
    assert get_policy_loss_fn("vanilla") is my_vanilla
    assert "policy loss 'vanilla'" in caplog.text and "my_vanilla replaces" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verl.utils.registry"):
        register_policy_loss("vanilla")(my_vanilla)  # the same function again: nothing to say
    assert caplog.text == ""


def test_unknown_names_raise_the_originals_value_errors():
    with pytest.raises(ValueError) as info:
        get_adv_estimator_fn("grop")
    message = str(info.value)
    assert message.startswith("Unknown advantage estimator simply: grop. Registered: ")
    assert "grpo_vectorized" in message and "algorithm.adv_estimator" in message and "Did you mean 'grpo'?" in message

    class Other(Enum):
        X = "not_registered"

    with pytest.raises(ValueError, match="^Unknown advantage estimator simply: not_registered"):
        get_adv_estimator_fn(Other.X)
    with pytest.raises(ValueError) as info:
        get_policy_loss_fn("sapoo")
    message = str(info.value)
    assert message.startswith("Unsupported loss mode: sapoo. Supported modes are: ['vanilla', ")
    assert "'geo_mean'" in message and "actor_rollout_ref.actor.policy_loss.loss_mode" in message
    assert "Did you mean 'sapo'?" in message


# ------------------------------------------------------------------------------------------------
# Config: the keys still name themselves, the new names validate, tau_pos/tau_neg flow to ActorConfig
# ------------------------------------------------------------------------------------------------

SEED = ["data.train_files=train.parquet", "data.val_files=test.parquet", "actor_rollout_ref.model.path=m",
        "critic.model.path=m", "trainer.n_gpus_per_node=1", "trainer.logger=['console']"]


def _validate(*overrides):
    from verl.trainer.config_validation import compose_ppo_config, validate_config

    return validate_config(compose_ppo_config([*SEED, *overrides]))


@pytest.fixture
def ray_installed(monkeypatch):
    from verl.trainer.config import checks

    real = checks._module_available
    monkeypatch.setattr(checks, "_module_available", lambda name: name == "ray" or real(name))


def test_config_check_names_the_key_and_lists_registered_names(ray_installed):
    from verl.trainer.config_validation import ConfigError

    with pytest.raises(ConfigError) as info:
        _validate("algorithm.adv_estimator=grpo_vectorised", "actor_rollout_ref.actor.policy_loss.loss_mode=geomean")
    message = str(info.value)
    assert "algorithm.adv_estimator: 'grpo_vectorised' is not a known advantage estimator" in message
    assert "grpo_vectorized" in message and "rloo_vectorized" in message
    assert "actor_rollout_ref.actor.policy_loss.loss_mode: 'geomean' is not a known policy loss" in message
    assert "sapo" in message and "geo_mean" in message


def test_new_names_validate_and_tau_flows_to_the_actor_config(ray_installed):
    from verl.trainer.config_validation import compose_ppo_config

    for loss in ("sapo", "geo_mean"):
        _validate(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}", "algorithm.adv_estimator=grpo_vectorized",
                  "critic.enable=false")
    _validate("algorithm.adv_estimator=rloo_vectorized", "critic.enable=false")
    config = compose_ppo_config([*SEED, "actor_rollout_ref.actor.tau_neg=2.5"])
    actor = ActorConfig.from_config(config.actor_rollout_ref.actor)
    assert (actor.tau_pos, actor.tau_neg) == (1.0, 2.5)
    assert (ActorConfig.from_config(None).tau_pos, ActorConfig.from_config(None).tau_neg) == (1.0, 1.05)


def test_tau_under_policy_loss_as_the_originals_sapo_scripts_write_it_warns(ray_installed):
    warnings = _validate("+actor_rollout_ref.actor.policy_loss.tau_pos=1.0",
                         "+actor_rollout_ref.actor.policy_loss.tau_neg=1.05")
    for name in ("tau_pos", "tau_neg"):
        assert any(w.startswith(f"actor_rollout_ref.actor.policy_loss.{name}: is set to")
                   and f"Set actor_rollout_ref.actor.{name}=" in w for w in warnings)


# ------------------------------------------------------------------------------------------------
# Vectorized GRPO / RLOO
# uids a, a, a, b; scores R = [1, 0, 2 | 3] (reward on the last valid token).
# group a: mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1; b is a singleton.
# ------------------------------------------------------------------------------------------------
REWARDS = t([[0, 1], [0, 0], [0, 2], [0, 3]])
MASK = t([[1, 1], [1, 0], [1, 1], [1, 1]])
INDEX = np.array(["a", "a", "a", "b"], dtype=object)


def test_grpo_vectorized_by_hand():
    # a: (R - 1) / (1 + eps); b (singleton, mean 0, std 1): 3 / (1 + eps)
    expected = t([0, -1, 1, 3]).unsqueeze(-1) / (1 + EPS) * MASK
    adv, returns = get_adv_estimator_fn("grpo_vectorized")(REWARDS, MASK, INDEX)
    assert_close(adv, expected)
    assert_close(returns, expected)
    adv, _ = compute_advantage(AdvantageEstimator.GRPO_VECTORIZED, token_level_rewards=REWARDS, response_mask=MASK,
                               index=INDEX, norm_adv_by_std_in_grpo=False)
    assert_close(adv, t([0, -1, 1, 3]).unsqueeze(-1) * MASK)


def test_rloo_vectorized_by_hand():
    # a (k = 3): R minus the mean of the other two = [1 - 1, 0 - 1.5, 2 - 0.5]; b (k = 1) keeps R = 3
    adv, returns = get_adv_estimator_fn(AdvantageEstimator.RLOO_VECTORIZED)(REWARDS, MASK, INDEX)
    assert_close(adv, t([0, -1.5, 1.5, 3]).unsqueeze(-1) * MASK)
    assert_close(returns, adv)


def _loop_reference(scores, index, kind):
    """One group at a time in plain Python (the original's non-vectorized form)."""
    out = []
    for i, uid in enumerate(index):
        group = [float(scores[j]) for j in range(len(index)) if index[j] == uid]
        k, mean = len(group), sum(group) / len(group)
        if kind == "grpo":
            std = math.sqrt(sum((x - mean) ** 2 for x in group) / (k - 1)) if k > 1 else 1.0
            out.append((float(scores[i]) - (mean if k > 1 else 0.0)) / (std + EPS))
        else:
            out.append((float(scores[i]) - mean) * k / (k - 1) if k > 1 else float(scores[i]))
    return t(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorized_estimators_equal_the_loop_versions_on_random_groups(seed):
    gen = torch.Generator().manual_seed(seed)
    bs, length = 23, 5
    rewards = torch.randn(bs, length, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, length + 1, (bs,), generator=gen)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).double()
    index = np.array([f"uid{int(g)}" for g in torch.randint(0, 7, (bs,), generator=gen)], dtype=object)
    scores = rewards.sum(-1)
    for vectorized, loop, kind in ((compute_grpo_vectorized_outcome_advantage, compute_grpo_outcome_advantage, "grpo"),
                                   (compute_rloo_vectorized_outcome_advantage, compute_rloo_outcome_advantage, "rloo")):
        fast, _ = vectorized(rewards, mask, index)
        slow, _ = loop(rewards, mask, index)
        assert torch.equal(fast, slow)
        assert_close(fast, _loop_reference(scores, index, kind).unsqueeze(-1) * mask, abs=1e-9)


# ------------------------------------------------------------------------------------------------
# sapo: L = -f(r)·A, f(r) = (4/τ)·σ(τ(r - 1)), τ = tau_pos where A > 0 else tau_neg; seq-mean-token-mean
# Here tau_pos = 1, tau_neg = 2.
#   row 0: r = 1, A = +1  -> f = 4·σ(0) = 2,         L = -2
#          r = 2, A = +1  -> f = 4·σ(1),             L = -4σ(1)
#   row 1: r = 1, A = -1  -> f = (4/2)·σ(0) = 1,     L = +1;   second token masked
#   per row: (-2 - 4σ(1)) / 2 = -1 - 2σ(1) and 1  ->  pg_loss = (-1 - 2σ(1) + 1) / 2 = -σ(1)
# Gradient dL/dlogp = -A·f'(r)·r with f'(r) = 4σ(τ(r-1))(1 - σ(τ(r-1))), times 1/2 (tokens in row 0) and 1/2
# (rows): token (0,0): -1·1·1/4 = -1/4; (0,1): -4σ(1)(1-σ(1))·2/4; (1,0): +1·1·1·(1/1)·(1/2) = 1/2.
# ------------------------------------------------------------------------------------------------
SAPO_CONFIG = {"tau_pos": 1.0, "tau_neg": 2.0}


def _sapo_inputs():
    old = t([[0.0, 0.0], [0.0, 0.0]])
    log_prob = t([[0.0, math.log(2.0)], [0.0, 5.0]]).requires_grad_()
    return old, log_prob, t([[1, 1], [-1, -1]]), t([[1, 1], [1, 0]])


def test_sapo_by_hand():
    old, log_prob, adv, mask = _sapo_inputs()
    loss, metrics = get_policy_loss_fn("sapo")(old, log_prob, adv, mask, "token-mean", SAPO_CONFIG)
    assert_close(loss, -sigmoid(1.0))  # loss_agg_mode is ignored: always seq-mean-token-mean
    loss.backward()
    s1 = sigmoid(1.0)
    assert_close(log_prob.grad, [[-1 / 4, -4 * s1 * (1 - s1) * 2 / 4], [1 / 2, 0]])
    assert_close([metrics["pg_clipfrac"], metrics["pg_clipfrac_lower"]], [0.0, 0.0])
    assert_close(metrics["ppo_kl"], -math.log(2.0) / 3)


def test_sapo_gate_saturates_far_off_policy_and_reads_the_yaml_defaults():
    # r = e^10 with A = +1, τ = 1: f = 4σ(e^10 - 1) = 4 (to float precision), and its gradient is ~0.
    log_prob = t([[10.0]]).requires_grad_()
    loss, _ = core_algos.compute_policy_loss_sapo(t([[0.0]]), log_prob, t([[1.0]]), t([[1.0]]), config=SAPO_CONFIG)
    loss.backward()
    assert_close(loss, -4.0)
    assert_close(log_prob.grad, [[0.0]])
    # Defaults tau_neg = 1.05: A = -1 at r = 1 gives L = (4 / 1.05)·σ(0) = 2 / 1.05; A = 0 gives 0.
    loss, _ = core_algos.compute_policy_loss_sapo(t([[0.0, 0.0]]), t([[0.0, 0.0]]), t([[-1.0, 0.0]]), t([[1, 1]]))
    assert_close(loss, (2 / 1.05 + 0) / 2)


def test_sapo_rollout_is_weights_scale_token_losses_and_tau_must_be_positive():
    old, log_prob, adv, mask = _sapo_inputs()
    weights = t([[1.0, 0.5], [2.0, 1.0]])
    loss, _ = get_policy_loss_fn("sapo")(old, log_prob, adv, mask, config=SAPO_CONFIG, rollout_is_weights=weights)
    # row 0: (-2 - 0.5·4σ(1)) / 2, row 1: 2·1
    assert_close(loss, ((-2 - 2 * sigmoid(1.0)) / 2 + 2) / 2)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.tau_neg must be > 0 .* got 0\.0"):
        get_policy_loss_fn("sapo")(old, log_prob, adv, mask, config={"tau_pos": 1.0, "tau_neg": 0.0})


# ------------------------------------------------------------------------------------------------
# geo_mean (GMPO). Per token ℓ = logp - old, clipped pessimistically in log space to [-ε_low, ε_high];
# ρ_i = exp(mean ℓ̂), L_i = -mean(A)·ρ_i, mean over rows with a valid token.
# ε = 0.2:
#   row 0: A = +1, ℓ = [0.5, -0.1] -> ℓ̂ = [min(0.5, 0.2), -0.1] = [0.2, -0.1], mean 0.05, L0 = -e^0.05
#   row 1: A = -1, ℓ = [-0.5, 0.4] -> ℓ̂ = [max(-0.5, -0.2), 0.4] = [-0.2, 0.4], mean 0.1,  L1 = +e^0.1
#   pg_loss = (e^0.1 - e^0.05) / 2. Clipped tokens carry no gradient; the others get -A·ρ_i / (2 tokens · 2 rows).
# ------------------------------------------------------------------------------------------------


def test_geo_mean_by_hand():
    old = t([[0.0, 0.0], [0.0, 0.0]])
    log_prob = t([[0.5, -0.1], [-0.5, 0.4]]).requires_grad_()
    adv, mask = t([[1, 1], [-1, -1]]), t([[1, 1], [1, 1]])
    loss, metrics = get_policy_loss_fn("geo_mean")(old, log_prob, adv, mask, "token-mean", {"clip_ratio": 0.2})
    assert_close(loss, (math.exp(0.1) - math.exp(0.05)) / 2)
    loss.backward()
    assert_close(log_prob.grad, [[0.0, -math.exp(0.05) / 4], [0.0, math.exp(0.1) / 4]])
    assert_close(metrics["pg_clipfrac"], 1 / 4)  # token (0,0): A > 0, clipped at +ε_high
    assert_close(metrics["pg_clipfrac_lower"], 1 / 4)  # token (1,0): A < 0, clipped at -ε_low
    assert_close(metrics["ppo_kl"], -(0.5 - 0.1 - 0.5 + 0.4) / 4)
    # IS weights enter as their geometric mean per row: row 0 [4, 1] -> 2, so L0 doubles.
    loss, _ = get_policy_loss_fn("geo_mean")(old, log_prob.detach(), adv, mask, config={"clip_ratio": 0.2},
                                             rollout_is_weights=t([[4.0, 1.0], [1.0, 1.0]]))
    assert_close(loss, (math.exp(0.1) - 2 * math.exp(0.05)) / 2)


def test_geo_mean_asymmetric_clip_masks_and_empty_rows():
    # ε_low = 0.1, ε_high = 0.3.
    #   row 0: A = +1, ℓ = [0.5, (9, masked)]  -> ℓ̂ = 0.3,                    L0 = -e^0.3
    #   row 1: A = -1, ℓ = [-0.5, -0.05]       -> ℓ̂ = [-0.1, -0.05], mean -0.075, L1 = +e^-0.075
    #   row 2: no valid token                  -> not counted
    #   row 3: A = +2, ℓ = [-0.5, 0.0]         -> A > 0 keeps the lower side: ℓ̂ = [-0.5, 0], mean -0.25,
    #                                             L3 = -2·e^-0.25 (unclipped, so not in pg_clipfrac)
    config = {"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.3}
    log_prob = t([[0.5, 9.0], [-0.5, -0.05], [3.0, 3.0], [-0.5, 0.0]])
    adv = t([[1, 1], [-1, -1], [1, 1], [2, 2]])
    mask = t([[1, 0], [1, 1], [0, 0], [1, 1]])
    loss, metrics = compute_policy_loss_geo_mean(torch.zeros(4, 2, dtype=torch.float64), log_prob, adv, mask,
                                                 config=config)
    assert_close(loss, (-math.exp(0.3) + math.exp(-0.075) - 2 * math.exp(-0.25)) / 3)
    assert_close([metrics["pg_clipfrac"], metrics["pg_clipfrac_lower"]], [1 / 5, 1 / 5])


# ------------------------------------------------------------------------------------------------
# compute_policy_loss (the original's deprecated tuple-returning form of vanilla PPO)
#   r = [1.5, 0.5], A = [+1, -1], ε = 0.2: token 0 max(-1.5, -1.2) = -1.2; token 1 max(0.5, 0.8) = 0.8
#   (dual clip -A·3 = 3 is not reached). pg_loss = (-1.2 + 0.8) / 2 = -0.2, both tokens clipped.
# ------------------------------------------------------------------------------------------------


def test_compute_policy_loss_returns_the_original_tuple_and_warns():
    old, log_prob = t([[0.0, 0.0]]), t([[math.log(1.5), math.log(0.5)]])
    adv, mask = t([[1.0, -1.0]]), t([[1, 1]])
    with pytest.warns(FutureWarning, match="compute_policy_loss' is deprecated.*compute_policy_loss_vanilla"):
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(old, log_prob, adv, mask, cliprange=0.2)
    assert_close([pg_loss, clipfrac, ppo_kl, clipfrac_lower], [-0.2, 1.0, -math.log(0.75) / 2, 0.0])
    # Clip higher through cliprange_high: token 0 becomes -1.28.
    with pytest.warns(FutureWarning):
        pg_loss, *_ = compute_policy_loss(old, log_prob, adv, mask, cliprange=0.2, cliprange_high=0.28)
    assert_close(pg_loss, (-1.28 + 0.8) / 2)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="needs cliprange"):
        compute_policy_loss(old, log_prob, adv, mask)


# ------------------------------------------------------------------------------------------------
# The original's keywords of agg_loss / compute_value_loss, config.global_batch_info, compute_rewards
# loss_mat [[1, 2], [3, 4]], mask [[1, 1], [1, 0]]: masked sum 6, row sums [3, 3], row means [1.5, 3].
# ------------------------------------------------------------------------------------------------
LOSS, LOSS_MASK = t([[1, 2], [3, 4]]), t([[1, 1], [1, 0]])


def test_agg_loss_accepts_the_originals_global_normalisers():
    assert_close(agg_loss(loss_mat=LOSS, loss_mask=LOSS_MASK, loss_agg_mode="token-mean", dp_size=2,
                          batch_num_tokens=12), 6 / 12 * 2)
    assert_close(agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum", dp_size=2, global_batch_size=4), 6 / 4 * 2)
    assert_close(agg_loss(LOSS, LOSS_MASK, "seq-mean-token-mean", global_batch_size=3), 4.5 / 3)
    assert_close(agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm", loss_scale_factor=2, global_batch_size=3),
                 6 / 2 / 3)
    with pytest.raises(ValueError, match="dp_size=2 needs batch_num_tokens"):
        agg_loss(LOSS, LOSS_MASK, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="dp_size=2 needs global_batch_size"):
        agg_loss(LOSS, LOSS_MASK, "seq-mean-token-mean", dp_size=2)


def test_a_loss_written_for_the_original_runs_with_global_batch_info():
    config = ActorConfig.from_config({"loss_scale_factor": 4.0})
    assert config.global_batch_info == {"loss_scale_factor": 4.0}
    # seq-mean-token-sum-norm with C = 4: row sums [3, 3] / 4, mean over 2 rows = 0.75
    assert_close(agg_loss(loss_mat=LOSS, loss_mask=LOSS_MASK, loss_agg_mode="seq-mean-token-sum-norm",
                          **config.global_batch_info), 0.75)


def test_value_loss_forwards_the_aggregation_keywords():
    # vpreds = returns + [[1, 1], [1, 1]] and values = vpreds (nothing clipped): squared error 1 everywhere,
    # token sum over 3 valid tokens = 3; with batch_num_tokens 6 and dp_size 2: 0.5·3/6·2 = 0.5.
    returns = t([[0, 0], [0, 0]])
    vpreds = returns + 1
    loss, clipfrac = compute_value_loss(vpreds, returns, vpreds, LOSS_MASK, cliprange_value=0.5, dp_size=2,
                                        batch_num_tokens=6)
    assert_close([loss, clipfrac], [0.5, 0.0])


def test_compute_rewards_and_kl_penalty_forward():
    # scores - 0.1·(old - ref) with old - ref = [0.5, -1]
    assert_close(compute_rewards(t([[1.0, 0.0]]), t([[-1.0, -2.0]]), t([[-1.5, -1.0]]), 0.1), [[0.95, 0.1]])
    assert_close(kl_penalty_forward(t([[-1.0]]), t([[-1.5]]), "k2"), [[0.5 * 0.25]])


# ------------------------------------------------------------------------------------------------
# The original's public functions exist under their names, with its parameters (names, in order)
# ------------------------------------------------------------------------------------------------
ORIGINAL_PARAMETERS = {
    "compute_gae_advantage_return": ["token_level_rewards", "values", "response_mask", "gamma", "lam"],
    "compute_grpo_outcome_advantage": ["token_level_rewards", "response_mask", "index", "epsilon",
                                       "norm_adv_by_std_in_grpo", "config"],
    "compute_grpo_vectorized_outcome_advantage": ["token_level_rewards", "response_mask", "index", "epsilon",
                                                  "norm_adv_by_std_in_grpo", "config"],
    "compute_grpo_passk_outcome_advantage": ["token_level_rewards", "response_mask", "index", "epsilon",
                                             "norm_adv_by_std_in_grpo", "config", "kwargs"],
    "compute_reinforce_plus_plus_baseline_outcome_advantage": ["token_level_rewards", "response_mask", "index",
                                                               "epsilon", "config", "kwargs"],
    "compute_rloo_outcome_advantage": ["token_level_rewards", "response_mask", "index", "epsilon", "config",
                                       "kwargs"],
    "compute_rloo_vectorized_outcome_advantage": ["token_level_rewards", "response_mask", "index", "epsilon",
                                                  "config", "kwargs"],
    "compute_opo_outcome_advantage": ["token_level_rewards", "response_mask", "index", "epsilon", "config", "kwargs"],
    "compute_reinforce_plus_plus_outcome_advantage": ["token_level_rewards", "response_mask", "config"],
    "compute_remax_outcome_advantage": ["token_level_rewards", "reward_baselines", "response_mask", "config",
                                        "kwargs"],
    "compute_gpg_outcome_advantage": ["token_level_rewards", "response_mask", "index", "epsilon", "f_norm", "alpha",
                                      "config", "kwargs"],
    "compute_policy_loss": ["old_log_prob", "log_prob", "advantages", "response_mask", "cliprange", "cliprange_low",
                            "cliprange_high", "clip_ratio_c", "loss_agg_mode"],
    "agg_loss": ["loss_mat", "loss_mask", "loss_agg_mode"],
    "compute_rewards": ["token_level_scores", "old_log_prob", "ref_log_prob", "kl_ratio"],
    "compute_entropy_loss": ["logits", "response_mask", "loss_agg_mode"],
    "compute_value_loss": ["vpreds", "returns", "values", "response_mask", "cliprange_value", "loss_agg_mode",
                           "dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor"],
    "kl_penalty": ["logprob", "ref_logprob", "kl_penalty"],
    "kl_penalty_forward": ["logprob", "ref_logprob", "kl_penalty"],
    "get_kl_controller": ["kl_ctrl"],
    "AdaptiveKLController": ["init_kl_coef", "target_kl", "horizon"],
    "FixedKLController": ["kl_coef"],
    "register_adv_est": ["name_or_enum"],
    "get_adv_estimator_fn": ["name_or_enum"],
    "register_policy_loss": ["name"],
    "get_policy_loss_fn": ["name"],
}
POLICY_LOSS_PARAMETERS = ["old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config",
                          "rollout_is_weights"]


@pytest.mark.parametrize("name", sorted(ORIGINAL_PARAMETERS))
def test_original_public_function_exists_with_its_parameters(name):
    params = ORIGINAL_PARAMETERS[name]
    obj = getattr(core_algos, name)
    if params is not None:
        assert list(inspect.signature(obj).parameters)[:len(params)] == params


@pytest.mark.parametrize("name", ["vanilla", "gspo", "sapo", "geo_mean", "gpg", "clip_cov", "kl_cov", "cispo"])
def test_policy_losses_take_the_originals_parameters(name):
    assert list(inspect.signature(get_policy_loss_fn(name)).parameters) == POLICY_LOSS_PARAMETERS
    assert getattr(core_algos, f"compute_policy_loss_{name}") is get_policy_loss_fn(name)


def test_agg_loss_takes_the_originals_normalisers_by_keyword():
    params = inspect.signature(agg_loss).parameters
    assert {"dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor"} <= set(params)
    assert params["dp_size"].default == 1
