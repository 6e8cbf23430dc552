"""Loss aggregation, policy losses (registered by name), value loss and entropy loss."""

from __future__ import annotations

import torch

from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import entropy_from_logits, masked_mean, masked_sum
from verl.workers.config.actor import ActorConfig

# ---- Loss aggregation --------------------------------------------------------------------------------------------

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str,
             loss_scale_factor: float | None = None) -> torch.Tensor:
    """Reduce a (bs, response_length) loss to a scalar over the valid tokens.

    With S the set of sequences holding at least one valid token and ℓ_i = Σ_t mask·loss:
    - ``token-mean``:              Σ_i ℓ_i / Σ mask
    - ``seq-mean-token-sum``:      (1/|S|) Σ_{i∈S} ℓ_i
    - ``seq-mean-token-mean``:     (1/|S|) Σ_{i∈S} ℓ_i / len_i          (original GRPO)
    - ``seq-mean-token-sum-norm``: (1/|S|) Σ_{i∈S} ℓ_i / C, C = ``loss_scale_factor`` or, when None,
      response_length = loss_mat.shape[-1]                              (Dr.GRPO)
    Returns 0 when nothing is valid. Normalisers are local to this batch: under gradient
    accumulation the caller weights micro-batches.
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    seq_sums = masked_sum(loss_mat, loss_mask, axis=-1)
    seq_lens = masked_sum(torch.ones_like(loss_mat), loss_mask, axis=-1)
    n_seqs = (seq_lens > 0).sum().clamp(min=1)
    if loss_agg_mode == "seq-mean-token-sum":
        per_seq = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        per_seq = seq_sums / seq_lens.clamp(min=1)
    else:
        scale = loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if scale <= 0:
            raise ValueError(f"loss_scale_factor must be positive, got {loss_scale_factor}")
        per_seq = seq_sums / scale
    return per_seq.sum() / n_seqs


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


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                             config=None, rollout_is_weights=None):
    """GSPO (Zheng et al. 2025), token form: one importance ratio per sequence.

    s_i = exp(mean_t(logp − old)) over the valid tokens (exponent clamped to ±20), applied per token
    as r_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)) (value s_i, gradient s_i·∇logp_t), then clipped as
    vanilla without dual clip. Always aggregated with seq-mean-token-mean (``loss_agg_mode`` ignored).
    """
    config = ActorConfig.from_config(config)
    low, high = _clip_bounds(config)
    seq_log_ratio = masked_mean(log_prob - old_log_prob, response_mask, axis=-1).clamp(-20.0, 20.0)
    ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach())
    loss, clipped = _clipped_surrogate(ratio, advantages, low, high)
    return _finish(loss, old_log_prob, log_prob, response_mask, "seq-mean-token-mean", config,
                   rollout_is_weights, clipped)


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
                       cliprange_value: float, loss_agg_mode: str = "token-mean") -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ½·agg(max((v − R)², (clip(v, v_old − c, v_old + c) − R)²)).

    ``values`` are the rollout-time predictions v_old, c = ``cliprange_value``. Returns
    (vf_loss, vf_clipfrac), the clipfrac being the share of valid tokens where the clipped term is larger.
    """
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns).square()
    clipped = (vpreds_clipped - returns).square()
    vf_loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean((clipped > unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac.detach()


def compute_entropy_loss(logits: torch.Tensor, response_mask: torch.Tensor,
                         loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """agg(H(softmax(logits))) over valid tokens for logits (bs, response_length, vocab).

    This is the entropy itself (positive); the actor subtracts ``entropy_coeff`` times it.
    """
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
