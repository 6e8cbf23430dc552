"""Loss aggregation, policy losses (registered by name), value loss and entropy loss."""

from __future__ import annotations

import warnings

import torch

from verl.algorithms.registry import LOSS_AGG_MODES, register_policy_loss
from verl.utils.torch_functional import entropy_from_logits, masked_mean, masked_sum
from verl.workers.config.actor import ActorConfig

# ---- Loss aggregation --------------------------------------------------------------------------------------------


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str,
             loss_scale_factor: float | None = None, *, dp_size: int = 1, batch_num_tokens: float | None = None,
             global_batch_size: float | None = None) -> torch.Tensor:
    """Reduce a (bs, response_length) loss to a scalar over the valid tokens.

    With S the set of sequences holding at least one valid token and ℓ_i = Σ_t mask·loss:
    - ``token-mean``:              Σ_i ℓ_i / Σ mask
    - ``seq-mean-token-sum``:      (1/|S|) Σ_{i∈S} ℓ_i
    - ``seq-mean-token-mean``:     (1/|S|) Σ_{i∈S} ℓ_i / len_i          (original GRPO)
    - ``seq-mean-token-sum-norm``: (1/|S|) Σ_{i∈S} ℓ_i / C, C = ``loss_scale_factor`` or, when None,
      response_length = loss_mat.shape[-1]                              (Dr.GRPO)
    Returns 0 when nothing is valid. Normalisers are local to this batch: the actor weighs each
    micro-batch's loss by its share of the mini-batch, so its losses leave the three keywords alone.
    They are the original's, for code written against it: ``batch_num_tokens`` (token-mean) or
    ``global_batch_size`` (seq-mean modes) replaces Σ mask or |S| by a global count, and the result is
    multiplied by ``dp_size`` (which, above 1, requires the global count). ``loss_scale_factor`` is
    the 4th positional argument here (the original's is ``dp_size``): pass these by keyword.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    global_count = batch_num_tokens if loss_agg_mode == "token-mean" else global_batch_size
    if dp_size > 1 and global_count is None:
        name = "batch_num_tokens" if loss_agg_mode == "token-mean" else "global_batch_size"
        raise ValueError(f"agg_loss with dp_size={dp_size} needs {name} (the count over all ranks) for "
                         f"loss_agg_mode={loss_agg_mode!r}")
    if loss_agg_mode == "token-mean":
        if global_count is None:
            return masked_mean(loss_mat, loss_mask)
        return masked_sum(loss_mat, loss_mask) / global_count * dp_size
    seq_sums = masked_sum(loss_mat, loss_mask, axis=-1)
    seq_lens = masked_sum(torch.ones_like(loss_mat), loss_mask, axis=-1)
    n_seqs = (seq_lens > 0).sum().clamp(min=1) if global_count is None else global_count
    if loss_agg_mode == "seq-mean-token-sum":
        per_seq = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        per_seq = seq_sums / seq_lens.clamp(min=1)
    else:
        scale = loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if scale <= 0:
            raise ValueError(f"loss_scale_factor must be positive, got {loss_scale_factor}")
        per_seq = seq_sums / scale
    return per_seq.sum() / n_seqs * dp_size


# ---- Policy losses -----------------------------------------------------------------------------------------------


def _clip_bounds(config: ActorConfig) -> tuple[float, float]:
    """(ε_low, ε_high): ``clip_ratio_low``/``clip_ratio_high``, each ``clip_ratio`` when null."""
    low, high = config.clip_ratio_low, config.clip_ratio_high
    return (config.clip_ratio if low is None else low), (config.clip_ratio if high is None else high)


def _ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    return torch.exp((log_prob - old_log_prob).clamp(-20.0, 20.0))


def _clipped_surrogate(ratio, advantages, low, high) -> tuple[torch.Tensor, torch.Tensor]:
    """max(−A·r, −A·clip(r, 1−low, 1+high)) and where the clipped branch is the larger one."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _finish(loss_mat, old_log_prob, log_prob, response_mask, loss_agg_mode, config, rollout_is_weights,
            clipped=None, dual_clipped=None, **extra) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Apply IS weights, aggregate, and build the metrics every policy loss reports."""
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    pg_loss = agg_loss(loss_mat, response_mask, loss_agg_mode, config.loss_scale_factor)

    def frac(flags):
        if flags is None:
            return torch.zeros((), device=loss_mat.device)
        return masked_mean(flags.float(), response_mask)

    metrics = {
        "pg_clipfrac": frac(clipped),
        "pg_clipfrac_lower": frac(dual_clipped),
        "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask),
        **extra,
    }
    return pg_loss, {k: v.detach().float() for k, v in metrics.items()}


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    """PPO clipped surrogate with dual-clip (Ye et al. 2020) and asymmetric clip-higher (DAPO).

    r = exp(clamp(logp − old, ±20)),  L1 = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)),
    L = L1 for A ≥ 0 and min(L1, −A·c) for A < 0, with c = ``clip_ratio_c`` > 1.
    pg_clipfrac: share of valid tokens where the clipped term wins; pg_clipfrac_lower: share where
    the dual clip is active; ppo_kl: masked mean of old − logp.
    """
    config = ActorConfig.from_config(config)
    low, high = _clip_bounds(config)
    c = config.clip_ratio_c
    if c <= 1.0:
        raise ValueError(f"actor.clip_ratio_c must be > 1 for dual-clip PPO (default 3.0), got {c}")
    loss, clipped = _clipped_surrogate(_ratio(old_log_prob, log_prob), advantages, low, high)
    dual_bound = -advantages * c
    dual_clipped = (advantages < 0) & (loss > dual_bound)
    loss = torch.where(dual_clipped, dual_bound, loss)
    return _finish(loss, old_log_prob, log_prob, response_mask, loss_agg_mode, config, rollout_is_weights,
                   clipped, dual_clipped)


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=None, cliprange_low=None,
                        cliprange_high=None, clip_ratio_c=3.0, loss_agg_mode="token-mean"):
    """The original's older entry point to the PPO loss (deprecated there too): `compute_policy_loss_vanilla`
    with the clip settings passed one by one instead of in an actor config.

    ``cliprange_low``/``cliprange_high`` default to ``cliprange``. Returns the tuple
    ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` rather than a metrics dict. Warns
    (FutureWarning) on every call, as the original does.
    """
    warnings.warn("Warning: Function 'verl.trainer.ppo.core_algos.compute_policy_loss' is deprecated. Please use "
                  "'verl.trainer.ppo.core_algos.compute_policy_loss_vanilla' instead.", FutureWarning, stacklevel=2)
    if cliprange is None and (cliprange_low is None or cliprange_high is None):
        raise ValueError("compute_policy_loss needs cliprange (or both cliprange_low and cliprange_high), e.g. 0.2")
    config = ActorConfig.from_config({
        "clip_ratio": cliprange if cliprange is not None else cliprange_low,
        "clip_ratio_low": cliprange_low, "clip_ratio_high": cliprange_high, "clip_ratio_c": clip_ratio_c})
    pg_loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                                   config)
    return pg_loss, metrics["pg_clipfrac"], metrics["ppo_kl"], metrics["pg_clipfrac_lower"]


@register_policy_loss("gspo", loss_agg_mode="seq-mean-token-mean")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                             config=None, rollout_is_weights=None):
    """GSPO (Zheng et al. 2025), token form: one importance ratio per sequence.

    s_i = exp(mean_t(logp − old)) over the valid tokens (exponent clamped to ±20), applied per token
    as r_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)) (value s_i, gradient s_i·∇logp_t), then clipped as
    vanilla without dual clip. Always aggregated with seq-mean-token-mean (``loss_agg_mode`` ignored; the
    registration declares it, so the actor weighs micro-batches by their sequences).
    """
    config = ActorConfig.from_config(config)
    low, high = _clip_bounds(config)
    seq_log_ratio = masked_mean(log_prob - old_log_prob, response_mask, axis=-1).clamp(-20.0, 20.0)
    ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach())
    loss, clipped = _clipped_surrogate(ratio, advantages, low, high)
    return _finish(loss, old_log_prob, log_prob, response_mask, "seq-mean-token-mean", config,
                   rollout_is_weights, clipped)


@register_policy_loss("sapo", loss_agg_mode="seq-mean-token-mean")
def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean",
                             config=None, rollout_is_weights=None):
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization"): a soft gate instead of a hard clip.

    r = exp(clamp(logp − old, ±20)),  f_τ(r) = (4/τ)·σ(τ·(r − 1)),  L = −f_τ(r)·A,
    τ = ``tau_pos`` where A > 0 and ``tau_neg`` where A ≤ 0 (actor_rollout_ref.actor.tau_pos/tau_neg).
    On policy (r = 1) the gradient equals vanilla PPO's (f'(1) = 1); away from r = 1 it fades smoothly,
    faster for larger τ. Always aggregated with seq-mean-token-mean (``loss_agg_mode`` ignored), as the
    original; declared at registration, so the actor weighs micro-batches by their sequences. Nothing is
    clipped: pg_clipfrac and pg_clipfrac_lower are 0.
    """
    config = ActorConfig.from_config(config)
    for name in ("tau_pos", "tau_neg"):
        if not getattr(config, name) > 0:
            raise ValueError(f"actor_rollout_ref.actor.{name} must be > 0 for the sapo policy loss (it divides the "
                             f"gate), got {getattr(config, name)}. The defaults are tau_pos=1.0, tau_neg=1.05")
    tau = torch.where(advantages > 0, float(config.tau_pos), float(config.tau_neg)).to(advantages.dtype)
    gate = torch.sigmoid(tau * (_ratio(old_log_prob, log_prob) - 1.0)) * (4.0 / tau)
    return _finish(-gate * advantages, old_log_prob, log_prob, response_mask, "seq-mean-token-mean", config,
                   rollout_is_weights)


@register_policy_loss("geo_mean", loss_agg_mode="seq-mean-token-mean")
def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization"): one ratio per sequence, the geometric
    mean of its clipped token ratios.

    Per valid token, with ℓ = clamp(logp − old, ±20) and s = sign(A):
        ℓ̂ = s·min(s·ℓ, s·clip(ℓ, −ε_low, ε_high))   (PPO's pessimistic clip, in log space)
    per sequence i, means over its valid tokens:  ρ_i = exp(mean ℓ̂),  Ā_i = mean A,  L_i = −Ā_i·ρ_i,
    and the loss is the mean of L_i over the sequences with a valid token (``loss_agg_mode`` ignored, as
    the original; registered as seq-mean-token-mean, so the actor weighs micro-batches by their
    sequences). ε_low/ε_high are ``clip_ratio_low``/``clip_ratio_high`` (each ``clip_ratio`` when
    null); the paper uses 0.4 (ratios within [e^−0.4, e^0.4]). ``rollout_is_weights`` enter as their
    geometric mean over the sequence's valid tokens. pg_clipfrac / pg_clipfrac_lower: share of valid
    tokens where the clip is active (ℓ̂ ≠ ℓ) with A > 0 / A < 0.
    """
    config = ActorConfig.from_config(config)
    low, high = _clip_bounds(config)
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    sign = torch.sign(advantages)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-low, high))
    mask = response_mask.to(log_ratio.dtype)
    lengths = mask.sum(dim=-1)
    has_tokens = lengths > 0
    seq_ratio = torch.exp((clipped_log_ratio * mask).sum(dim=-1) / lengths.clamp(min=1))
    seq_adv = (advantages * mask).sum(dim=-1) / lengths.clamp(min=1)
    seq_loss = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        seq_loss = seq_loss * torch.exp((torch.log(rollout_is_weights + 1e-10) * mask).sum(dim=-1)
                                        / lengths.clamp(min=1))
    pg_loss = masked_mean(seq_loss, has_tokens)
    active = (clipped_log_ratio != log_ratio).detach()
    metrics = {
        "pg_clipfrac": masked_mean((active & (advantages > 0)).float(), response_mask),
        "pg_clipfrac_lower": masked_mean((active & (advantages < 0)).float(), response_mask),
        "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask),
    }
    return pg_loss, {k: v.detach().float() for k, v in metrics.items()}


@register_policy_loss("gpg")
def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                            config=None, rollout_is_weights=None):
    """GPG: plain policy gradient, L = −logp·A (no ratio, no clipping)."""
    config = ActorConfig.from_config(config)
    return _finish(-log_prob * advantages, old_log_prob, log_prob, response_mask, loss_agg_mode, config,
                   rollout_is_weights)


def _centred_cov(advantages, log_prob, response_mask) -> torch.Tensor:
    """Per-token (A − mean A)·(logp − mean logp), means over the valid tokens; no gradient."""
    logp = log_prob.detach()
    return (advantages - masked_mean(advantages, response_mask)) * (logp - masked_mean(logp, response_mask))


def _num_selected(ratio: float, n_valid: int) -> int:
    """k = max(1, ⌊ratio·n_valid⌋) tokens (0 when ratio ≤ 0 or nothing is valid)."""
    if ratio <= 0 or n_valid == 0:
        return 0
    return min(n_valid, max(1, int(ratio * n_valid)))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs").

    Starts from the PPO clipped loss. Among valid tokens not already clipped by PPO whose centred
    covariance (A − mean A)·(logp − mean logp) lies in [``clip_cov_lb``, ``clip_cov_ub``], k =
    max(1, ⌊``clip_cov_ratio``·n_valid⌋) are drawn uniformly at random (torch's global generator, so
    torch.manual_seed makes it reproducible) and their loss is detached: no gradient flows there.
    Extra metric ``pg_clipcov_frac``: share of valid tokens detached.
    """
    config = ActorConfig.from_config(config)
    low, high = _clip_bounds(config)
    loss_cfg = config.policy_loss
    cov_ratio, lb, ub = loss_cfg.clip_cov_ratio, loss_cfg.clip_cov_lb, loss_cfg.clip_cov_ub
    loss, clipped = _clipped_surrogate(_ratio(old_log_prob, log_prob), advantages, low, high)
    valid = response_mask.bool()
    cov = _centred_cov(advantages, log_prob, response_mask)
    candidates = (valid & ~clipped & (cov >= lb) & (cov <= ub)).flatten().nonzero().squeeze(-1)
    k = min(candidates.numel(), _num_selected(cov_ratio, int(valid.sum().item())))
    chosen = candidates[torch.randperm(candidates.numel())[:k].to(candidates.device)]
    detached = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    detached[chosen] = True
    detached = detached.view_as(valid)
    loss = torch.where(detached, loss.detach(), loss)
    return _finish(loss, old_log_prob, log_prob, response_mask, loss_agg_mode, config, rollout_is_weights,
                   clipped, pg_clipcov_frac=masked_mean(detached.float(), response_mask))


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                               config=None, rollout_is_weights=None):
    """KL-Cov (Cui et al. 2025): unclipped surrogate plus a KL penalty on high-covariance tokens.

    L_t = −A·r for most tokens, and −A·r + ``ppo_kl_coef``·|logp − old| for the k =
    max(1, ⌊``kl_cov_ratio``·n_valid⌋) valid tokens with the largest centred covariance
    (A − mean A)·(logp − mean logp). Extra metric ``pg_klcov_frac``: share of valid tokens penalised.
    """
    config = ActorConfig.from_config(config)
    cov_ratio, kl_coef = config.policy_loss.kl_cov_ratio, config.policy_loss.ppo_kl_coef
    valid = response_mask.bool()
    loss = -advantages * _ratio(old_log_prob, log_prob)
    cov = torch.where(valid, _centred_cov(advantages, log_prob, response_mask), -torch.inf)
    k = _num_selected(cov_ratio, int(valid.sum().item()))
    penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    penalised[torch.topk(cov.flatten(), k).indices] = True
    penalised = penalised.view_as(valid)
    loss = torch.where(penalised, loss + kl_coef * (log_prob - old_log_prob).abs(), loss)
    return _finish(loss, old_log_prob, log_prob, response_mask, loss_agg_mode, config, rollout_is_weights,
                   pg_klcov_frac=masked_mean(penalised.float(), response_mask))


@register_policy_loss("cispo")
def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                              config=None, rollout_is_weights=None):
    """CISPO (MiniMax-M1, 2025): L = −sg(clip(r, 1−ε_low, 1+ε_high))·A·logp.

    The ratio is clipped as a weight only, so every token keeps a gradient. pg_clipfrac: share of
    valid tokens whose ratio lies outside the clip range.
    """
    config = ActorConfig.from_config(config)
    low, high = _clip_bounds(config)
    ratio = _ratio(old_log_prob, log_prob).detach()
    weight = ratio.clamp(1.0 - low, 1.0 + high)
    loss = -weight * advantages * log_prob
    return _finish(loss, old_log_prob, log_prob, response_mask, loss_agg_mode, config, rollout_is_weights,
                   weight != ratio)


# ---- Value and entropy losses ------------------------------------------------------------------------------------


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                       cliprange_value: float, loss_agg_mode: str = "token-mean", dp_size: int = 1,
                       batch_num_tokens: float | None = None, global_batch_size: float | None = None,
                       loss_scale_factor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ½·agg(max((v − R)², (clip(v, v_old − c, v_old + c) − R)²)).

    ``values`` are the rollout-time predictions v_old, c = ``cliprange_value``; the last four arguments
    go to `agg_loss`. Returns (vf_loss, vf_clipfrac), the clipfrac being the share of valid tokens where
    the clipped term is larger.
    """
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns).square()
    clipped = (vpreds_clipped - returns).square()
    vf_loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode, loss_scale_factor,
                             dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
    vf_clipfrac = masked_mean((clipped > unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac.detach()


def compute_entropy_loss(logits: torch.Tensor, response_mask: torch.Tensor,
                         loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """agg(H(softmax(logits))) over valid tokens for logits (bs, response_length, vocab).

    This is the entropy itself (positive); the actor subtracts ``entropy_coeff`` times it.
    """
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
