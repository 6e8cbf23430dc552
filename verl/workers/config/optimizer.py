"""``actor_rollout_ref.actor.optim`` / ``critic.optim``: AdamW and the learning-rate schedule."""

from __future__ import annotations

from verl.base_config import BaseConfig, section

__all__ = ["FSDPOptimizerConfig", "OptimConfig", "OptimizerConfig"]


@section("actor_rollout_ref.actor.optim", shared=True)
class OptimConfig(BaseConfig):
    """AdamW and its schedule; see :mod:`verl.workers.engine.optim` for the formulas."""

    optimizer: str
    optimizer_impl: str
    lr: float
    eps: float
    lr_warmup_steps: int
    lr_warmup_steps_ratio: float
    lr_scheduler_type: str
    warmup_style: str | None
    min_lr_ratio: float
    num_cycles: float
    total_training_steps: int
    weight_decay: float
    betas: list[float]
    override_optimizer_config: dict


# The original's names.
OptimizerConfig = FSDPOptimizerConfig = OptimConfig
