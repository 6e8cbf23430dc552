"""Command-line overrides -> the composed trainer config, through Hydra's compose API.

Replaces ``@hydra.main``: the entry points call `compose_ppo_config(sys.argv[1:])` (PPO) or
`compose_config(sys.argv[1:], "sft_trainer")` (any other config of this folder). Before composing,
every override is parsed and every key it changes is looked up in the default config, so that all
typos are reported together, each with the closest valid key. After composing, the original's newer ``reward.*``
keys are mapped onto the ``reward_model.*``/``custom_reward_function.*`` keys the code reads
(:mod:`verl.trainer.config.reward_section`).
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.base_config import yaml_defaults
from verl.trainer.config import CONFIG_DIR, PPO_CONFIG_NAME, ConfigError
from verl.trainer.config.reward_section import map_reward_section

_CONFIG_FLAGS = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name"}


def compose_ppo_config(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose the trainer config from command-line arguments, as ``python -m verl.trainer.main_ppo`` gets them.

    Accepts Hydra override syntax (``key=value``, ``+key=value``, ``++key=value``, ``~key``, lists as
    ``key=[a,b]``) plus ``--config-path DIR``/``--config-name NAME`` to start from your own config file
    (which can list ``ppo_trainer`` in its defaults). Raises `ConfigError` naming every unknown key, with
    the closest valid one, or every malformed override, at once. The original's ``reward.*`` keys set away from
    their defaults set the keys read here (`map_reward_section`).
    """
    return compose_config(overrides, PPO_CONFIG_NAME)


def compose_config(overrides: Sequence[str] = (), default_config_name: str = PPO_CONFIG_NAME) -> DictConfig:
    """`compose_ppo_config` for the trainer whose config is ``<default_config_name>.yaml`` in this folder."""
    config_dir, config_name, args = _split_config_flags(list(overrides), default_config_name)
    searchpath = _searchpath_overrides(config_dir, config_name, args)
    parsed = _parse_overrides(args)
    known = _known_keys(config_dir, config_name, tuple(searchpath))
    unknown = [_unknown_key_message(key, known) for key in _changed_keys(parsed) if key not in known]
    if unknown:
        raise ConfigError(f"Unknown configuration key(s), not in {config_name}.yaml:", unknown)
    return map_reward_section(_compose(config_dir, config_name, [*searchpath, *args]))


def closest_key(key: str, known: Iterable[str]) -> str | None:
    """The valid dotted key most likely meant by `key`, or None.

    Candidates are keys whose last component is close to `key`'s, so that the right name under the
    wrong group is found too; among them the one closest over the whole path wins. Otherwise, the
    closest full path if any is close enough.
    """
    known = list(known)
    last = key.rsplit(".", 1)[-1]

    def similarity(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a, b).ratio()

    candidates = [k for k in known if similarity(last, k.rsplit(".", 1)[-1]) >= 0.8]
    if candidates:
        return max(candidates, key=lambda k: (similarity(last, k.rsplit(".", 1)[-1]), similarity(key, k)))
    matches = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return matches[0] if matches else None


