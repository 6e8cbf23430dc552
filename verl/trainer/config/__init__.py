"""The trainers' Hydra configuration: `ppo_trainer.yaml` and how a command line becomes a config.

- `ppo_trainer.yaml`: every key of ``python -m verl.trainer.main_ppo`` with its default.
- `compose.compose_ppo_config`: command-line overrides -> composed `DictConfig` (unknown keys reported).
- `checks`: the checks `verl.trainer.config_validation.validate_config` runs.

This module stays free of heavy imports; the submodules import Hydra when used.
"""

import os
from collections.abc import Sequence

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
PPO_CONFIG_NAME = "ppo_trainer"


class ConfigError(ValueError):
    """A configuration that cannot run.

    The message is a header line followed by one ``- <dotted.key>: <what is wrong>. <how to fix>`` line
    per problem; `problems` holds those lines without the leading ``- ``.
    """

    def __init__(self, header: str, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join([header, *(f"- {p}" for p in self.problems)]))
