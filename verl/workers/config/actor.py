"""``actor_rollout_ref``: the policy model and its three roles (actor, rollout, reference policy)."""

from __future__ import annotations

from typing import Any

from verl.base_config import BaseConfig, section
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.config.config import CheckpointConfig
from verl.utils.profiler.config import ProfilerConfig
from verl.workers.config.engine import FSDPConfig
from verl.workers.config.model import ModelConfig
from verl.workers.config.optimizer import OptimConfig
from verl.workers.config.rollout import RolloutConfig

__all__ = ["ActorConfig", "ActorRolloutRefConfig", "FSDPActorConfig", "PolicyLossConfig", "RefConfig"]


@section("actor_rollout_ref.actor.policy_loss")
class PolicyLossConfig(BaseConfig):
    """Which policy loss (a name in verl.algorithms' registry), and its parameters."""

    loss_mode: str
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    rollout_correction: RolloutCorrectionConfig  # = algorithm.rollout_correction (the bypass-mode loss reads it)


@section("actor_rollout_ref.actor")
class ActorConfig(BaseConfig):
    """The policy update. Batch sizes count prompts (multiplied by rollout.n per step)."""

    strategy: str
    ppo_mini_batch_size: int
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool | None
    ppo_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    data_loader_seed: int
    grad_clip: float
    clip_ratio: float
    clip_ratio_low: float | None  # null: clip_ratio
    clip_ratio_high: float | None
    clip_ratio_c: float
    tau_pos: float  # the sapo policy loss's gate temperature where A > 0
    tau_neg: float  # ... and where A <= 0
    loss_agg_mode: str
    loss_scale_factor: float | None
    entropy_coeff: float
    calculate_entropy: bool
    calculate_sum_pi_squared: bool  # not read (unused_keys.py warns)
    use_prefix_grouper: bool  # not read (unused_keys.py warns)
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    use_torch_compile: bool
    freeze_vision_tower: bool
    policy_loss: PolicyLossConfig
    checkpoint: CheckpointConfig
    optim: OptimConfig
    fsdp_config: FSDPConfig
    profiler: ProfilerConfig

    @property
    def global_batch_info(self) -> dict:
        """The `agg_loss` keywords a policy loss written for the original passes (``**config.global_batch_info``).
        Only ``loss_scale_factor``: here the actor weighs each micro-batch's loss by its share of the mini-batch,
        so a loss normalises over its own micro-batch."""
        return {"loss_scale_factor": self.loss_scale_factor}


FSDPActorConfig = ActorConfig  # the original's name


@section("actor_rollout_ref.ref")
class RefConfig(BaseConfig):
    """The frozen reference policy (its weights are the actor's initial ones)."""

    strategy: str
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool | None
    log_prob_max_token_len_per_gpu: int
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    use_torch_compile: bool
    fsdp_config: FSDPConfig
    profiler: ProfilerConfig


@section("actor_rollout_ref")
class ActorRolloutRefConfig(BaseConfig):
    """The policy model and its three roles, which share the same devices.

    `model` is the policy's model. As in published verl examples, `actor` and `ref` may also be given a
    `ModelConfig`: both then mean this same model group (the reference policy is the actor's initial
    weights), so they must agree with `model` and with each other on every field they set.
    """

    hybrid_engine: bool
    nccl_timeout: int
    model: ModelConfig
    actor: ActorConfig | ModelConfig
    ref: RefConfig | ModelConfig
    rollout: RolloutConfig

    def __post_init__(self, extra: dict | None = None) -> None:
        super().__post_init__(extra)
        for name, default in (("actor", ActorConfig), ("ref", RefConfig)):
            if isinstance(getattr(self, name), ModelConfig):  # it described the model: the role keeps its defaults
                object.__setattr__(self, name, default.from_dict({}, defaults=True))

    def _place(self, name: str, value: Any) -> str:
        return "model" if isinstance(value, ModelConfig) else name

    def _conflict(self, key: str, first: str, first_value: Any, second: str, second_value: Any) -> str:
        if not {first, second} <= {"model", "actor", "ref"}:
            return super()._conflict(key, first, first_value, second, second_value)
        if "ref" not in (first, second):
            return (f"{key}: the policy model is given twice with different values, by {first}=ModelConfig(...) "
                    f"({first_value!r}) and by {second}=ModelConfig(...) ({second_value!r}). Give it once")
        actor_value, ref_value = (first_value, second_value) if second == "ref" else (second_value, first_value)
        return (f"{key}: ref=ModelConfig(...) sets {ref_value!r} but the actor's model has {actor_value!r}. "
                "The reference policy is the actor's initial weights (loaded from actor_rollout_ref.model); "
                "a separate reference model is not supported. Pass the actor's ModelConfig as ref, or leave "
                "ref out (a RefConfig sets the reference's batch sizes and offload)")
