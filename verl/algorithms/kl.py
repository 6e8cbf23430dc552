"""KL estimators, KL coefficient controllers and the in-reward KL penalty."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.losses import agg_loss
from verl.trainer.config.algorithm import KLControlConfig


KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """The value of the estimator named ``kl_penalty`` (no trailing ``+``); see `kl_penalty`."""
    kind = kl_penalty
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind in ("low_var_kl", "k3"):
        log_ratio = (ref_logprob - logprob).clamp(-20.0, 20.0)
        return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)
    options = f"{', '.join(KL_PENALTY_TYPES)} (each may end in '+' for a straight-through k2 gradient)"
    if kind == "full":
        raise ValueError(f"kl_penalty 'full' needs the full-vocabulary distributions and is not supported; "
                         f"use one of {options}")
    raise ValueError(f"unknown kl_penalty {kind!r}; use one of {options}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimate from the log-probs of the sampled tokens (Schulman's k1/k2/k3).

    ``kl``/``k1``: logp − ref;  ``abs``: |logp − ref|;  ``mse``/``k2``: ½(logp − ref)²;
    ``low_var_kl``/``k3``: exp(ref − logp) − (ref − logp) − 1, clamped to [−10, 10].
    A trailing ``+`` (e.g. ``k3+``) is straight-through: the value of the named estimator with the
    gradient of k2, i.e. k2 + sg(named − k2).
    """
    if kl_penalty.endswith("+"):
        value = kl_penalty_forward(logprob, ref_logprob, kl_penalty[:-1])
        k2 = kl_penalty_forward(logprob, ref_logprob, "k2")
        return k2 + (value - k2).detach()
    return kl_penalty_forward(logprob, ref_logprob, kl_penalty)


def compute_rewards(token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
                    kl_ratio: float) -> torch.Tensor:
    """Token rewards with an in-reward KL penalty of fixed weight: scores − kl_ratio·(old − ref) (the k1
    estimate, every position; the trainer's own path, with a controller and a mask, is `apply_kl_penalty`)."""
    return token_level_scores - kl_ratio * kl_penalty_forward(old_log_prob, ref_log_prob, "kl")


class FixedKLController:
    """Constant KL coefficient β = ``kl_coef``."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Adaptive β (Ziegler et al. 2019).

    e = clip(KL/target − 1, −0.2, 0.2),  β ← β·(1 + e·n_steps/horizon).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs kl_ctrl.target_kl > 0 and kl_ctrl.horizon > 0, got {target_kl} "
                             f"and {horizon}")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """The controller ``algorithm.kl_ctrl`` describes (a `KLControlConfig`, or a dict of its keys)."""
    config = KLControlConfig.from_config(kl_ctrl)
    if config.type == "fixed":
        return FixedKLController(config.kl_coef)
    if config.type == "adaptive":
        return AdaptiveKLController(config.kl_coef, config.target_kl, config.horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {config.type!r}; use 'fixed' or 'adaptive'")


def apply_kl_penalty(token_level_scores: torch.Tensor, old_log_probs: torch.Tensor, ref_log_prob: torch.Tensor,
                     response_mask: torch.Tensor, kl_ctrl: FixedKLController | AdaptiveKLController,
                     kl_type: str = "kl") -> tuple[torch.Tensor, dict[str, float]]:
    """In-reward KL: rewards = scores − β·KL(old, ref)·mask, then kl_ctrl.update(current_kl, n_steps=bs).

    current_kl is the mean over sequences of the per-sequence masked token mean of KL (sequences with
    no valid token excluded). Metrics: ``actor/reward_kl_penalty`` = current_kl and
    ``actor/reward_kl_penalty_coeff`` = the β that was applied (before the update).
    """
    kld = kl_penalty(old_log_probs, ref_log_prob, kl_type) * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = agg_loss(kld, response_mask, "seq-mean-token-mean").item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
