"""Compose the PPO trainer config from a command line and check it before anything heavy starts.

    from verl.trainer.config_validation import compose_ppo_config, validate_config
    config = compose_ppo_config(sys.argv[1:])   # Hydra overrides; unknown keys -> ConfigError
    warnings = validate_config(config)          # every problem at once -> ConfigError

`validate_config` raises one `ConfigError` whose message lists each problem on its own line as
``- <dotted.key>: <what is wrong>. <how to fix>``. Warnings (a key only another backend reads, a
deprecated key, ...) go to the ``verl.config`` logger and are returned. The checks themselves live in
`verl.trainer.config.checks`.

Check a command line without running anything (exit code 0 when valid, 1 otherwise; the CLI also runs
`verl.trainer.preflight`: data files, GPU, resume folder)::

    python -m verl.trainer.config_validation data.train_files=train.parquet actor_rollout_ref.model.path=MODEL ...
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from verl.trainer.config import (ConfigError, batch_checks, checks, lora_checks, multi_turn_checks, off_policy_checks,
                                 profiler_checks, reward_loop_checks, reward_section_checks, unused_keys)
from verl.trainer.config.checks import Issue, Run, check_types
from verl.trainer.config import PPO_CONFIG_NAME
from verl.trainer.config.compose import compose_config, compose_ppo_config, default_config_values

# The checks validate_config runs after check_types, in this order; a new check is one function
# added to checks.py (or unused_keys.py) and listed here.
CHECKS: tuple[Callable[[Run], Iterable[Issue]], ...] = (
    checks.check_required, checks.check_model_folders, checks.check_choices, checks.check_registered_names,
    checks.check_kl_estimators, checks.check_strategies, checks.check_rollout_engine, checks.check_loggers,
    checks.check_backend, checks.check_ranges, checks.check_sampling, checks.check_combinations,
    batch_checks.check_micro_batch_pairs, batch_checks.check_batch_sizes, batch_checks.check_dynamic_sampling,
    lora_checks.check_lora, multi_turn_checks.check_multi_turn, off_policy_checks.check_rollout_correction,
    off_policy_checks.check_trainer_mode, off_policy_checks.check_async_keys_in_sync_mode,
    profiler_checks.check_profiler, reward_loop_checks.check_reward_loop, reward_section_checks.check_reward_section,
    unused_keys.check_other_backend_keys, unused_keys.check_not_implemented,
)

__all__ = ["ConfigError", "SUCCESS_LINE", "checked_config", "compose_ppo_config", "main", "validate_config"]

logger = logging.getLogger("verl.config")

SUCCESS_LINE = "[validate_config] All configuration checks passed successfully!"


def validate_config(config: DictConfig | Mapping, *, n_devices: int | None = None) -> list[str]:
    """Check the whole config; raise `ConfigError` listing every problem, else return the warnings.

    `n_devices` is the total number of devices the workers get (default: trainer.n_gpus_per_node x
    trainer.nnodes). Each warning is a ``<dotted.key>: <message>`` string, also logged on
    ``verl.config``. On success prints `SUCCESS_LINE` once.
    """
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(dict(config))
    try:
        values = OmegaConf.to_container(config, resolve=True)
    except Exception as e:  # an interpolation pointing nowhere: nothing else can be checked reliably
        key = getattr(e, "full_key", None) or "<config>"
        raise ConfigError("Invalid configuration:", [f"{key}: cannot be resolved ({str(e).splitlines()[0]}). Fix "
                                                     "or remove the ${...} reference"]) from e

    run = Run(cfg=values, defaults=default_config_values(PPO_CONFIG_NAME),
              raw=OmegaConf.to_container(config, resolve=False))
    issues = list(check_types(run))
    run.bad_keys = {issue.key for issue in issues}
    nodes, per_node = run.get("trainer.nnodes"), run.get("trainer.n_gpus_per_node")
    if n_devices is not None:
        run.n_devices, run.n_devices_source = n_devices, "as passed to validate_config"
    elif isinstance(nodes, int) and isinstance(per_node, int) and nodes > 0 and per_node > 0:
        run.n_devices = nodes * per_node
        run.n_devices_source = f"trainer.n_gpus_per_node={per_node} x trainer.nnodes={nodes}"
    for check in CHECKS:
        issues.extend(issue for issue in check(run) if issue.key not in run.bad_keys)
    # A key that follows another through ${...} repeats the other key's problem: report it at the source.
    issues = [issue for issue in issues if not run.follows(issue.key)]
    # A key set through the original's reward.* section is reported as the user wrote it.
    issues = reward_section_checks.name_reward_keys(issues, run)

    warnings = [str(issue) for issue in issues if issue.warning]
    for line in warnings:
        logger.warning("[validate_config] warning: %s", line)
    errors = [str(issue) for issue in issues if not issue.warning]
    if errors:
        raise ConfigError(f"Invalid configuration ({len(errors)} problem{'s' if len(errors) > 1 else ''}):", errors)
    print(SUCCESS_LINE, flush=True)
    return warnings


def checked_config(argv: Sequence[str] | None = None, config_name: str = PPO_CONFIG_NAME,
                   translate: Callable[[DictConfig], DictConfig] | None = None) -> DictConfig | None:
    """The config of a command line (default ``sys.argv[1:]``) once it is valid and the machine and files it
    needs are there (:mod:`verl.trainer.preflight`); None after printing every problem to stderr. A recipe's
    entry point composes on its own ``config_name`` and ``translate``s its keys into the trainer's first."""
    from verl.trainer.preflight import preflight

    try:
        config = compose_config(sys.argv[1:] if argv is None else list(argv), config_name)
        if translate is not None:
            config = translate(config)
        validate_config(config)
        preflight(config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return None
    return config


def main(argv: Sequence[str] | None = None) -> int:
    """Compose and validate a command line without running anything; 0 when it is valid, else 1."""
    return 0 if checked_config(argv) is not None else 1


if __name__ == "__main__":
    sys.exit(main())
