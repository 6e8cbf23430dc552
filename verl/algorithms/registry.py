"""Name registries for advantage estimators and policy losses, and the names of the built-in estimators.

Both registries are dicts of name -> function, as the original's: ``ADV_ESTIMATOR_REGISTRY["grpo"]``,
``"grpo" in ADV_ESTIMATOR_REGISTRY`` and ``list(POLICY_LOSS_REGISTRY)`` work. Their rules and error texts
are the original's too: registering a different estimator under a taken name is an error, while a policy
loss registered under a taken name replaces the old one (a warning says so); an unknown name raises
ValueError starting "Unknown advantage estimator simply: <name>" or "Unsupported loss mode: <name>".
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

from verl.utils.registry import Registry, as_name

# fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
#   -> (pg_loss, metrics)
PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]


class _AdvEstimatorRegistry(Registry):
    def unknown_message(self, key: str) -> str:
        return f"Unknown advantage estimator simply: {key}. Registered: {self.choices_hint(key)}"

    def duplicate_message(self, key: str, existing: Any, new: Any) -> str:
        return (f"Adv estimator {key} has already been registered: {existing} vs {new}. Register yours under "
                "another name")


class _PolicyLossRegistry(Registry):
    replaces = True  # the original lets a later registration override a loss, e.g. a user's own "vanilla"

    def unknown_message(self, key: str) -> str:
        return f"Unsupported loss mode: {key}. Supported modes are: {list(self)}{self.where()}.{self.did_you_mean(key)}"


ADV_ESTIMATOR_REGISTRY = _AdvEstimatorRegistry("advantage estimator", "algorithm.adv_estimator")
POLICY_LOSS_REGISTRY = _PolicyLossRegistry("policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode")


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (the values of ``algorithm.adv_estimator``)."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"


def register_adv_est(name_or_enum: str | Enum) -> Callable:
    """Decorator registering an advantage estimator under ``name_or_enum`` (a str or an enum member).

    The function must return ``(advantages, returns)``, both (bs, response_length), and take its
    inputs by the parameter names that `compute_advantage` provides. Registering the same function
    again is fine; a different function under a taken name raises ValueError.
    """
    return ADV_ESTIMATOR_REGISTRY.register(name_or_enum)


def get_adv_estimator_fn(name_or_enum: str | Enum) -> Callable:
    """The advantage estimator registered under ``name_or_enum``; ValueError listing the names if unknown."""
    return ADV_ESTIMATOR_REGISTRY.lookup(name_or_enum)


def registered_adv_estimators() -> list[str]:
    return ADV_ESTIMATOR_REGISTRY.names()


def register_policy_loss(name: str | Enum) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name``; a taken name is overridden (with a warning).

    Signature: ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
    config=None, rollout_is_weights=None) -> (pg_loss, metrics)``, metrics holding at least
    ``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl`` (keys may also carry the ``actor/`` prefix).
    """
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str | Enum) -> PolicyLossFn:
    """The policy loss registered under ``name``; ValueError listing the names if unknown."""
    return POLICY_LOSS_REGISTRY.lookup(as_name(name))


def registered_policy_losses() -> list[str]:
    return POLICY_LOSS_REGISTRY.names()
