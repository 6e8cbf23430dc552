"""Rollout correction: importance weights and rejection for samples the trained policy did not generate.

The policy that generated a batch (the rollout engine at some weight version, in its precision) is never
exactly the policy being trained. With ``r = pi_train / pi_rollout`` per token (``log_ratio`` below):

- **IS weights** (``rollout_is``): ``token`` uses ``r_t``; ``sequence`` uses ``prod_t r_t`` broadcast to the
  sequence's tokens. Log-ratios are clamped to +-20 before ``exp`` (no overflow), weights are truncated from
  above at ``rollout_is_threshold`` (TIS), zero on padding, optionally divided by their batch mean
  (``rollout_is_batch_normalize``). They multiply the policy-gradient loss per token.
- **Rejection** (``rollout_rs``): a comma-separated list of criteria; a token (``token_*``) or a whole sequence
  (``seq_*``) failing any of them is removed from ``response_mask``. Per-token statistics: ``k1 = -log r``,
  ``k2 = (log r)^2 / 2``, ``k3 = r - 1 - log r``; sequence criteria take their sum, mean or max over the
  sequence's tokens. A ``k1`` criterion keeps a ratio between ``lower`` and ``upper`` (``"0.5_2.0"``; a single
  number ``u`` means ``1/u`` to ``u``): the token's ratio for ``token_k1``, the sequence's ratio for
  ``seq_sum_k1`` and its geometric-mean ratio for ``seq_mean_k1``. ``k2``/``k3`` criteria take one upper bound.
- **Diagnostics**: KL, k3-KL, perplexities, chi-squared of the ratio, always logged when the rollout's
  log-probs are present.

In decoupled mode the driver calls :func:`rollout_correction` once per batch with ``pi_train = pi_old``
(``verl.trainer.ppo.rollout_corr_helper``); in bypass mode (``old_log_probs = rollout_log_probs``) the
``bypass_mode`` policy loss calls it per micro-batch with the current policy. Every metric is named
``rollout_corr/...`` as in the original verl.
"""

from __future__ import annotations

import math

import torch

from verl.algorithms.losses import _finish, compute_policy_loss_vanilla
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean, masked_sum
from verl.workers.config.actor import ActorConfig

SAFETY_BOUND = 20.0
RS_KEY = "algorithm.rollout_correction.rollout_rs"
RS_THRESHOLD_KEY = "algorithm.rollout_correction.rollout_rs_threshold"
TOKEN_RS_OPTIONS = ("token_k1", "token_k2", "token_k3")
SUPPORTED_ROLLOUT_RS_OPTIONS = TOKEN_RS_OPTIONS + tuple(
    f"seq_{agg}_{k}" for agg in ("sum", "mean", "max") for k in ("k1", "k2", "k3") if (agg, k) != ("max", "k1"))
IS_LEVELS = ("token", "sequence")


def _item(value) -> float:
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def parse_rollout_rs(rollout_rs: str) -> list[str]:
    """The criteria of ``rollout_rs`` in order, each once; ValueError naming the key for an unknown one."""
    options = list(dict.fromkeys(part.strip() for part in str(rollout_rs).split(",") if part.strip()))
    unknown = [opt for opt in options if opt not in SUPPORTED_ROLLOUT_RS_OPTIONS]
    if not options or unknown:
        raise ValueError(f"{RS_KEY}={rollout_rs!r}: unknown criterion {unknown or [rollout_rs]}; use a comma-separated "
                         f"list of {', '.join(SUPPORTED_ROLLOUT_RS_OPTIONS)}")
    return options


