"""The trainers' configuration: `ppo_trainer.yaml`, its typed sections, and how a command line becomes a config.

- `ppo_trainer.yaml`: every key of ``python -m verl.trainer.main_ppo`` with its default.
- `algorithm` / `config`: typed sections of the trainer's own (``AlgoConfig``, ``KLControlConfig``, ``DataConfig``,
  ``TrainerConfig``, ...), as the original names them; the workers' are in :mod:`verl.workers.config`.
- `compose.compose_ppo_config`: command-line overrides -> composed `DictConfig` (unknown keys reported).
- `checks`: the checks `verl.trainer.config_validation.validate_config` runs.
- `spec`: the run specification the driver resolves once from a validated config.

This module stays free of heavy imports; the names below are imported on first use.
"""

from verl.base_config import CONFIG_DIR, ConfigError
from verl.utils.lazy import lazy_exports

PPO_CONFIG_NAME = "ppo_trainer"

_EXPORTS = {name: ".algorithm" for name in ("AlgoConfig", "FilterGroupsConfig", "KLControlConfig",
                                            "PPOAlgorithmConfig", "RolloutCorrectionConfig")}
_EXPORTS.update({name: ".config" for name in (
    "CheckpointConfig", "ColocateAsyncConfig", "CustomRewardFunctionConfig", "DataConfig", "HybridRolloutSwitchConfig",
    "SFTDataConfig", "SamplerConfig", "SeparateAsyncConfig", "TrainerConfig", "V1TrainerConfig")})
__all__ = ["CONFIG_DIR", "ConfigError", "PPO_CONFIG_NAME", *sorted(_EXPORTS)]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
