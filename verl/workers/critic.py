"""The critic on one rank: values of given responses, and the clipped value-loss update.

Position convention (the same as the actor's log-probs): the value of response token t is the value
head's output at the position just before it, i.e. hidden states at P-1 .. T-2 for a sequence of
P prompt and R response tokens (T = P + R): the value of the state from which token t is emitted.
Values are returned for every response column, also after the response's end; the driver masks them
with ``response_mask``.
"""

from __future__ import annotations

import torch

from verl.algorithms import compute_value_loss
from verl.models import forward_values
from verl.protocol import DataProto
from verl.utils.seqlen_balancing import map_micro_batches
from verl.utils.torch_functional import masked_mean
from verl.workers.actor import MULTI_MODAL_KEY, check_finite, multi_modal_inputs, run_mini_batches
from verl.workers.config.critic import CriticConfig

__all__ = ["DataParallelPPOCritic"]


class DataParallelPPOCritic:
    """Values and PPO value updates of one value model, on this rank's rows.

    Args:
        config: the ``critic`` section (a `CriticConfig` or a dict of its keys).
        engine: the :class:`~verl.workers.engine.FSDPEngine` holding the value model, with an optimizer.
        mini_batch_size: rows of this rank per optimizer step (``ppo_mini_batch_size`` x rollout.n /
            world size, normalised by the worker).
        micro_batch_size: rows per forward/backward in the update; ignored with ``max_token_len``.
        max_token_len: token budget of an update micro-batch (``use_dynamic_bsz``), or None.
        remove_padding: packed forwards (``critic.model.use_remove_padding``), see :mod:`verl.models.packed`.
    """

    def __init__(self, config, engine, *, mini_batch_size: int | None = None,
                 micro_batch_size: int | None = None, max_token_len: int | None = None, remove_padding: bool = False):
        self.config = CriticConfig.from_config(config)
        self.engine = engine
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = micro_batch_size
        self.max_token_len = max_token_len
        self.remove_padding = remove_padding

    @torch.no_grad()
    def compute_values(self, data: DataProto, *, micro_batch_size: int | None,
                       max_token_len: int | None = None) -> torch.Tensor:
        """Values (B, R) float32 of the responses, on the data's device; the model runs in eval mode."""
        module = self.engine.module
        module.eval()
        response_length = data.batch["responses"].shape[-1]
        return map_micro_batches(data, micro_batch_size, max_token_len, lambda m: forward_values(
            module, m.batch["input_ids"], m.batch["attention_mask"], m.batch["position_ids"], response_length,
            remove_padding=self.remove_padding, multi_modal_inputs=multi_modal_inputs(m)))

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """``ppo_epochs`` passes in mini-batches, one optimizer step each, gradients accumulated over
        micro-batches scaled by their share of the mini-batch. Returns lists: per micro-batch
        ``critic/vf_clipfrac``, ``critic/vpred_mean``; per optimizer step ``critic/grad_norm`` and
        ``critic/lr``; once per update ``critic/vf_loss``, the sum over epochs and mini-batches of the
        mini-batch's loss (as the original reports it). The LR scheduler is stepped by the worker."""
        config = self.config
        required = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "values", "returns"]
        present = set(data.batch.keys()) if data.batch is not None else set()
        missing = [k for k in required if k not in present]
        if missing:
            raise KeyError(f"update_critic needs batch keys {missing} (present: {sorted(present)}); values come "
                           "from compute_values, returns from the advantage estimator (GAE)")
        check_finite(data, "returns", "update_critic")
        check_finite(data, "values", "update_critic")
        cliprange, agg_mode = float(config.cliprange_value), config.loss_agg_mode

        def loss_fn(module, micro: DataProto):
            batch = micro.batch
            mask = batch["response_mask"]
            vpreds = forward_values(module, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                    mask.shape[-1], remove_padding=self.remove_padding,
                                    multi_modal_inputs=multi_modal_inputs(micro))
            vf_loss, vf_clipfrac = compute_value_loss(vpreds, batch["returns"], batch["values"], mask,
                                                      cliprange_value=cliprange, loss_agg_mode=agg_mode)
            metrics = {"critic/vf_loss": vf_loss.detach(), "critic/vf_clipfrac": vf_clipfrac.detach(),
                       "critic/vpred_mean": masked_mean(vpreds.detach(), mask)}
            return vf_loss * micro.meta_info["loss_scale"], metrics

        images = [k for k in (MULTI_MODAL_KEY,) if k in data.non_tensor_batch]  # a vision-language critic's inputs
        return run_mini_batches(self.engine, data.select(batch_keys=required, non_tensor_batch_keys=images), config,
                                "critic", self.mini_batch_size, self.micro_batch_size, self.max_token_len, loss_fn)