def parse_rollout_rs_thresholds(options: list[str], spec) -> dict[str, tuple[float | None, float]]:
    """``{criterion: (lower, upper)}`` from ``rollout_rs_threshold``: one entry per criterion or one for all.

    A ``k1`` entry is a ratio range ``"lower_upper"`` or one number ``u`` (meaning ``1/u`` to ``u``); a ``k2``/``k3``
    entry is one positive upper bound (``lower`` is None).
    """
    if spec is None or isinstance(spec, bool):
        raise ValueError(f"{RS_THRESHOLD_KEY} is {spec!r} but {RS_KEY} is set; give one threshold per criterion "
                         "(e.g. 2.0, or \"0.5_2.0\" for a k1 ratio range)")
    entries = [spec] if isinstance(spec, (int, float)) else [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(entries) not in (1, len(options)):
        raise ValueError(f"{RS_THRESHOLD_KEY}={spec!r} has {len(entries)} entries for {len(options)} criteria "
                         f"({', '.join(options)}); give one shared entry or one per criterion")
    entries = entries * len(options) if len(entries) == 1 else entries
    bounds = {}
    for option, entry in zip(options, entries):
        text = str(entry)
        try:
            if option.endswith("k1"):
                lower, upper = (float(x) for x in text.split("_", 1)) if "_" in text else (1 / float(text), float(text))
            elif "_" in text:
                raise ValueError
            else:
                lower, upper = None, float(text)
        except (ValueError, ZeroDivisionError):
            form = "\"lower_upper\" or one number" if option.endswith("k1") else "one number (an upper bound)"
            raise ValueError(f"{RS_THRESHOLD_KEY}: {text!r} for {option} is not {form}") from None
        if upper <= 0 or (lower is not None and not 0 < lower <= upper):
            raise ValueError(f"{RS_THRESHOLD_KEY}: {text!r} for {option} must be positive"
                             + (" with lower <= upper" if lower is not None else ""))
        bounds[option] = (lower, upper)
    return bounds


def compute_rollout_correction_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str = "token",
                                       rollout_is_threshold: float = 2.0, rollout_is_batch_normalize: bool = False,
                                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated IS weights (zero on padding, detached) and their ``rollout_is_*`` statistics (before truncation)."""
    if rollout_is not in IS_LEVELS:
        raise ValueError(f"algorithm.rollout_correction.rollout_is={rollout_is!r}: use token, sequence or null")
    if not rollout_is_threshold > 0:
        raise ValueError(f"algorithm.rollout_correction.rollout_is_threshold={rollout_is_threshold!r} must be > 0")
    mask = response_mask.to(log_ratio.dtype)
    valid_seq = response_mask.sum(-1) > 0
    high, low = rollout_is_threshold, 1.0 / rollout_is_threshold
    if rollout_is == "token":
        weights = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
        valid = weights[response_mask.bool()]
        metrics = {"rollout_is_max": valid.max(), "rollout_is_min": valid.min(),
                   "rollout_is_ratio_fraction_high": (valid > high).float().mean(),
                   "rollout_is_ratio_fraction_low": (valid < low).float().mean()}
    else:
        seq_log_ratio = masked_sum(log_ratio, mask, axis=-1)
        weights = torch.exp(seq_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).unsqueeze(-1) * mask
        valid = seq_log_ratio[valid_seq]  # the true extremes, before the safety clamp
        metrics = {"rollout_is_max": torch.exp(valid.max().clamp(max=SAFETY_BOUND)), "rollout_is_min": valid.min().exp(),
                   "rollout_is_ratio_fraction_high": (valid > math.log(high)).float().mean(),
                   "rollout_is_ratio_fraction_low": (valid < math.log(low)).float().mean()}
    metrics["rollout_is_mean"] = masked_mean(weights, mask)
    bounded = weights.clamp(low, high)  # std and effective sample size of the weights as they are truncated
    bounded_mean = masked_mean(bounded, mask)
    metrics["rollout_is_std"] = (masked_mean(bounded.square(), mask) - bounded_mean.square()).clamp(min=0).sqrt()
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean((bounded / bounded_mean).square(), mask)
    seq_weights = masked_mean(weights, mask, axis=-1)[valid_seq]
    metrics.update({
        "rollout_is_seq_mean": seq_weights.mean(), "rollout_is_seq_max": seq_weights.max(),
        "rollout_is_seq_min": seq_weights.min(),
        "rollout_is_seq_std": seq_weights.std() if seq_weights.numel() > 1 else 0.0,
        "rollout_is_seq_max_deviation": (seq_weights - 1).abs().max(),
        "rollout_is_seq_fraction_high": (seq_weights > high).float().mean(),
        "rollout_is_seq_fraction_low": (seq_weights < low).float().mean()})
    weights = weights.clamp(max=high).detach()
    if rollout_is_batch_normalize:
        batch_mean = masked_mean(weights, mask) if rollout_is == "token" else seq_weights.clamp(max=high).mean()
        if batch_mean > 1e-8:
            weights = weights / batch_mean
        metrics["rollout_is_batch_norm_factor"] = batch_mean if batch_mean > 1e-8 else 1.0
    return weights, {k: _item(v) for k, v in metrics.items()}


def _token_statistic(log_ratio: torch.Tensor, k: str) -> torch.Tensor:
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -safe, "k2": 0.5 * safe.square(), "k3": torch.exp(safe) - 1 - safe}[k]


def compute_rollout_rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str = "token_k1",
                                   rollout_rs_threshold=None) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with the tokens or sequences failing any criterion of ``rollout_rs`` set to 0, and
    ``rollout_rs_*`` metrics (per criterion: its statistic's mean/max/min, fractions beyond the bounds, the
    fraction of tokens and of sequences it rejects; overall: the rejected fractions)."""
    options = parse_rollout_rs(rollout_rs)
    bounds = parse_rollout_rs_thresholds(options, rollout_rs_threshold)
    mask = response_mask.to(log_ratio.dtype)
    valid_tok, valid_seq = response_mask.bool(), response_mask.sum(-1) > 0
    keep_all = torch.ones_like(valid_tok)
    metrics: dict[str, float] = {}

    def rejected_fractions(keep: torch.Tensor) -> tuple[float, float]:
        dropped = valid_tok & ~keep
        return _item(masked_mean(dropped.to(mask.dtype), mask)), _item(dropped.any(-1)[valid_seq].float().mean())

    for option in options:
        lower, upper = bounds[option]
        agg, k = option.rsplit("_", 1)
        stat = _token_statistic(log_ratio, k)
        if agg != "token":
            if agg == "seq_max":
                stat = stat.masked_fill(~valid_tok, -torch.inf).max(-1).values.nan_to_num(neginf=0.0)
            else:
                stat = (masked_sum if agg == "seq_sum" else masked_mean)(stat, mask, axis=-1)
        # k1 = -log r: a ratio in [lower, upper] is a statistic in [-log upper, -log lower]
        hi = -math.log(lower) if k == "k1" else upper
        lo = -math.log(upper) if k == "k1" else -math.inf
        keep = (stat >= lo) & (stat <= hi)
        values = stat[valid_tok] if agg == "token" else stat[valid_seq]
        name = f"rollout_rs_{option}"
        metrics[f"{name}_mean"] = _item(masked_mean(stat if agg == "token" else stat.unsqueeze(-1).expand_as(mask), mask))
        metrics[f"{name}_max"], metrics[f"{name}_min"] = _item(values.max()), _item(values.min())
        if k == "k1":  # named by the ratio: "high" is a ratio above ``upper``
            metrics[f"{name}_fraction_high"] = _item((values < lo).float().mean())
            metrics[f"{name}_fraction_low"] = _item((values > hi).float().mean())
        else:
            metrics[f"{name}_fraction_high"] = _item((values > hi).float().mean())
        keep = keep if agg == "token" else keep.unsqueeze(-1).expand_as(valid_tok)
        metrics[f"{name}_masked_fraction"], metrics[f"{name}_seq_masked_fraction"] = rejected_fractions(keep)
        keep_all = keep_all & keep
    metrics["rollout_rs_masked_fraction"], metrics["rollout_rs_seq_masked_fraction"] = rejected_fractions(keep_all)
    return response_mask * keep_all.to(response_mask.dtype), metrics


def compute_offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None,
                              response_mask: torch.Tensor) -> dict[str, float]:
    """How far the training policy (``old_log_prob``: pi_old, or pi_theta in bypass mode) is from the rollout's:
    KL(rollout || training) and its k3 estimate, per-sequence perplexities and their log difference,
    chi-squared of the token ratio and of the sequence ratio."""
    mask = response_mask.to(old_log_prob.dtype)
    valid_seq = response_mask.sum(-1) > 0
    train_lp = masked_mean(old_log_prob, mask, axis=-1)[valid_seq]
    metrics = {"training_ppl": torch.exp(-train_lp).mean(), "training_log_ppl": (-train_lp).mean()}
    if rollout_log_prob is not None:
        log_ratio = old_log_prob - rollout_log_prob
        rollout_lp = masked_mean(rollout_log_prob, mask, axis=-1)[valid_seq]
        log_ppl_diff = rollout_lp - train_lp
        seq_log_ratio = masked_sum(log_ratio, mask, axis=-1)[valid_seq].clamp(-SAFETY_BOUND, SAFETY_BOUND)
        metrics.update({
            "kl": masked_mean(-log_ratio, mask), "k3_kl": masked_mean(torch.exp(log_ratio) - 1 - log_ratio, mask),
            "rollout_ppl": torch.exp(-rollout_lp).mean(), "rollout_log_ppl": (-rollout_lp).mean(),
            "log_ppl_diff": log_ppl_diff.mean(), "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
            "log_ppl_diff_max": log_ppl_diff.max(), "log_ppl_diff_min": log_ppl_diff.min(),
            "ppl_ratio": torch.exp(log_ppl_diff).mean(),
            "chi2_token": masked_mean(torch.exp(2 * log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)), mask) - 1,
            "chi2_seq": torch.exp(2 * seq_log_ratio).mean() - 1})
    return {k: _item(v) for k, v in metrics.items()}


