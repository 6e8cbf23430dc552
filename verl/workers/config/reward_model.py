"""``reward_model``: an optional model-based reward, and the reward manager used for every reward."""

from __future__ import annotations

from typing import Any

from verl.base_config import BaseConfig, section
from verl.utils.profiler.config import ProfilerConfig
from verl.workers.config.model import ModelConfig
from verl.workers.config.rollout import RolloutConfig

__all__ = ["OverlongBufferConfig", "RewardModelConfig", "uses_generative_reward"]


@section("reward_model.overlong_buffer")
class OverlongBufferConfig(BaseConfig):
    """DAPO's length penalty (reward_manager=dapo)."""

    enable: bool
    len: int
    penalty_factor: float
    log: bool


@section("reward_model")
class RewardModelConfig(BaseConfig):
    """Giving ``model=ModelConfig(path=...)`` without `enable` turns the reward model on (enable=true).

    ``use_reward_loop``, ``num_workers`` and ``rollout`` (the judge's engine, a `RolloutConfig` whose keys missing
    under ``reward_model.rollout`` keep the policy rollout's defaults) serve a generative reward model; see
    :mod:`verl.rewards.generative`."""

    enable: bool
    model: ModelConfig
    reward_manager: str
    strategy: str
    enable_resource_pool: bool
    n_gpus_per_node: int
    nnodes: int
    micro_batch_size: int | None
    micro_batch_size_per_gpu: int | None
    max_length: int | None
    ulysses_sequence_parallel_size: int
    use_dynamic_bsz: bool | None
    forward_max_token_len_per_gpu: int
    launch_reward_fn_async: bool
    sandbox_fusion: dict
    overlong_buffer: OverlongBufferConfig
    profiler: ProfilerConfig
    use_reward_loop: bool
    num_workers: int
    rollout: RolloutConfig

    def to_overrides(self, prefix: str | None = None) -> dict[str, Any]:
        prefix = prefix or self.PREFIX
        out = super().to_overrides(prefix)
        if "enable" not in self._given and out.get(f"{prefix}.model.path") is not None:
            out[f"{prefix}.enable"] = True
        return out


def uses_generative_reward(enable: bool | None, use_reward_loop: bool | None, custom_reward_path: str | None) -> bool:
    """Whether the reward model is a generative judge (:mod:`verl.rewards.generative`) rather than a sequence
    classifier: ``reward_model.enable``, ``reward_model.use_reward_loop`` and a ``custom_reward_function.path``."""
    return bool(enable and use_reward_loop and custom_reward_path)
