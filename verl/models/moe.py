"""Mixture-of-experts routers in training: the load-balancing (auxiliary) loss and the experts' load.

A sparse MoE layer sends each token to the ``k`` experts of highest router probability (softmax over the
router logits, then top-k, as transformers' ``Qwen3MoeTopKRouter`` and its kin do), with no capacity
limit: no token is ever dropped, so there is no dropped-token figure to report.

The auxiliary loss is the Switch Transformer's, in the form transformers computes it
(``load_balancing_loss_func``, added as ``router_aux_loss_coef * aux_loss`` when the config sets
``output_router_logits``). Over the L MoE layers and the n valid tokens t (padding excluded; a packed
batch has none), with p_l(t) = softmax(router logits) and S_l(t) the k chosen experts:

    f_e = sum_l sum_t [e in S_l(t)] / (L n)      (fraction of routed assignments, sums to k)
    P_e = sum_l sum_t p_l(t)_e / (L n)            (mean router probability, sums to 1)
    aux = E * sum_e f_e * P_e                     (k at a perfectly even split)

Only P carries a gradient (the top-k choice does not). The original verl adds no such loss to its FSDP
actor (its Megatron path turns the router's load balancing off by default, "as it hurts perf in RL");
here the Hugging Face keys decide, as for transformers' own training: ``model.override_config.
output_router_logits=true`` adds it, scaled by ``model.override_config.router_aux_loss_coef``. The loader
moves that request from the model's config onto the model (:func:`take_aux_loss_request`), so that only
the actor's training forwards compute the loss.

Load statistics follow the original's rollout metrics (``rollout/moe/{max,min,avg}_vio``, from the
routing of generated tokens): per layer, the share of assignments each expert took, times E, minus 1
(0 everywhere at an even split); ``max_vio`` is the busiest expert's excess, ``min_vio`` the idlest
one's shortfall, ``avg_vio`` the mean absolute deviation; each summarised over layers by max and mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


# Model types whose routers choose the top-k experts of softmax(router logits), whose transformers
# forward records those logits as ``router_logits`` and computes the auxiliary loss with the formula above.
SOFTMAX_TOPK_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")

# Set on a model whose config asked for the auxiliary loss (see take_aux_loss_request).
AUX_LOSS_REQUESTED = "verl_router_aux_loss"

__all__ = ["AUX_LOSS_REQUESTED", "SOFTMAX_TOPK_MODEL_TYPES", "ExpertLoad", "RouterSpec", "load_balance_metrics",
           "router_load", "router_spec", "take_aux_loss_request"]


def take_aux_loss_request(model: torch.nn.Module) -> None:
    """Turn ``output_router_logits`` off in ``model.config`` and remember on the model that it was on.

    While it is on, transformers' causal-LM forward computes the auxiliary loss in every call, generation
    included, where transformers 5.25 fails (the loss masks one decoded token's router logits with the
    attention mask of the whole sequence). The actor asks for the router logits itself, in training forwards.
    """
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "output_router_logits", False):
        setattr(model, AUX_LOSS_REQUESTED, True)
        config.output_router_logits = False


@dataclass(frozen=True)
class RouterSpec:
    """What the training forward needs to know of a model's routers.

    ``add_aux_loss``: the config's ``output_router_logits`` (add ``aux_loss_coef`` x aux to the loss);
    ``aux_loss_coef``: its ``router_aux_loss_coef``.
    """

    num_experts: int
    top_k: int
    aux_loss_coef: float
    add_aux_loss: bool


def router_spec(model: torch.nn.Module) -> RouterSpec | None:
    """The routers of a Hugging Face causal LM (plain or FSDP-wrapped), or None for a dense model.

    A mixture-of-experts type not in :data:`SOFTMAX_TOPK_MODEL_TYPES` trains without router statistics;
    asking it for the auxiliary loss (``output_router_logits``) is then refused rather than ignored.
    """
    config = getattr(model, "config", None)
    if config is None:
        return None
    requested = bool(getattr(model, AUX_LOSS_REQUESTED, False) or getattr(config, "output_router_logits", False))
    model_type = getattr(config, "model_type", None)
    num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    if model_type not in SOFTMAX_TOPK_MODEL_TYPES:
        if requested:
            raise ValueError(f"actor_rollout_ref.model.override_config.output_router_logits=true: the router "
                             f"auxiliary loss is computed for {', '.join(SOFTMAX_TOPK_MODEL_TYPES)} models, not "
                             f"{model_type!r}; remove the key (or set it to false)")
        return None
    if not num_experts or not top_k:
        return None
    return RouterSpec(num_experts=int(num_experts), top_k=int(top_k),
                      aux_loss_coef=float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0),
                      add_aux_loss=requested)


def router_load(router_logits: Sequence[torch.Tensor], num_experts: int, top_k: int,
                valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The auxiliary loss (0-d float32, differentiable in the logits) and the expert loads (L, E) float32
    (how many valid tokens each layer sent to each expert; no gradient) of one forward.

    ``router_logits``: one (N, E) tensor per MoE layer, rows in the order of ``valid`` (N,) (True where
    the token is real); None means every row is a token (packed batches).
    """
    if not router_logits:
        return torch.zeros((), dtype=torch.float32), torch.zeros(0, num_experts)
    weight = None if valid is None else valid.reshape(-1, 1).to(router_logits[0].device, torch.float32)
    loads, prob_sums = [], []
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        with torch.no_grad():
            chosen = torch.zeros_like(probs).scatter_(1, probs.topk(top_k, dim=-1).indices, 1.0)
            loads.append((chosen if weight is None else chosen * weight).sum(0))
        prob_sums.append((probs if weight is None else probs * weight).sum(0))
    loads = torch.stack(loads)
    tokens = router_logits[0].shape[0] if weight is None else weight.sum()
    assignments = len(router_logits) * torch.as_tensor(tokens, dtype=torch.float32).clamp(min=1.0)
    fraction = loads.sum(0) / assignments
    mean_prob = torch.stack(prob_sums).sum(0) / assignments
    return num_experts * (fraction * mean_prob).sum(), loads