def rollout_correction(train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       rollout_is: str | None = None, rollout_is_threshold: float | None = 2.0,
                       rollout_is_batch_normalize: bool = False, rollout_rs: str | None = None,
                       rollout_rs_threshold=None) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights (None when ``rollout_is`` is None), the response mask with rejection applied, and every metric
    under ``rollout_corr/``. ``train_log_prob`` is pi_old (decoupled mode) or pi_theta (bypass mode)."""
    if train_log_prob.shape != rollout_log_prob.shape or train_log_prob.shape != response_mask.shape:
        raise ValueError(f"rollout correction needs equal shapes: log-probs {tuple(train_log_prob.shape)}, rollout "
                         f"log-probs {tuple(rollout_log_prob.shape)}, response_mask {tuple(response_mask.shape)}")
    if not response_mask.any():  # nothing to weigh or reject
        return None, response_mask, {}
    train_log_prob, rollout_log_prob = train_log_prob.detach().float(), rollout_log_prob.detach().float()
    log_ratio = train_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, is_metrics = compute_rollout_correction_weights(log_ratio, response_mask, rollout_is,
                                                                 rollout_is_threshold, rollout_is_batch_normalize)
        metrics.update(is_metrics)
    mask = response_mask
    if rollout_rs is not None:
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(train_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def compute_policy_loss_reinforce(rollout_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                  config=None, rollout_is_weights=None):
    """REINFORCE with explicit IS weights and no clipping: ``L = -A * w * log pi_theta`` per token, ``w`` the truncated
    ``pi_theta / pi_rollout`` (detached) or 1. ``ppo_kl`` is the mean of ``rollout_log_prob - log_prob``."""
    config = ActorConfig.from_config(config)
    return _finish(-advantages * log_prob, rollout_log_prob, log_prob, response_mask, loss_agg_mode, config,
                   rollout_is_weights)


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                    config=None, rollout_is_weights=None):
    """Bypass mode: ``old_log_prob`` is the rollout's own log-probs (no recomputation). IS weights and rejection are
    computed here from the current policy against the rollout's (``actor.policy_loss.rollout_correction``), then
    ``loss_type`` picks the loss: ``ppo_clip`` (the vanilla PPO loss anchored at the rollout policy; its ratio is
    the IS correction, so no weights) or ``reinforce`` (:func:`compute_policy_loss_reinforce` with the weights)."""
    config = ActorConfig.from_config(config)
    corr = config.policy_loss.rollout_correction
    with torch.no_grad():
        weights, mask, corr_metrics = rollout_correction(
            log_prob, old_log_prob, response_mask, rollout_is=corr.rollout_is,
            rollout_is_threshold=corr.rollout_is_threshold,
            rollout_is_batch_normalize=corr.rollout_is_batch_normalize, rollout_rs=corr.rollout_rs,
            rollout_rs_threshold=corr.rollout_rs_threshold)
    if corr.loss_type == "reinforce":
        loss, metrics = compute_policy_loss_reinforce(old_log_prob, log_prob, advantages, mask, loss_agg_mode, config,
                                                      weights)
    elif corr.loss_type == "ppo_clip":
        loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, loss_agg_mode, config)
    else:
        raise ValueError(f"algorithm.rollout_correction.loss_type={corr.loss_type!r}: use ppo_clip or reinforce")
    return loss, {**metrics, **{k: torch.tensor(v) for k, v in corr_metrics.items()}}
