"""Trainers: ``python -m verl.trainer.main_ppo`` and the Python API.

    from verl.trainer import PPOTrainer, ActorRolloutRefConfig, ModelConfig, PPOAlgorithmConfig

The names below are imported on first use, so importing this package (as every
``python -m verl.trainer.<entry point>`` does) stays cheap.
"""

from verl.utils.lazy import lazy_exports

# Where each name lives: the workers' sections in verl.workers.config, the trainer's in verl.trainer.config.
_TRAINER_SECTIONS = ("CustomRewardFunctionConfig", "DataConfig", "KLControlConfig", "PPOAlgorithmConfig",
                     "TrainerConfig")
_WORKER_SECTIONS = ("ActorConfig", "ActorRolloutRefConfig", "CriticConfig", "FSDPConfig", "ModelConfig", "OptimConfig",
                    "PolicyLossConfig", "RefConfig", "RewardModelConfig", "RolloutConfig")
_EXPORTS = {**{name: "verl.trainer.config" for name in _TRAINER_SECTIONS},
            **{name: "verl.workers.config" for name in _WORKER_SECTIONS},
            "PPOTrainer": "verl.trainer.api", "build_ppo_config": "verl.trainer.api"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
