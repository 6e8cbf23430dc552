"""The original's ``reward:`` section, read here through ``reward_model.*`` and ``custom_reward_function.*``.

The original verl gathered its reward settings under one group (``reward.num_workers``, ``reward.reward_manager.*``,
``reward.custom_reward_function.*``, ``reward.reward_model.*``, ``reward.sandbox_fusion.*``), and the older keys this
verl reads became its legacy ones. ``ppo_trainer.yaml`` holds both layouts with their own defaults. When a config is
composed, `map_reward_section` copies each ``reward.*`` key set away from its default onto the one key the code
reads (`reward_keys`), so that the typed sections stay the only thing code reads. A key that was also set the older
way, to another value, is left as it is: :mod:`verl.trainer.config.reward_section_checks` reports both keys, and
names every ``reward.*`` key that nothing reads here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.base_config import at, yaml_defaults
from verl.trainer.config import PPO_CONFIG_NAME

__all__ = ["SECTION", "map_reward_section", "mapped_keys", "reward_keys", "set_keys"]

SECTION = "reward"
MANAGER_SOURCE = "reward.reward_manager.source"
MANAGER_NAME = "reward.reward_manager.name"
_ABSENT = object()

# reward.<key> -> the key read here (the reward model's rollout keys both layouts share are added by reward_keys).
_KEYS = {
    "reward.num_workers": "reward_model.num_workers",
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
    "reward.custom_reward_function.reward_kwargs": "custom_reward_function.reward_kwargs",
    MANAGER_NAME: "reward_model.reward_manager",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.enable_resource_pool": "reward_model.enable_resource_pool",
    "reward.reward_model.n_gpus_per_node": "reward_model.n_gpus_per_node",
    "reward.reward_model.nnodes": "reward_model.nnodes",
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.sandbox_fusion.url": "reward_model.sandbox_fusion.url",
    "reward.sandbox_fusion.max_concurrent": "reward_model.sandbox_fusion.max_concurrent",
    "reward.sandbox_fusion.memory_limit_mb": "reward_model.sandbox_fusion.memory_limit_mb",
    # The DAPO scripts add these (+reward.reward_kwargs...) for the dapo reward manager's length penalty.
    "reward.reward_kwargs.overlong_buffer_cfg.enable": "reward_model.overlong_buffer.enable",
    "reward.reward_kwargs.overlong_buffer_cfg.len": "reward_model.overlong_buffer.len",
    "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": "reward_model.overlong_buffer.penalty_factor",
    "reward.reward_kwargs.overlong_buffer_cfg.log": "reward_model.overlong_buffer.log",
}


@functools.cache
def reward_keys() -> dict[str, str]:
    """``reward.<key>`` -> the key the code reads instead, for every ``reward.*`` key that has one."""
    defaults = yaml_defaults(PPO_CONFIG_NAME)
    ours = at(defaults, "reward_model.rollout")
    rollout = {f"reward.reward_model.rollout.{name}": f"reward_model.rollout.{name}"
               for name in at(defaults, "reward.reward_model.rollout") if name in ours}
    return {**_KEYS, **rollout}


def mapped_keys(source: Any) -> dict[str, str]:
    """`reward_keys` for ``reward.reward_manager.source=<source>``: with ``importlib`` the manager's name is a class
    in ``reward.reward_manager.module.path``, not a registered name, so it maps onto nothing (the checks refuse it)."""
    keys = reward_keys()
    return {k: v for k, v in keys.items() if k != MANAGER_NAME} if source == "importlib" else keys


def set_keys(values: Mapping, defaults: Mapping, mapped: Mapping[str, str] | None = None) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of each leaf of the ``reward`` group ``values`` that differs from ``defaults`` (or was
    added with ``+``); a group that is one key of ``mapped`` (a dict setting such as ``reward_kwargs``) counts as a
    leaf."""
    yield from _set_keys(values, defaults, f"{SECTION}.", mapped or {})


def _set_keys(values: Mapping, defaults: Any, prefix: str, mapped: Mapping[str, str]) -> Iterator[tuple[str, Any]]:
    for name, value in values.items():
        key = f"{prefix}{name}"
        default = defaults.get(name, _ABSENT) if isinstance(defaults, Mapping) else _ABSENT
        if isinstance(value, Mapping) and key not in mapped:
            yield from _set_keys(value, default, f"{key}.", mapped)
        elif value != default:
            yield key, value


def map_reward_section(config: DictConfig) -> DictConfig:
    """Set the key read here of every ``reward.*`` key set away from its default, in place (``config`` is returned);
    one that already holds another value than its default is left for the checks to report. A config without a
    ``reward`` group (not a PPO trainer's) is returned as it is."""
    if not isinstance(config.get(SECTION), DictConfig):
        return config
    try:
        values = OmegaConf.to_container(config[SECTION], resolve=True)
    except Exception:  # a ${...} pointing nowhere: validate_config reports it, naming the key
        return config
    defaults = yaml_defaults(PPO_CONFIG_NAME)
    manager = values.get("reward_manager")
    mapped = mapped_keys(manager.get("source") if isinstance(manager, Mapping) else None)
    for key, value in set_keys(values, defaults[SECTION], mapped):
        target = mapped.get(key)
        if target is None:
            continue
        current = OmegaConf.select(config, target, default=_ABSENT, throw_on_resolution_failure=False)
        if isinstance(current, DictConfig):
            current = OmegaConf.to_container(current, resolve=True)
        if current == at(defaults, target):
            OmegaConf.update(config, target, value, merge=False, force_add=True)
    return config
