"""The Python API: config objects -> the trainer config (`build_ppo_config`), and `PPOTrainer`.

Both give the same run as ``python -m verl.trainer.main_ppo`` with the equivalent command line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from verl.base_config import BaseConfig, at, flatten, plain_value
from verl.trainer.config import PPO_CONFIG_NAME, ConfigError
from verl.trainer.config.algorithm import PPOAlgorithmConfig
from verl.trainer.config.compose import closest_key, compose_ppo_config, dotted_keys
from verl.trainer.config.config import CustomRewardFunctionConfig, DataConfig, TrainerConfig
from verl.trainer.config.spec import SECTIONS, need_critic
from verl.workers.config import (
    ActorConfig, ActorRolloutRefConfig, CriticConfig, ModelConfig, RefConfig, RewardModelConfig, RolloutConfig
)

__all__ = ["PPOTrainer", "build_ppo_config"]

_ENGINE_KEY = "actor_rollout_ref.rollout.name"


class PPOTrainer:
    """A PPO/GRPO run described in Python; `fit()` trains it.

        trainer = PPOTrainer(
            actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(path="Qwen/Qwen2.5-0.5B-Instruct"),
                                                    actor=ActorConfig(ppo_micro_batch_size_per_gpu=4)),
            algorithm=PPOAlgorithmConfig(adv_estimator="grpo"),
            train_files="data/gsm8k/train.parquet",
            overrides=["trainer.n_gpus_per_node=1"],
        )
        trainer.fit()

    Give either a composed `config` (from `compose_ppo_config` or `build_ppo_config`) or the parts:
    the section objects (or dicts of their keys), `overrides` (Hydra ``key=value`` strings or a dict of
    dotted keys), and the shorthands ``actor_model_name`` (actor_rollout_ref.model.path),
    ``critic_model_name`` (critic.model.path), ``reward_model_name`` (reward_model.enable=true and
    reward_model.model.path), ``train_files``/``val_files`` (data.*) and ``adv_estimator``
    (algorithm.adv_estimator). Every key you leave out keeps its ppo_trainer.yaml default.

    When errors are reported:
    - at construction, problems with the description itself: an unknown key (with the closest valid
      one), a key given twice with different values, and a rollout engine this verl does not ship
      (e.g. ``vllm``; the message says to use ``hf``). Construction is cheap: it starts no Ray, loads no
      model or tokenizer, reads no data and needs no network, so a run can be described anywhere.
    - at `validate()` and at the start of `fit()`, everything else, all at once: missing data files or
      model paths, batch sizes that do not divide over the devices, values out of range, ...
    Ray needs no ``ray.init()`` from you: `fit()` starts it (trainer.backend=ray) or runs the workers
    in this process (trainer.backend=local).
    """

    def __init__(self, config: DictConfig | Mapping | None = None, *, data: DataConfig | Mapping | None = None,
                 actor_rollout_ref: ActorRolloutRefConfig | Mapping | None = None,
                 critic: CriticConfig | Mapping | None = None, reward_model: RewardModelConfig | Mapping | None = None,
                 custom_reward_function: CustomRewardFunctionConfig | Mapping | None = None,
                 algorithm: PPOAlgorithmConfig | Mapping | None = None, trainer: TrainerConfig | Mapping | None = None,
                 overrides: Sequence[str] | Mapping[str, Any] | None = None,
                 actor_model_name: str | os.PathLike | None = None, reward_model_name: str | os.PathLike | None = None,
                 critic_model_name: str | os.PathLike | None = None,
                 train_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                 val_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                 adv_estimator: str | None = None):
        sections = dict(data=data, actor_rollout_ref=actor_rollout_ref, critic=critic, reward_model=reward_model,
                        custom_reward_function=custom_reward_function, algorithm=algorithm, trainer=trainer)
        given = [("actor_model_name", actor_model_name, {"actor_rollout_ref.model.path": actor_model_name}),
                 ("critic_model_name", critic_model_name, {"critic.model.path": critic_model_name}),
                 ("reward_model_name", reward_model_name,
                  {"reward_model.enable": True, "reward_model.model.path": reward_model_name}),
                 ("train_files", train_files, {"data.train_files": train_files}),
                 ("val_files", val_files, {"data.val_files": val_files}),
                 ("adv_estimator", adv_estimator, {"algorithm.adv_estimator": adv_estimator})]
        shorthands = {f"{name}=": {k: plain_value(v) for k, v in items.items()}
                      for name, value, items in given if value is not None}
        if config is not None:
            others = [name for name, value in sections.items() if value is not None]
            others += [source.rstrip("=") for source in shorthands] + (["overrides"] if overrides else [])
            if others:
                raise TypeError(f"PPOTrainer takes either a composed config or its parts, not both (got config and "
                                f"{', '.join(others)}). Change the config first, e.g. OmegaConf.update(config, key, "
                                "value), or build it from parts with build_ppo_config")
            from verl.trainer.config.reward_section import map_reward_section

            # a config composed elsewhere: its reward.* keys reach the keys read here, as compose_config maps them
            self.config = map_reward_section(config if isinstance(config, DictConfig)
                                             else OmegaConf.create(dict(config)))
        else:
            sources = [*_section_sources(sections), *shorthands.items()]
            self.config = _build(sources, overrides)
        _check_rollout_engine(self.config)

    def validate(self, n_devices: int | None = None) -> list[str]:
        """Check the whole config; raise `ConfigError` listing every problem, else return the warnings.

        `n_devices`: the total number of devices (default trainer.n_gpus_per_node x trainer.nnodes).
        """
        from verl.trainer.config_validation import validate_config

        return validate_config(self.config, n_devices=n_devices)

    def fit(self) -> Any:
        """Validate (the config, then the files and machine it needs: :mod:`verl.trainer.preflight`), then
        train: ``verl.trainer.main_ppo.run_ppo(self.config)``; returns what it returns."""
        from verl.trainer.main_ppo import run_ppo
        from verl.trainer.preflight import preflight

        self.validate()
        preflight(self.config)
        return run_ppo(self.config)

    def __repr__(self) -> str:
        get = self._get
        estimator = get("algorithm.adv_estimator")
        uses_critic = need_critic(get("critic.enable"), estimator)
        parts = [f"model={get('actor_rollout_ref.model.path')!r}", f"algorithm={estimator!r}",
                 f"critic={get('critic.model.path') if uses_critic else None!r}",
                 f"reward_model={get('reward_model.model.path') if get('reward_model.enable') else None!r}",
                 f"rollout={get(_ENGINE_KEY)!r} (n={get('actor_rollout_ref.rollout.n')})",
                 f"devices={get('trainer.nnodes')}x{get('trainer.n_gpus_per_node')} {get('trainer.device')} "
                 f"({get('trainer.backend')})",
                 f"train_files={get('data.train_files')!r}"]
        return f"PPOTrainer({', '.join(parts)})"

    def _get(self, key: str) -> Any:
        try:
            value = OmegaConf.select(self.config, key)
        except OmegaConfBaseException:  # a ${...} that does not resolve: validate() reports it
            return "<unresolved>"
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _check_rollout_engine(config: DictConfig) -> None:
    """An engine this verl does not ship can never work: say so now, with the engine to use instead."""
    name = OmegaConf.select(config, _ENGINE_KEY, default=None)
    if name is None:
        return
    from verl.workers.rollout.registry import check_rollout_name

    try:
        check_rollout_name(name)
    except ValueError as e:
        raise ConfigError("Invalid configuration:", [f"{_ENGINE_KEY}: {e} (in Python: RolloutConfig(name=...) "
                                                     "inside ActorRolloutRefConfig)"]) from None


# ---- Objects -> the composed trainer config ----------------------------------------------------------------------

Source = tuple[str, Mapping[str, Any]]  # (where the values came from, for messages; {dotted key: value})


def build_ppo_config(
    *, data: DataConfig | Mapping | None = None, actor_rollout_ref: ActorRolloutRefConfig | Mapping | None = None,
    critic: CriticConfig | Mapping | None = None, reward_model: RewardModelConfig | Mapping | None = None,
    custom_reward_function: CustomRewardFunctionConfig | Mapping | None = None,
    algorithm: PPOAlgorithmConfig | Mapping | None = None, trainer: TrainerConfig | Mapping | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
) -> DictConfig:
    """The trainer config: ppo_trainer.yaml's defaults with the values the objects set.

    Each section takes its config object or a dict of its keys. `overrides` takes Hydra command-line
    overrides (``["trainer.nnodes=2", "+key=value"]``, exactly as after ``python -m verl.trainer.main_ppo``)
    or a dict ``{dotted key: value}``. A key set in two places with different values, and an unknown key
    (with the closest valid one), raise `ConfigError`. The result has the same form as
    `compose_ppo_config`'s: struct mode, ``${...}`` references kept (e.g. critic.model.path follows
    actor_rollout_ref.model.path unless set).
    """
    given = dict(data=data, actor_rollout_ref=actor_rollout_ref, critic=critic, reward_model=reward_model,
                 custom_reward_function=custom_reward_function, algorithm=algorithm, trainer=trainer)
    return _build(_section_sources(given), overrides)


# The ActorRolloutRefConfig field each actor_rollout_ref part goes in, for a hint.
_ARR_FIELD = {ActorConfig: "actor", RolloutConfig: "rollout", RefConfig: "ref", ModelConfig: "model"}


def _section_sources(sections: Mapping[str, Any]) -> list[Source]:
    """One source per top-level section given (None = not given)."""
    sources = []
    for name, value in sections.items():
        if value is None:
            continue
        cls = SECTIONS[name]
        if isinstance(value, cls):
            items = value.to_overrides(name)
        elif isinstance(value, Mapping) and not isinstance(value, BaseConfig):
            items = dict(flatten(name, value))
        else:
            hint = ""
            if name == "actor_rollout_ref" and isinstance(value, (ActorConfig, RolloutConfig, RefConfig, ModelConfig)):
                hint = f"; wrap it, e.g. ActorRolloutRefConfig({_ARR_FIELD[type(value)]}=...)"
            raise TypeError(f"{name}= expects a {cls.__name__} (or a dict of its keys), "
                            f"got {type(value).__name__}{hint}")
        sources.append((f"{name}=", items))
    return sources


def _build(sources: Sequence[Source], overrides: Sequence[str] | Mapping[str, Any] | None) -> DictConfig:
    """ppo_trainer.yaml + command-line `overrides` + the values of `sources`, every conflict and unknown
    key reported at once."""
    if isinstance(overrides, str):
        raise TypeError(f"overrides= takes a list of key=value strings or a dict, got the string {overrides!r}; "
                        f"write overrides=[{overrides!r}]")
    cli = [] if overrides is None or isinstance(overrides, Mapping) else list(overrides)
    sources = list(sources)
    if isinstance(overrides, Mapping) and overrides:
        sources.append(("overrides=", dict(flatten("", overrides))))

    config = compose_ppo_config(cli)
    values, problems = _merge(sources)
    problems += _cli_conflicts(cli, values, config)
    if problems:
        raise ConfigError("A configuration key is set twice with different values:", problems)
    unknown = _unknown_keys(values, config)
    if unknown:
        raise ConfigError(f"Unknown configuration key(s), not in {PPO_CONFIG_NAME}.yaml:", unknown)
    with open_dict(config):  # free-form groups (override_config, ...) take new keys; the rest were checked
        for key, (_, value) in values.items():
            OmegaConf.update(config, key, value, merge=True)
    return config


def _merge(sources: Sequence[Source]) -> tuple[dict[str, tuple[str, Any]], list[str]]:
    values: dict[str, tuple[str, Any]] = {}
    problems = []
    for source, items in sources:
        for key, value in items.items():
            if key in values and values[key][1] != value:
                first, first_value = values[key]
                problems.append(f"{key}: {first_value!r} from {first} but {value!r} from {source}. Set it in one place")
            else:
                values.setdefault(key, (source, value))
    return values, problems


_ABSENT = object()


def _cli_conflicts(cli: Sequence[str], values: Mapping[str, tuple[str, Any]], config: DictConfig) -> list[str]:
    """Keys the command-line overrides set that a config object sets to something else."""
    cli_keys = {arg.split("=", 1)[0].lstrip("+~") for arg in cli if "=" in arg and not arg.startswith("-")}
    problems = []
    for key, (source, value) in values.items():
        if any(key == c or key.startswith(f"{c}.") for c in cli_keys):
            current = OmegaConf.select(config, key, default=_ABSENT)
            if current != value:
                problems.append(f"{key}: {current!r} from the overrides= command line but {value!r} from {source}. "
                                "Set it in one place")
    return problems


def _unknown_keys(values: Mapping[str, tuple[str, Any]], config: DictConfig) -> list[str]:
    tree = OmegaConf.to_container(config)
    known = set(dotted_keys(tree))
    # Groups whose default is an empty dict are free-form (override_config, reward_kwargs, ...).
    free_form = {k for k in known if at(tree, k) == {}}
    problems = []
    for key, (source, _) in values.items():
        parts = key.split(".")
        if key in known or any(".".join(parts[:i]) in free_form for i in range(1, len(parts))):
            continue
        guess = closest_key(key, known)
        fix = f"did you mean {guess}?" if guess else "check the spelling against ppo_trainer.yaml"
        problems.append(f"{key}: unknown key (set by {source}); {fix}")
    return problems
