"""Trainers: ``python -m verl.trainer.main_ppo`` and the Python API.

    from verl.trainer import PPOTrainer, ActorRolloutRefConfig, ModelConfig, PPOAlgorithmConfig

The names below are imported on first use, so importing this package (as every
``python -m verl.trainer.<entry point>`` does) stays cheap.
"""

import importlib

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "CriticConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FSDPConfig",
    "KLControlConfig",
    "ModelConfig",
    "OptimConfig",
    "PPOAlgorithmConfig",
    "PPOTrainer",
    "PolicyLossConfig",
    "RefConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "TrainerConfig",
    "build_ppo_config",
]
# Where each name lives; the config classes are in verl.trainer.config.objects.
_EXPORTS = {name: "verl.trainer.config.objects" for name in __all__}
_EXPORTS.update(PPOTrainer="verl.trainer.api", build_ppo_config="verl.trainer.api")


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
