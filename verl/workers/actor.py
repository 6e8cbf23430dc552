"""The PPO actor on one rank: log-probs of given responses, and the policy update.

Everything here works on this rank's share of the batch (the worker's dispatcher already split it over
the data-parallel ranks); the engine averages gradients over the ranks. Batches arrive as a
:class:`DataProto` with, per row, the prompt and response concatenated:

- ``input_ids``, ``attention_mask``, ``position_ids``: (B, P+R), prompts left-padded;
- ``responses``: (B, R), the last R columns of ``input_ids``; ``response_mask``: (B, R).

A response token's log-prob is read from the logits one position before it (hidden states at
P-1 .. T-2, see :mod:`verl.models.logprob`), as log_softmax(logits / T) at sampling temperature T, so
that it is the probability the rollout actually sampled from.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from verl.algorithms import agg_loss, get_policy_loss_fn, kl_penalty
from verl.algorithms.registry import policy_loss_agg_mode
from verl.models import forward_logprobs, forward_logprobs_and_routing
from verl.models.moe import ExpertLoad, router_spec
from verl.models.vision import multi_modal_batch
from verl.protocol import DataProto
from verl.utils.seqlen_balancing import all_reduce_scalar, map_micro_batches, split_micro_batches
from verl.workers.config.actor import ActorConfig, RefConfig

__all__ = ["DataParallelPPOActor", "check_finite", "multi_modal_inputs", "run_mini_batches"]

MULTI_MODAL_KEY = "multi_modal_inputs"


def multi_modal_inputs(micro: DataProto) -> dict | None:
    """A vision-language batch's image inputs of these rows (:func:`verl.models.vision.multi_modal_batch`: each
    distinct row's images once, pixels on the batch's device, and their ``image_index``); None for text."""
    rows = micro.non_tensor_batch.get(MULTI_MODAL_KEY)
    if rows is None:
        return None
    return multi_modal_batch(rows, micro.batch["input_ids"].device) or None


def check_finite(data: DataProto, key: str, stage: str) -> None:
    """Raise naming the rows of ``data.batch[key]`` that hold NaN or inf (the update would be NaN)."""
    bad = ~torch.isfinite(data.batch[key].float()).reshape(len(data), -1).all(dim=-1)
    if bad.any():
        rows = bad.nonzero().flatten().tolist()
        raise ValueError(f"{stage}: batch['{key}'] holds NaN or inf in {len(rows)} of {len(data)} rows on this rank "
                         f"(first rows: {rows[:8]}). The step's data is broken before the update: check the rewards "
                         "(a reward function returning NaN/inf?), the values and the advantage estimator's inputs "
                         "(e.g. a GRPO group of one sample with norm_adv_by_std_in_grpo).")


# Losses reported once per update, as the original reports them: the sum over every epoch and mini-batch
# of the mini-batch's loss (its micro-batch losses weighted like their gradients). Other metrics: one value
# per micro-batch.
LOSS_METRICS = ("pg_loss", "kl_loss", "vf_loss")


def run_mini_batches(engine, data: DataProto, config, role: str, mini: int, micro: int | None,
                     max_token_len: int | None, loss_fn, loss_agg_modes: dict[str, str] | None = None
                     ) -> dict[str, list]:
    """The PPO update loop shared by actor and critic: ``ppo_epochs`` passes over ``data`` in
    mini-batches of ``mini`` rows (shuffled with ``data_loader_seed`` when ``shuffle``), one optimizer
    step per mini-batch over its micro-batches. Returns the ``<role>/...`` metrics as lists: the losses
    (:data:`LOSS_METRICS`) once per update, ``<role>/grad_norm`` and ``<role>/lr`` once per optimizer step,
    the others once per micro-batch.

    Each micro-batch gets ``meta_info["loss_scales"]``: its share of the mini-batch for each aggregation
    in use (``config.loss_agg_mode`` and the values of ``loss_agg_modes``), and ``meta_info["loss_scale"]``,
    the share for ``config.loss_agg_mode``. ``loss_fn`` multiplies each loss term by the share of the
    aggregation it has. ``loss_agg_modes`` names the loss metrics (e.g. ``{"pg_loss": "seq-mean-token-mean"}``)
    aggregated otherwise than ``config.loss_agg_mode``, so that they are weighted like their gradients."""
    if not mini or len(data) % mini:
        section = {"actor": "actor_rollout_ref.actor"}.get(role, role)
        raise ValueError(
            f"update_{role} got {len(data)} rows on this rank, not a multiple of the per-rank mini-batch ({mini} "
            f"rows = {section}.ppo_mini_batch_size x rollout.n / world size). Make data.train_batch_size x "
            f"rollout.n a multiple of {section}.ppo_mini_batch_size x rollout.n and of the number of devices.")
    agg_mode = config.loss_agg_mode
    metric_modes = {f"{role}/{name}": mode for name, mode in (loss_agg_modes or {}).items()}
    modes = {agg_mode, *metric_modes.values()}
    world = dist.get_world_size() if dist.is_initialized() else 1
    metrics: dict[str, list] = defaultdict(list)
    losses: dict[str, float] = {}
    # A new shuffle order every training step (and every epoch within it), reproducible from the seed.
    seed = int(config.data_loader_seed) + int(data.meta_info.get("global_steps", 0))
    batches = data.make_iterator(mini, epochs=int(config.ppo_epochs), shuffle=bool(config.shuffle), seed=seed)
    for mini_batch in batches:
        micros = split_micro_batches(mini_batch, micro, max_token_len)
        # Each micro-batch loss is scaled to its share of the mini-batch, so accumulating them gives the
        # loss of the whole mini-batch: by tokens over all ranks for token-mean (FSDP then averages over
        # ranks, hence x world), by rows for the per-sequence modes.
        if "token-mean" in modes:
            global_tokens = all_reduce_scalar(float(mini_batch.batch["response_mask"].sum()))
        for m in micros:
            m.meta_info["loss_scales"] = {
                mode: float(m.batch["response_mask"].sum()) * world / max(global_tokens, 1.0)
                if mode == "token-mean" else len(m) / mini for mode in modes}
            m.meta_info["loss_scale"] = m.meta_info["loss_scales"][agg_mode]
        stats = engine.train_step(micros, loss_fn)
        for key, values in stats.items():
            if key.split("/", 1)[-1] in LOSS_METRICS and key.startswith(f"{role}/"):
                mode = metric_modes.get(key, agg_mode)
                mini_batch_loss = sum(float(v) * m.meta_info["loss_scales"][mode] for v, m in zip(values, micros))
                losses[key] = losses.get(key, 0.0) + mini_batch_loss
            elif "/" in key:  # <role>/..., and a loss's own groups (rollout_corr/...); not the engine's grad_norm, lr
                metrics[key].extend(values)
        metrics[f"{role}/grad_norm"].append(stats["grad_norm"])
        metrics[f"{role}/lr"].append(stats["lr"])
    metrics.update({key: [value] for key, value in losses.items()})
    return dict(metrics)


class DataParallelPPOActor:
    """Log-probs and PPO updates of one model, on this rank's rows.

    Args:
        config: the ``actor_rollout_ref.actor`` section (an `ActorConfig` or a dict of its keys; for the
            reference policy, only :meth:`compute_log_prob` is used and ``config`` is the `RefConfig`).
        engine: the :class:`~verl.workers.engine.FSDPEngine` holding the model (with an optimizer
            for :meth:`update_policy`).
        mini_batch_size: rows of this rank per optimizer step (already multiplied by rollout.n and
            divided by the world size; see the worker).
        micro_batch_size: rows per forward/backward; ignored when ``max_token_len`` is set.
        max_token_len: token budget of a micro-batch (``use_dynamic_bsz``), or None.
        remove_padding: packed forwards (``model.use_remove_padding``; the model must be loaded with
            ``remove_padding=True``, see :mod:`verl.models.packed`).
        logprob_kernel: ``auto`` | ``torch`` | ``triton``, see :func:`verl.models.logprob.resolve_kernel`.
    """

    def __init__(self, config, engine, *, mini_batch_size: int | None = None, micro_batch_size: int | None = None,
                 max_token_len: int | None = None, remove_padding: bool = False, logprob_kernel: str = "auto"):
        self.config = config if isinstance(config, RefConfig) else ActorConfig.from_config(config)
        self.engine = engine
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = micro_batch_size
        self.max_token_len = max_token_len
        self.remove_padding = remove_padding
        self.logprob_kernel = logprob_kernel
        self.routing = router_spec(engine.module)  # None for a dense model: its update does no router work

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, *, temperature: float, micro_batch_size: int | None,
                         max_token_len: int | None = None, calculate_entropy: bool = True):
        """(log_probs, entropy) of the responses, both (B, R) float32 on the data's device; entropy
        is None unless ``calculate_entropy``. The model runs in eval mode."""
        module = self.engine.module
        module.eval()
        response_length = data.batch["responses"].shape[-1]
        return map_micro_batches(data, micro_batch_size, max_token_len, lambda micro: forward_logprobs(
            module, micro.batch["input_ids"], micro.batch["attention_mask"], micro.batch["position_ids"],
            response_length, temperature=temperature, compute_entropy=calculate_entropy,
            remove_padding=self.remove_padding, kernel=self.logprob_kernel,
            multi_modal_inputs=multi_modal_inputs(micro)))

    def update_policy(self, data: DataProto, *, temperature: float) -> tuple[dict[str, list[float]], DataProto | None]:
        """``ppo_epochs`` passes over ``data`` in mini-batches, one optimizer step per mini-batch.

        Each micro-batch loss is scaled to its share of the mini-batch (see :func:`run_mini_batches`): the
        policy loss by the aggregation its registration declares (gspo, sapo, geo_mean: by sequences), else
        by ``loss_agg_mode``, as the KL and entropy terms; ``actor/pg_loss`` is weighted the same way.
        The LR scheduler is not stepped here (the worker steps it once per training step).

        Without ``old_log_probs`` in ``data`` the update must be exactly on-policy (one epoch, one
        mini-batch holding every row): the old log-probs are then the first forward's own, detached, as
        a separate no-grad pass would have computed them, and they are returned (with the entropy) as
        ``old_log_probs``/``entropys`` rows in the input order; otherwise the second value is None.

        Returns metrics as lists: per micro-batch ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``,
        ``actor/ppo_kl`` (plus any extra metric of the policy loss), ``actor/entropy`` when computed,
        ``actor/kl_coef`` with ``use_kl_loss``; per optimizer step ``actor/grad_norm`` and ``actor/lr``;
        once per update ``actor/pg_loss`` and ``actor/kl_loss`` (0 without ``use_kl_loss``), each the sum
        over epochs and mini-batches of the mini-batch's loss, as the original reports them.
        """
        config = self.config
        present = set(data.batch.keys()) if data.batch is not None else set()
        fuse_old = "old_log_probs" not in present
        required = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages"]
        required += [] if fuse_old else ["old_log_probs"]
        if config.use_kl_loss:
            required.append("ref_log_prob")
        missing = [k for k in required if k not in present]
        if missing:
            raise KeyError(f"update_actor needs batch keys {missing} (present: {sorted(present)}); "
                           "ref_log_prob comes from compute_ref_log_prob, needed with actor.use_kl_loss=true")
        epochs = int(config.ppo_epochs)
        if fuse_old and (epochs != 1 or len(data) != self.mini_batch_size):
            raise ValueError("update_actor got no old_log_probs, which is only allowed for an on-policy update "
                             f"(ppo_epochs=1 and one mini-batch of all {len(data)} rows), but ppo_epochs={epochs} "
                             f"and the mini-batch holds {self.mini_batch_size} rows: call compute_log_prob first")
        check_finite(data, "advantages", "update_actor")
        data = data.select(batch_keys=required + [k for k in ("rollout_is_weights",) if k in present],
                           non_tensor_batch_keys=[k for k in (MULTI_MODAL_KEY,) if k in data.non_tensor_batch])
        recorded = None
        if fuse_old:
            data.batch["row_index"] = torch.arange(len(data), device=data.batch["input_ids"].device)
            recorded = {"old_log_probs": torch.zeros_like(data.batch["response_mask"], dtype=torch.float32),
                        "entropys": torch.zeros_like(data.batch["response_mask"], dtype=torch.float32)}
        expert_load = ExpertLoad() if self.routing is not None else None
        loss_fn = self._make_loss_fn(temperature, recorded, expert_load)
        pg_agg_mode = policy_loss_agg_mode(self._policy_loss_fn(), config.loss_agg_mode)
        metrics = run_mini_batches(self.engine, data, config, "actor", self.mini_batch_size, self.micro_batch_size,
                                   self.max_token_len, loss_fn, loss_agg_modes={"pg_loss": pg_agg_mode})
        metrics.setdefault("actor/kl_loss", [0.0])  # logged without KL loss too, as the original does
        if expert_load is not None:
            metrics.update({key: [value] for key, value in expert_load.metrics("actor/moe").items()})
        return metrics, (DataProto(batch=recorded) if recorded is not None else None)

    def _policy_loss_fn(self):
        """The registered policy loss of ``policy_loss.loss_mode``; in bypass mode (the old log-probs are
        the rollout's) the ``bypass_mode`` loss, which applies the rollout correction itself."""
        config = self.config
        bypass = config.policy_loss.rollout_correction.bypass_mode
        return get_policy_loss_fn("bypass_mode" if bypass else config.policy_loss.loss_mode)

    def _make_loss_fn(self, temperature: float, recorded: dict[str, torch.Tensor] | None = None,
                      expert_load: ExpertLoad | None = None):
        """The micro-batch loss. With ``recorded`` (on-policy, no old log-probs given) the old log-probs
        are this forward's, detached, and they and the entropy are written into ``recorded`` at the
        micro-batch's ``row_index``. A mixture-of-experts model (``self.routing``) adds its routers'
        auxiliary loss when its config asks for it (:mod:`verl.models.moe`), reports it as
        ``actor/moe/aux_loss`` and adds each forward's expert loads to ``expert_load``."""
        config = self.config
        policy_loss_fn = self._policy_loss_fn()
        agg_mode, scale_factor = config.loss_agg_mode, config.loss_scale_factor
        # A loss that aggregates its own way (gspo, sapo, geo_mean: per sequence) is weighted by its own mode.
        pg_agg_mode = policy_loss_agg_mode(policy_loss_fn, agg_mode)
        entropy_coeff = float(config.entropy_coeff)
        report_entropy = entropy_coeff != 0 or config.calculate_entropy
        need_entropy = report_entropy or recorded is not None
        use_kl_loss, kl_coef, kl_type = config.use_kl_loss, float(config.kl_loss_coef), config.kl_loss_type
        routing = self.routing

        def loss_fn(module, micro: DataProto):
            batch = micro.batch
            mask = batch["response_mask"]
            inputs = (module, batch["input_ids"], batch["attention_mask"], batch["position_ids"], mask.shape[-1])
            options = {"temperature": temperature, "compute_entropy": need_entropy,
                       "remove_padding": self.remove_padding, "kernel": self.logprob_kernel,
                       "multi_modal_inputs": multi_modal_inputs(micro)}
            if routing is None:
                log_prob, entropy = forward_logprobs(*inputs, **options)
            else:
                log_prob, entropy, aux_loss, loads = forward_logprobs_and_routing(*inputs, routing=routing, **options)
                expert_load.add(loads)
            if recorded is not None:
                old_log_prob = log_prob.detach()
                recorded["old_log_probs"][batch["row_index"]] = old_log_prob
                recorded["entropys"][batch["row_index"]] = entropy.detach()
            else:
                old_log_prob = batch["old_log_probs"]
            weights = {"rollout_is_weights": batch["rollout_is_weights"]} if "rollout_is_weights" in batch else {}
            pg_loss, pg_metrics = policy_loss_fn(
                old_log_prob=old_log_prob, log_prob=log_prob, advantages=batch["advantages"],
                response_mask=mask, loss_agg_mode=agg_mode, config=config, **weights)
            # Each term times this micro-batch's share of the mini-batch under the term's aggregation.
            scale = micro.meta_info["loss_scale"]
            loss = pg_loss * (scale if pg_agg_mode == agg_mode else micro.meta_info["loss_scales"][pg_agg_mode])
            # A loss's own metrics are actor/<name>; names with a group of their own (rollout_corr/...) stay.
            metrics = {"actor/pg_loss": pg_loss.detach(),
                       **{k if "/" in k else f"actor/{k}": v for k, v in pg_metrics.items()}}
            if report_entropy:
                entropy_mean = agg_loss(entropy, mask, agg_mode, scale_factor)
                if entropy_coeff != 0:
                    loss = loss - entropy_coeff * entropy_mean * scale
                metrics["actor/entropy"] = entropy_mean.detach()
            if use_kl_loss:
                kl = agg_loss(kl_penalty(log_prob, batch["ref_log_prob"], kl_type), mask, agg_mode, scale_factor)
                loss = loss + kl_coef * kl * scale
                metrics.update({"actor/kl_loss": kl.detach(), "actor/kl_coef": kl_coef})
            if routing is not None:
                if routing.add_aux_loss:
                    loss = loss + routing.aux_loss_coef * aux_loss * scale
                metrics["actor/moe/aux_loss"] = aux_loss.detach()
            return loss, metrics

        return loss_fn
