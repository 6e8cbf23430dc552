"""The workers' typed configs: one frozen dataclass per section of ppo_trainer.yaml, defaults read from the
yaml (see :mod:`verl.base_config`), under the original verl's names."""

from verl.workers.config.actor import ActorConfig, ActorRolloutRefConfig, FSDPActorConfig, PolicyLossConfig, RefConfig
from verl.workers.config.critic import CriticConfig, FSDPCriticConfig
from verl.workers.config.engine import FSDPConfig, FSDPEngineConfig
from verl.workers.config.model import HFModelConfig, ModelConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, OptimConfig, OptimizerConfig
from verl.workers.config.reward_model import OverlongBufferConfig, RewardModelConfig
from verl.workers.config.rollout import CheckpointEngineConfig, MultiTurnConfig, RolloutConfig, SamplingConfig

__all__ = ["ActorConfig", "ActorRolloutRefConfig", "CheckpointEngineConfig", "CriticConfig", "FSDPActorConfig", "FSDPConfig", "FSDPCriticConfig",
           "FSDPEngineConfig", "FSDPOptimizerConfig", "HFModelConfig", "ModelConfig", "MultiTurnConfig", "OptimConfig",
           "OptimizerConfig", "OverlongBufferConfig", "PolicyLossConfig", "RefConfig", "RewardModelConfig",
           "RolloutConfig", "SamplingConfig"]
