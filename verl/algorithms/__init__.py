"""The math of PPO-style RL: advantage estimators, policy/value/entropy losses, KL penalties.

Everything here is a pure function of tensors (no models, no workers, no DataProto).

Conventions shared by all functions:
- Token tensors are (bs, response_length); ``response_mask`` is 1 on valid response tokens.
- ``index`` is a numpy object array of length bs holding each sample's group id (``uid``); the
  samples generated from one prompt share a uid.
- R is the sequence score, the sum of ``token_level_rewards`` over the response.
- Advantages and returns are 0 wherever ``response_mask`` is 0.
- A group with a single sample has no baseline of its own: ``grpo``, ``gpg`` and
  ``reinforce_plus_plus_baseline`` use mean 0 (and std 1), ``rloo`` and ``opo`` keep the raw score
  (as the original), ``grpo_passk`` raises.

Estimators and policy losses live in registries, so the trainer selects them by their config name
(``algorithm.adv_estimator``, ``actor.policy_loss.loss_mode``) and users can add their own with
``register_adv_est`` / ``register_policy_loss``. This package is also importable as
``verl.trainer.ppo.core_algos``, the original's path, with the original's public names.

Modules: ``registry`` (names), ``advantage`` (estimators), ``losses`` (aggregation, policy, value,
entropy), ``kl`` (estimators, controllers, in-reward penalty), ``rollout_correction`` (importance weights
and rejection for off-policy samples, the bypass-mode loss). Import from this package.
"""

from verl.algorithms.advantage import (  # noqa: F401
    compute_advantage, compute_gae_advantage_return, compute_gpg_outcome_advantage, compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage, compute_grpo_vectorized_outcome_advantage, compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage, compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage, compute_rloo_outcome_advantage, compute_rloo_vectorized_outcome_advantage
)
from verl.algorithms.kl import (  # noqa: F401
    KL_PENALTY_TYPES, AdaptiveKLController, FixedKLController, apply_kl_penalty, compute_rewards, get_kl_controller,
    kl_penalty, kl_penalty_forward
)
from verl.algorithms.losses import (  # noqa: F401
    LOSS_AGG_MODES, agg_loss, compute_entropy_loss, compute_policy_loss, compute_policy_loss_cispo,
    compute_policy_loss_clip_cov, compute_policy_loss_geo_mean, compute_policy_loss_gpg, compute_policy_loss_gspo,
    compute_policy_loss_kl_cov, compute_policy_loss_sapo, compute_policy_loss_vanilla, compute_value_loss
)
from verl.algorithms.rollout_correction import (  # noqa: F401
    compute_offpolicy_metrics, compute_policy_loss_bypass_mode, compute_rollout_correction_weights,
    compute_rollout_rejection_mask, rollout_correction
)
from verl.algorithms.registry import (  # noqa: F401
    ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, AdvantageEstimator, PolicyLossFn, get_adv_estimator_fn,
    get_policy_loss_fn, register_adv_est, register_policy_loss, registered_adv_estimators, registered_policy_losses
)

__all__ = ["ADV_ESTIMATOR_REGISTRY", "AdvantageEstimator", "POLICY_LOSS_REGISTRY", "PolicyLossFn",
           "get_adv_estimator_fn", "get_policy_loss_fn", "register_adv_est", "register_policy_loss",
           "registered_adv_estimators", "registered_policy_losses", "compute_advantage", "compute_gae_advantage_return",
           "compute_gpg_outcome_advantage", "compute_grpo_outcome_advantage", "compute_grpo_passk_outcome_advantage",
           "compute_grpo_vectorized_outcome_advantage", "compute_opo_outcome_advantage",
           "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
           "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage",
           "compute_rloo_vectorized_outcome_advantage", "LOSS_AGG_MODES", "agg_loss", "compute_entropy_loss",
           "compute_policy_loss", "compute_policy_loss_cispo", "compute_policy_loss_clip_cov",
           "compute_policy_loss_geo_mean", "compute_policy_loss_gpg", "compute_policy_loss_gspo",
           "compute_policy_loss_kl_cov", "compute_policy_loss_sapo", "compute_policy_loss_vanilla",
           "compute_value_loss", "AdaptiveKLController", "FixedKLController", "KL_PENALTY_TYPES", "apply_kl_penalty",
           "compute_rewards", "get_kl_controller", "kl_penalty", "kl_penalty_forward", "compute_offpolicy_metrics",
           "compute_policy_loss_bypass_mode", "compute_rollout_correction_weights", "compute_rollout_rejection_mask",
           "rollout_correction"]
