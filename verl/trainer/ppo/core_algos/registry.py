"""Name registries for advantage estimators and policy losses, and a config reader shared by both."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

# --------------------------------------------------------------------------------------------------
# Registries
# --------------------------------------------------------------------------------------------------

ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {}


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


def _as_name(name: Any) -> str:
    value = getattr(name, "value", name)
    if not isinstance(value, str):
        raise TypeError(f"registry names are strings (or enums with a str .value), got {name!r}")
    return value


def _register(registry: dict, kind: str, name: Any) -> Callable:
    key = _as_name(name)

    def decorator(fn: Callable) -> Callable:
        existing = registry.get(key)
        if existing is not None and existing is not fn:
            raise ValueError(
                f"{kind} {key!r} is already registered to {existing.__module__}.{existing.__qualname__}; "
                "pick another name."
            )
        registry[key] = fn
        return fn

    return decorator


def _lookup(registry: dict, kind: str, name: Any) -> Callable:
    key = _as_name(name)
    if key not in registry:
        raise ValueError(f"unknown {kind} {key!r}; registered: {', '.join(sorted(registry))}")
    return registry[key]


def register_adv_est(name: str | Enum) -> Callable:
    """Decorator registering an advantage estimator under ``name`` (a str or an enum member).

    The function must return ``(advantages, returns)``, both (bs, response_length), and take its
    inputs by the parameter names that `compute_advantage` provides.
    """
    return _register(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def get_adv_estimator_fn(name: str | Enum) -> Callable:
    """The advantage estimator registered under ``name``; ValueError listing the names if unknown."""
    return _lookup(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def registered_adv_estimators() -> list[str]:
    return sorted(ADV_ESTIMATOR_REGISTRY)


def register_policy_loss(name: str | Enum) -> Callable:
    """Decorator registering a policy loss under ``name``.

    Signature: ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
    config=None, rollout_is_weights=None) -> (pg_loss, metrics)``, metrics holding at least
    ``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl``.
    """
    return _register(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_fn(name: str | Enum) -> Callable:
    """The policy loss registered under ``name``; ValueError listing the names if unknown."""
    return _lookup(POLICY_LOSS_REGISTRY, "policy loss", name)


def registered_policy_losses() -> list[str]:
    return sorted(POLICY_LOSS_REGISTRY)