def dotted_keys(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted path through nested mappings, inner nodes included (a whole group can be set)."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            path = f"{prefix}{key}"
            yield path
            yield from dotted_keys(value, f"{path}.")


def default_config_values(config_name: str) -> dict:
    """The resolved defaults of ``<config_name>.yaml`` in this folder (a fresh copy on each call)."""
    return copy.deepcopy(yaml_defaults(config_name))


def _split_config_flags(args: list[str], default_name: str) -> tuple[str, str, list[str]]:
    """Take ``--config-path``/``--config-name`` (``=value`` or a separate value) out of the arguments."""
    found: dict[str, str] = {}
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        flag, eq, value = arg.partition("=")
        if flag in _CONFIG_FLAGS:
            found[_CONFIG_FLAGS[flag]] = value if eq else next(it, "")
        elif arg.startswith("-"):
            raise ConfigError("Unsupported command-line flag:", [
                f"{arg}: not a flag this command accepts. Pass settings as key=value "
                "(and optionally --config-path DIR --config-name NAME)"
            ])
        else:
            rest.append(arg)
    name = found.get("name", default_name).removesuffix(".yaml")
    if "megatron" in name:
        raise ConfigError("Unsupported config:", [
            f"--config-name={name}: the Megatron backend is not shipped; this verl trains with FSDP2 only. "
            f"Drop --config-name (the default is {default_name}) and use actor strategy fsdp or fsdp2"
        ])
    config_dir = _find_config_dir(found["path"]) if "path" in found else CONFIG_DIR
    if not os.path.isfile(os.path.join(config_dir, f"{name}.yaml")):
        raise ConfigError("Config file not found:", [f"--config-name={name}: there is no {name}.yaml in "
                                                     f"{config_dir}. Check --config-path and --config-name"])
    return config_dir, name, rest


def _find_config_dir(path: str) -> str:
    # Hydra reads a relative --config-path next to the entry point (verl/trainer); users may mean the cwd.
    candidates = [path] if os.path.isabs(path) else [os.path.join(os.path.dirname(CONFIG_DIR), path), path]
    for candidate in candidates:
        if os.path.isdir(candidate):
            return os.path.abspath(candidate)
    raise ConfigError("Config directory not found:", [f"--config-path={path}: no such directory"])


def _searchpath_overrides(config_dir: str, config_name: str, args: list[str]) -> list[str]:
    """Let a user's config list ``ppo_trainer`` in its defaults wherever verl is installed."""
    if config_dir == CONFIG_DIR or any(a.lstrip("+").startswith("hydra.searchpath") for a in args):
        return []
    primary = OmegaConf.load(os.path.join(config_dir, f"{config_name}.yaml"))
    paths = [str(p) for p in OmegaConf.select(primary, "hydra.searchpath", default=None) or []]
    # A relative file:// entry (verl's examples use file://verl/trainer/config) only works from the
    # root of a verl checkout; our own config dir stands in for it.
    paths = [p for p in paths if not p.startswith("file://") or os.path.isdir(p[len("file://"):])]
    paths.append(f"file://{CONFIG_DIR}")
    return ["hydra.searchpath=[" + ",".join(f"'{p}'" for p in paths) + "]"]


def _parse_overrides(args: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed, problems = [], []
    for arg in args:
        try:
            parsed.append(parser.parse_override(arg))
        except HydraException as e:
            problems.append(f"{arg!r}: cannot parse this override ({str(e).splitlines()[0]}). Write key=value, "
                            "+key=value or ~key; quote values holding spaces or special characters, e.g. key='a b'")
    if problems:
        raise ConfigError("Malformed command-line override(s):", problems)
    return parsed


def _changed_keys(parsed: Iterable[Any]) -> Iterator[str]:
    """Keys the overrides expect to exist (``key=v`` and ``~key``; ``+key=v`` adds a new one)."""
    for override in parsed:
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if not (override.is_add() or override.is_force_add()):
            yield key


@functools.lru_cache(maxsize=8)
def _known_keys(config_dir: str, config_name: str, searchpath: tuple[str, ...]) -> frozenset[str]:
    config = _compose(config_dir, config_name, list(searchpath))
    return frozenset(dotted_keys(OmegaConf.to_container(config)))


def _compose(config_dir: str, config_name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        raise ConfigError("Could not apply the command-line overrides:", [message]) from e


def _unknown_key_message(key: str, known: Iterable[str]) -> str:
    if "megatron" in key.split("."):
        return (f"{key}: a Megatron-backend setting; this verl trains with FSDP2 only. Remove it "
                "(sharding options live under actor_rollout_ref.actor.fsdp_config)")
    guess = closest_key(key, known)
    if guess:
        return f"{key}: unknown key; did you mean {guess}?"
    return f"{key}: unknown key. Check the spelling, or write +{key}=... to add a new key"
