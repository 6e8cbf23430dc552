"""``critic``: the value model for GAE/PPO."""

from __future__ import annotations

from verl.base_config import BaseConfig, section
from verl.trainer.config.config import CheckpointConfig
from verl.utils.profiler.config import ProfilerConfig
from verl.workers.config.model import ModelConfig
from verl.workers.config.optimizer import OptimConfig

__all__ = ["CriticConfig", "FSDPCriticConfig"]


@section("critic")
class CriticConfig(BaseConfig):
    """The value model. Used when `enable` is true, or unset with adv_estimator=gae."""

    model: ModelConfig
    optim: OptimConfig
    enable: bool | None
    enable_resource_pool: bool
    n_gpus_per_node: int
    nnodes: int
    strategy: str
    rollout_n: int
    ppo_mini_batch_size: int
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: int | None
    forward_micro_batch_size: int | None
    forward_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool | None
    ppo_max_token_len_per_gpu: int
    forward_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    data_loader_seed: int
    grad_clip: float
    cliprange_value: float
    loss_agg_mode: str
    ulysses_sequence_parallel_size: int
    fsdp: dict  # not read: the critic's FSDP settings are model.fsdp_config
    use_torch_compile: bool
    checkpoint: CheckpointConfig
    profiler: ProfilerConfig


FSDPCriticConfig = CriticConfig  # the original's name
