"""Advantage estimators: (token_level_rewards, response_mask, ...) -> (advantages, returns).

Each estimator takes the original's parameters in the original's order; those it does not need
(``epsilon``, ``config``, ``**kwargs`` on some) are accepted and not read, so calls written for the original work.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Any

import numpy as np
import torch

from verl.algorithms.registry import AdvantageEstimator, get_adv_estimator_fn, register_adv_est
from verl.utils.registry import as_name
from verl.utils.torch_functional import masked_whiten


def compute_advantage(name: str | Enum, *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                      index: np.ndarray | None = None, values: torch.Tensor | None = None,
                      reward_baselines: torch.Tensor | None = None, gamma: float = 1.0, lam: float = 1.0,
                      norm_adv_by_std_in_grpo: bool = True, config: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator registered under ``name`` and return ``(advantages, returns)``.

    Each estimator receives those of these keyword arguments that appear in its signature (all of
    them if it takes ``**kwargs``); a parameter without default whose input is None is an error.
    So a custom estimator just declares what it needs, e.g.
    ``def my_est(token_level_rewards, response_mask, index): ...``. Runs under ``torch.no_grad``.
    """
    fn = get_adv_estimator_fn(name)
    if token_level_rewards.shape != response_mask.shape:
        raise ValueError(f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} must have the same (bs, response_length) shape")
    inputs = {"token_level_rewards": token_level_rewards, "response_mask": response_mask,
              "index": None if index is None else np.asarray(index, dtype=object), "values": values,
              "reward_baselines": reward_baselines, "gamma": gamma, "lam": lam,
              "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo, "config": config}
    kwargs = {}
    takes_any = False
    for param in inspect.signature(fn).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            takes_any = True
        elif param.kind is param.VAR_POSITIONAL:
            continue
        elif inputs.get(param.name) is not None:
            kwargs[param.name] = inputs[param.name]
        elif param.default is param.empty:
            if param.name in inputs:
                why = "which was None"
            else:
                why = f"which compute_advantage does not provide (it passes {', '.join(inputs)})"
            raise ValueError(f"advantage estimator {as_name(name)!r} needs `{param.name}`, {why}.")
    if takes_any:
        kwargs.update({k: v for k, v in inputs.items() if v is not None and k not in kwargs})
    with torch.no_grad():
        return fn(**kwargs)


def _group_ids(index: np.ndarray, bs: int, device: torch.device) -> tuple[torch.Tensor, list]:
    """Map each uid to a dense group number; returns (group number per sample, uid per group)."""
    if len(index) != bs:
        raise ValueError(f"index has {len(index)} uids but the batch has {bs} samples")
    numbers: dict = {}
    per_sample = [numbers.setdefault(uid, len(numbers)) for uid in index]
    return torch.tensor(per_sample, dtype=torch.long, device=device), list(numbers)


def _group_sum(values: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """Per sample: the sum of ``values`` over its group."""
    gid, uids = _group_ids(index, values.shape[0], values.device)
    return torch.zeros(len(uids), dtype=values.dtype, device=values.device).index_add(0, gid, values)[gid]


def _group_stats(scores: torch.Tensor, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: size, mean and unbiased std of the scores of its group (std 0 for singletons)."""
    count = _group_sum(torch.ones_like(scores), index)
    mean = _group_sum(scores, index) / count
    std = (_group_sum((scores - mean) ** 2, index) / (count - 1).clamp(min=1)).sqrt()
    return count, mean, std


def _mean_with_singletons_at_zero(scores: torch.Tensor, index: np.ndarray):
    """`_group_stats` with the singleton convention of GRPO: mean 0, std 1."""
    count, mean, std = _group_stats(scores, index)
    singleton = count < 2
    return count, torch.where(singleton, 0.0, mean), torch.where(singleton, 1.0, std)


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(token_level_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                                 gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016).

    Backwards over valid tokens t < t' (t' the next valid token, V_{t'} = A_{t'} = 0 past the end):
        δ_t = r_t + γ·V_{t'} − V_t,   A_t = δ_t + γλ·A_{t'},   returns_t = A_t + V_t.
    Masked tokens (e.g. tool observations inside a multi-turn response) are skipped: they are not a
    step, their reward is ignored, and the recursion carries through them unchanged.
    The advantages are then whitened over the valid tokens (masked_whiten).
    """
    valid = response_mask.bool()
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    adv_columns = []
    for t in reversed(range(values.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        next_adv = torch.where(valid[:, t], adv, next_adv)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        adv_columns.append(next_adv)
    advantages = torch.stack(adv_columns[::-1], dim=1)
    returns = torch.where(valid, advantages + values, 0.0)
    advantages = torch.where(valid, masked_whiten(advantages, response_mask), 0.0)
    return advantages, returns


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                   epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                                   config: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024): A = (R − mean_g) / (std_g + ε), broadcast to the valid tokens.

    mean_g and the unbiased std_g are taken over the group sharing the sample's uid; a singleton
    group uses mean 0 and std 1. With ``norm_adv_by_std_in_grpo=False`` (Dr.GRPO) A = R − mean_g.
    Returns = advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    _, mean, std = _mean_with_singletons_at_zero(scores, index)
    adv = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


# The group estimators here are already vectorized (the uids are numbered once, then each group statistic is
# one scatter-add; no tensor op per sample), so the original's "_vectorized" names register the same
# functions under a second name: the results are identical by construction.
compute_grpo_vectorized_outcome_advantage = register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)(
    compute_grpo_outcome_advantage)


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                         index: np.ndarray, epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                                         config: Any = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO: only the best sample of each group is credited, A_best = R_max − R_second.

    Divided by (std_g + ε) when ``norm_adv_by_std_in_grpo``; every other sample gets 0 (so does
    everyone on a tie for best). Needs at least two samples per group.
    """
    scores = token_level_rewards.sum(dim=-1)
    gid, uids = _group_ids(index, scores.shape[0], scores.device)
    adv = torch.zeros_like(scores)
    for g, uid in enumerate(uids):
        members = (gid == g).nonzero().squeeze(-1)
        if members.numel() < 2:
            raise ValueError(f"grpo_passk needs at least 2 samples per prompt, but uid {uid!r} has 1; "
                             "set actor_rollout_ref.rollout.n >= 2.")
        group_scores = scores[members]
        top2 = torch.topk(group_scores, 2)
        gap = top2.values[0] - top2.values[1]
        if norm_adv_by_std_in_grpo:
            gap = gap / (group_scores.std() + epsilon)
        adv[members[top2.indices[0]]] = gap
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None, gamma: float | None = None,
    **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted returns G_t = r_t + γ·G_{t'}, whitened over the batch.

    t' is the next valid token: masked positions (tool observations inside a multi-turn response, the
    padding after it) are skipped as in GAE, their rewards ignored and the return carried through them.
    γ is ``gamma``, else ``config.gamma`` (the original passes only the algorithm config), else 1.
    Returns = G, advantages = masked_whiten(G); both 0 on masked positions.
    """
    if gamma is None:
        gamma = 1.0 if config is None else config.gamma
    valid = response_mask.bool()
    running = torch.zeros_like(token_level_rewards[:, 0])
    columns = []
    for t in reversed(range(token_level_rewards.shape[1])):
        running = torch.where(valid[:, t], token_level_rewards[:, t] + gamma * running, running)
        columns.append(running)
    returns = torch.where(valid, torch.stack(columns[::-1], dim=1), 0.0)
    advantages = torch.where(valid, masked_whiten(returns, response_mask), 0.0)
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, epsilon: float = 1e-6,
    config: Any = None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: A = R − mean_g broadcast to tokens, then whitened over the batch.

    A singleton group uses mean 0. Returns = advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    _, mean, _ = _mean_with_singletons_at_zero(scores, index)
    adv = (scores - mean).unsqueeze(-1) * response_mask
    adv = torch.where(response_mask.bool(), masked_whiten(adv, response_mask), 0.0)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, epsilon: float = 1e-6,
    config: Any = None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024): A = R·k/(k−1) − mean_g·k/(k−1) = R − mean of the other k−1.

    A singleton group (k=1) has no "others": A = R, the raw score (an unbaselined REINFORCE term for
    that sample), as the original's ``rloo`` does (its ``rloo_vectorized`` gives such a sample 0 instead;
    here ``rloo_vectorized`` is this same function). Returns = advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    k, mean, _ = _group_stats(scores, index)
    adv = torch.where(k > 1, (scores - mean) * k / (k - 1).clamp(min=1), scores)
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


compute_rloo_vectorized_outcome_advantage = register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)(
    compute_rloo_outcome_advantage)


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor, config: Any = None,
    **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): returns_t = Σ_{s≥t} r_s, A_t = returns_t − b.

    b (``reward_baselines``, shape (bs,)) is the score of the greedy response to the same prompt.
    """
    valid = response_mask.bool()
    rewards = torch.where(valid, token_level_rewards, 0.0)
    returns = rewards.flip(-1).cumsum(dim=-1).flip(-1)
    advantages = torch.where(valid, returns - reward_baselines.unsqueeze(-1), 0.0)
    return advantages, returns * response_mask


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, epsilon: float = 1e-6,
    config: Any = None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025), length-weighted baseline: A = R − Σ_i len_i·R_i / Σ_i len_i.

    The sums run over the group, len_i is the number of valid response tokens of sample i.
    A singleton group has no baseline: A = R, the raw score, as the original does. Returns = advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    baseline = _group_sum(lengths * scores, index) / _group_sum(lengths, index).clamp(min=1)
    adv = torch.where(_group_sum(torch.ones_like(scores), index) > 1, scores - baseline, scores)
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, epsilon: float = 1e-6,
    f_norm: float = 1.0, alpha: float = 1.0, config: Any = None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025): A = α·(R − mean_g) / F_norm with α = bs / #{i : R_i ≠ 0}.

    α is always computed that way (the ``alpha`` argument is not read, as in the original); α = bs
    when no sample has a nonzero score; F_norm = ``f_norm`` (default 1: no std normalisation); a
    singleton group uses mean 0. Returns = advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    _, mean, _ = _mean_with_singletons_at_zero(scores, index)
    n_nonzero = int((scores != 0).sum().item())
    alpha = scores.shape[0] / max(n_nonzero, 1)
    adv = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return adv, adv