def load_balance_metrics(loads: torch.Tensor, prefix: str = "actor/moe") -> dict[str, float]:
    """``{prefix}/{max,min,avg}_vio/{max,avg}`` from per-layer expert loads (L, E) (see the module doc);
    layers that routed nothing are left out, and with none left the result is empty."""
    loads = loads.detach().double().cpu()
    loads = loads[loads.sum(-1) > 0]
    if not len(loads):
        return {}
    deviation = loads / loads.sum(-1, keepdim=True) * loads.shape[-1] - 1.0
    per_layer = {"max_vio": deviation.max(-1).values, "min_vio": deviation.min(-1).values,
                 "avg_vio": deviation.abs().mean(-1)}
    metrics = {}
    for name, values in per_layer.items():
        metrics[f"{prefix}/{name}/max"] = float(values.max())
        metrics[f"{prefix}/{name}/avg"] = float(values.mean())
    return metrics


class ExpertLoad:
    """Expert loads summed over the forwards of one update (each micro-batch's :func:`router_load`), then
    over the data-parallel ranks, as metrics. Every rank must call :meth:`metrics` (a collective)."""

    def __init__(self):
        self.loads: torch.Tensor | None = None

    def add(self, loads: torch.Tensor) -> None:
        loads = loads.detach()
        self.loads = loads.clone() if self.loads is None else self.loads + loads

    def metrics(self, prefix: str = "actor/moe") -> dict[str, float]:
        if self.loads is None:
            return {}
        loads = self.loads
        if dist.is_initialized() and dist.get_world_size() > 1:
            loads = loads.clone()
            dist.all_reduce(loads)
        return load_balance_metrics(loads, prefix)
