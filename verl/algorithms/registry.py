"""Name registries for advantage estimators and policy losses, and the names of the built-in estimators."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from verl.utils.registry import Registry


ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator", "algorithm.adv_estimator")
POLICY_LOSS_REGISTRY = Registry("policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode")


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (the values of ``algorithm.adv_estimator``)."""

    GAE = "gae"
    GRPO = "grpo"
    GRPO_PASSK = "grpo_passk"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    RLOO = "rloo"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"


def register_adv_est(name: str | Enum) -> Callable:
    """Decorator registering an advantage estimator under ``name`` (a str or an enum member).

    The function must return ``(advantages, returns)``, both (bs, response_length), and take its
    inputs by the parameter names that `compute_advantage` provides.
    """
    return ADV_ESTIMATOR_REGISTRY.register(name)


def get_adv_estimator_fn(name: str | Enum) -> Callable:
    """The advantage estimator registered under ``name``; ValueError listing the names if unknown."""
    return ADV_ESTIMATOR_REGISTRY.lookup(name)


def registered_adv_estimators() -> list[str]:
    return ADV_ESTIMATOR_REGISTRY.names()


def register_policy_loss(name: str | Enum) -> Callable:
    """Decorator registering a policy loss under ``name``.

    Signature: ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
    config=None, rollout_is_weights=None) -> (pg_loss, metrics)``, metrics holding at least
    ``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl``.
    """
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str | Enum) -> Callable:
    """The policy loss registered under ``name``; ValueError listing the names if unknown."""
    return POLICY_LOSS_REGISTRY.lookup(name)


def registered_policy_losses() -> list[str]:
    return POLICY_LOSS_REGISTRY.names()
