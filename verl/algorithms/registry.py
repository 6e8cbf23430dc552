"""Name registries for advantage estimators and policy losses, and the names of the built-in estimators.

Both registries are dicts of name -> function, as the original's: ``ADV_ESTIMATOR_REGISTRY["grpo"]``,
``"grpo" in ADV_ESTIMATOR_REGISTRY`` and ``list(POLICY_LOSS_REGISTRY)`` work. Their rules and error texts
are the original's too: registering a different estimator under a taken name is an error, while a policy
loss registered under a taken name replaces the old one (a warning says so); an unknown name raises
ValueError starting "Unknown advantage estimator simply: <name>" or "Unsupported loss mode: <name>".

A policy loss that aggregates its own way, whatever ``loss_agg_mode`` it is passed, declares that
aggregation when it is registered (``register_policy_loss(name, loss_agg_mode=...)``); the actor weighs
its micro-batches by :func:`policy_loss_agg_mode`, so the mini-batch loss is that aggregate over the
whole mini-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

from verl.utils.registry import Registry, as_name

# How a (bs, response_length) loss becomes a scalar; see verl.algorithms.losses.agg_loss.
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

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


def register_policy_loss(name: str | Enum, *,
                         loss_agg_mode: str | None = None) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name``; a taken name is overridden (with a warning).

    Signature: ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
    config=None, rollout_is_weights=None) -> (pg_loss, metrics)``, metrics holding at least
    ``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl`` (keys may also carry the ``actor/`` prefix).

    ``loss_agg_mode``: only for a loss that ignores the ``loss_agg_mode`` it is passed and always
    aggregates one way (one of :data:`LOSS_AGG_MODES`; e.g. ``gspo``: ``"seq-mean-token-mean"``). It is
    kept on the function, and the actor weighs the micro-batches of such a loss by it instead of by
    ``actor.loss_agg_mode`` (see :func:`policy_loss_agg_mode`). Without it the loss is taken to
    aggregate as ``actor.loss_agg_mode`` says.
    """
    if loss_agg_mode is not None and loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"register_policy_loss({as_name(name)!r}, loss_agg_mode={loss_agg_mode!r}): not a loss "
                         f"aggregation mode; use one of {', '.join(LOSS_AGG_MODES)}, or None when the loss "
                         "aggregates as the loss_agg_mode it is passed")
    register = POLICY_LOSS_REGISTRY.register(name)

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if loss_agg_mode is not None:
            fn.loss_agg_mode = loss_agg_mode
        return register(fn)

    return decorator


def policy_loss_agg_mode(fn: PolicyLossFn, configured: str) -> str:
    """The aggregation of the loss ``fn`` returns: the mode it declared at registration, else ``configured``
    (the ``loss_agg_mode`` it is passed)."""
    return getattr(fn, "loss_agg_mode", None) or configured


def get_policy_loss_fn(name: str | Enum) -> PolicyLossFn:
    """The policy loss registered under ``name``; ValueError listing the names if unknown."""
    return POLICY_LOSS_REGISTRY.lookup(as_name(name))


def registered_policy_losses() -> list[str]:
    return POLICY_LOSS_REGISTRY.names()
