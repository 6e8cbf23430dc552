"""Typed config sections: frozen dataclasses whose defaults are read from the trainer's yaml.

Every section of ``ppo_trainer.yaml`` (``actor_rollout_ref.actor``, ``algorithm.kl_ctrl``, ...) has one class
here or in :mod:`verl.workers.config` / :mod:`verl.trainer.config`, named as the original verl names it
(``AlgoConfig``, ``FSDPActorConfig``, ...). The yaml is the only place a default is written: a field's
default is the yaml's value at the section's key, read when the class is defined. One class serves two uses:

- **a resolved spec** the workers, engines and algorithms read (``omega_conf_to_dataclass(cfg.actor_rollout_ref.actor,
  ActorConfig)``): every field typed, nothing changed after it is built (setting a field raises);
- **a description in Python** (``PPOTrainer(actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(path=...)))``):
  only the fields you pass become overrides of the yaml (`to_overrides`), so a key you leave out keeps the
  yaml's default, ``${...}`` references included. ``None`` for a group means "not given"; for a plain value it
  writes ``null``. A group also takes a dict of its keys; keys without a field go in ``extra`` (relative to
  the section, dotted or nested). A key set twice with different values is a `ConfigError`.

Like the original's ``BaseConfig``, a config is also a read-only mapping (``config["lr"]``, ``config.get("lr")``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import os
import typing
from collections.abc import Iterator, Mapping
from dataclasses import FrozenInstanceError, InitVar, dataclass, fields
from typing import Any, ClassVar

__all__ = ["BaseConfig", "ConfigError", "section", "yaml_defaults"]

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer", "config")


class ConfigError(ValueError):
    """A configuration that cannot run.

    The message is a header line followed by one ``- <dotted.key>: <what is wrong>. <how to fix>`` line
    per problem; `problems` holds those lines without the leading ``- ``.
    """

    def __init__(self, header: str, problems):
        self.problems = list(problems)
        super().__init__("\n".join([header, *(f"- {p}" for p in self.problems)]))


@functools.cache
def _yaml(config_name: str):
    from omegaconf import OmegaConf

    return OmegaConf.load(os.path.join(CONFIG_DIR, f"{config_name}.yaml"))


@functools.cache
def _resolved_yaml(config_name: str) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(_yaml(config_name), resolve=True)


def yaml_defaults(config_name: str = "ppo_trainer") -> dict:
    """The resolved values of ``verl/trainer/config/<config_name>.yaml`` (plain containers; do not modify)."""
    return _resolved_yaml(config_name)


@functools.cache
def _unresolved_yaml(config_name: str) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(_yaml(config_name), resolve=False)


_PLAIN = (str, int, float, bool, type(None))


def _covers(values: Any, section: Any, resolved: Any) -> bool:
    """Whether setting ``values`` over the yaml's ``section`` leaves nothing of the yaml and nothing for OmegaConf
    to check or convert: every key of the section is given (a group's keys too, recursively); where the yaml
    holds a dict or a list, the value given is one too; where it holds a ``${...}`` reference, a dict given holds
    every key of what the reference resolves to (``resolved``: the section with the yaml's defaults resolved),
    as a merge would fill the others in; and every given value is plain data (str/int/float/bool/None, lists,
    dicts with str keys), with no ``${...}`` and no ``???`` (which a merge treats as "not given")."""
    if type(values) is not dict or not all(isinstance(k, str) for k in values):
        return False
    for key, default in section.items():
        if key not in values:
            return False
        given = values[key]
        target = resolved.get(key) if isinstance(resolved, dict) else None
        if isinstance(default, dict) and (type(given) is not dict or (default and not _covers(given, default, target))):
            return False
        if isinstance(default, list) and type(given) is not list:
            return False
        if isinstance(default, str) and "${" in default and type(given) in (dict, list):
            if type(given) is not type(target) or (type(given) is dict and not _covers(given, target, target)):
                return False
    return all(_is_plain(v) for v in values.values())


def _is_plain(value: Any) -> bool:
    if type(value) is dict:
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if type(value) is list:
        return all(_is_plain(v) for v in value)
    return type(value) in _PLAIN and not (isinstance(value, str) and ("${" in value or value == "???"))


def over_yaml(values: Mapping, key: str, config_name: str = "ppo_trainer") -> dict:
    """The yaml's section ``key`` with ``values`` (some of its keys) set, resolved as a whole config would be: a
    key that follows another through ``${...}`` follows the value given for it.

    A section given whole, as plain data (a section of an already resolved config: every caller of
    ``from_config`` in a run), is that data: merging it over the yaml and resolving would change nothing, and
    would cost a copy of the whole yaml tree per call."""
    if _covers(values, at(_unresolved_yaml(config_name), key), at(_resolved_yaml(config_name), key)):
        return copy.deepcopy(values)
    return _merged_over_yaml(values, key, config_name)


def _merged_over_yaml(values: Mapping, key: str, config_name: str) -> dict:
    from omegaconf import OmegaConf

    tree = copy.deepcopy(_yaml(config_name))
    OmegaConf.set_struct(tree, False)
    OmegaConf.update(tree, key, values, merge=True)
    return OmegaConf.to_container(OmegaConf.select(tree, key), resolve=True)


def at(tree: Mapping, key: str) -> Any:
    """The value at dotted ``key`` in nested mappings (KeyError when a part is missing)."""
    for part in key.split("."):
        tree = tree[part]
    return tree


def plain_value(value: Any) -> Any:
    """A value OmegaConf stores as the user meant it: paths as strings, tuples as lists."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, Mapping) and not isinstance(value, BaseConfig):
        return {k: plain_value(v) for k, v in value.items()}
    return value


def flatten(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """Leaf ``(dotted key, value)`` pairs: a config or a non-empty dict sets only the keys it names."""
    if isinstance(value, BaseConfig):
        yield from value.to_overrides(key).items()
    elif isinstance(value, Mapping) and value:
        for sub, v in value.items():
            yield from flatten(f"{key}.{sub}" if key else str(sub), v)
    else:
        yield key, plain_value(value)


@dataclass(repr=False, eq=False)
class BaseConfig(Mapping):
    """Base of every config section; see the module docstring."""

    # Where the section lives in the yaml; None for classes used in several places (give to_overrides a prefix).
    PREFIX: ClassVar[str | None] = None
    # Init arguments that are another name for a deeper key (``kl_coef`` -> ``kl_ctrl.kl_coef``).
    ALIASES: ClassVar[dict[str, str]] = {}
    # (key, yaml name) the class's defaults come from (set by @section).
    _YAML: ClassVar[tuple[str, str]]

    extra: InitVar[dict | None] = None

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        given = {**dict(zip(_init_names(cls), args)), **kwargs}
        given.pop("extra", None)
        object.__setattr__(self, "_given", given)
        return self

    def __post_init__(self, extra: dict | None = None) -> None:
        if extra is not None and not isinstance(extra, Mapping):
            raise TypeError(f"{type(self).__name__}.extra must be a dict of keys relative to the section, "
                            f"got {type(extra).__name__}")
        object.__setattr__(self, "_extra", dict(extra or {}))
        groups = _group_types(type(self))
        for f in fields(self):
            if f.name not in self._given:
                continue
            value, accepts = self._given[f.name], groups.get(f.name)
            if accepts and value is None:  # a group cannot be null: None means "not given" here
                del self._given[f.name]
                object.__setattr__(self, f.name, f.default_factory())
            elif accepts and isinstance(value, Mapping) and not isinstance(value, BaseConfig):
                object.__setattr__(self, f.name, accepts[0].from_dict(value))
            elif accepts and not isinstance(value, accepts):
                names = " or ".join(c.__name__ for c in accepts)
                raise TypeError(f"{type(self).__name__}.{f.name} must be a {names} (or a dict of its keys), "
                                f"got {type(value).__name__}")
            elif not accepts and isinstance(value, BaseConfig):
                raise TypeError(f"{type(self).__name__}.{f.name} is a plain value, got a {type(value).__name__}")
        if self.PREFIX:  # report a key set twice with different values as soon as the object is built
            self.to_overrides()

    # ----------------------------------------------------------------------------------------- construction
    @classmethod
    def from_dict(cls, values: Mapping, *, defaults: bool = False):
        """The config holding ``values`` (the section's keys, nested groups as dicts); keys without a field go
        to ``extra``. ``defaults=True`` builds the class's default value of a nested group: nothing counts as
        given."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in values.items() if k in names}
        config = cls(**known, extra={k: v for k, v in values.items() if k not in names} or None)
        if defaults:
            _forget_given(config)
        return config

    @classmethod
    def from_config(cls, config):
        """``config`` as this class: itself when it already is one, else built from a dict, an OmegaConf node
        (resolved) or an object with the keys as attributes, set over the yaml's section (:func:`over_yaml`): the
        keys it lacks keep the yaml's defaults, or follow a key it gives as they do there (all defaults for None)."""
        if isinstance(config, cls):
            return config
        if config is None:
            return cls()
        if not isinstance(config, Mapping) and hasattr(config, "__dict__") and not isinstance(config, BaseConfig):
            config = vars(config)  # an object holding the section's keys as attributes
        if not isinstance(config, Mapping) or isinstance(config, BaseConfig):
            raise TypeError(f"expected a {cls.__name__} or a dict of its keys, got {type(config).__name__}")
        if type(config).__module__.startswith("omegaconf"):
            from omegaconf import OmegaConf

            config = OmegaConf.to_container(config, resolve=True)
        return cls.from_dict(over_yaml(config, *cls._YAML))

    # ----------------------------------------------------------------------------------------- mapping, frozen
    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__:
            raise FrozenInstanceError(f"{type(self).__name__}.{name} cannot be changed: a config is resolved once. "
                                      f"Build a new one, e.g. dataclasses.replace(config, {name}=...)")
        object.__setattr__(self, name, value)

    def __getitem__(self, key: str) -> Any:
        if key not in {f.name for f in fields(self)}:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return (f.name for f in fields(self))

    def __len__(self) -> int:
        return len(fields(self))

    def __eq__(self, other: Any) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self))

    __hash__ = None

    # ----------------------------------------------------------------------------------------- overrides
    def to_overrides(self, prefix: str | None = None) -> dict[str, Any]:
        """``{dotted key: value}`` for every argument that was given (nested configs and dicts flattened)."""
        prefix = prefix or self.PREFIX
        if not prefix:
            raise TypeError(f"{type(self).__name__} is used in several places of the config; pass the prefix, "
                            f"e.g. to_overrides('actor_rollout_ref.model')")
        out: dict[str, Any] = {}
        origin: dict[str, str] = {}
        items = [(name, kv) for name, value in self._given.items()
                 for kv in flatten(f"{prefix}.{self._place(name, value)}", value)]
        items += [("extra", kv) for key, value in self._extra.items() for kv in flatten(f"{prefix}.{key}", value)]
        for name, (key, value) in items:
            if key in out and out[key] != value:
                raise ConfigError(f"Invalid {type(self).__name__}:",
                                  [self._conflict(key, origin[key], out[key], name, value)])
            out[key] = value
            origin.setdefault(key, name)
        return out

    def _place(self, name: str, value: Any) -> str:
        """The key, relative to the section, that argument `name` holding `value` writes to."""
        return self.ALIASES.get(name, name)

    def _conflict(self, key: str, first: str, first_value: Any, second: str, second_value: Any) -> str:
        return (f"{key}: set twice with different values, by {first}= ({first_value!r}) and by {second}= "
                f"({second_value!r}). Set it once")

    def __repr__(self) -> str:
        shown = [(name, self._given[name]) for name in _init_names(type(self)) if name in self._given]
        shown += [("extra", self._extra)] if self._extra else []
        return f"{type(self).__name__}({', '.join(f'{name}={value!r}' for name, value in shown)})"


def _forget_given(config: BaseConfig) -> None:
    """Nothing in ``config`` (nested groups included) counts as given: it is a default value."""
    object.__setattr__(config, "_given", {})
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, BaseConfig):
            _forget_given(value)


@functools.cache
def _init_names(cls: type) -> list[str]:
    return list(inspect.signature(cls.__init__).parameters)[1:]


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, evaluated once per class (the annotations are strings: evaluating them
    costs about a millisecond a class, and the config checks ask for each key's)."""
    return typing.get_type_hints(cls)


@functools.cache
def _group_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Field name -> the config classes it accepts, for the fields holding a nested group."""
    hints = type_hints(cls)
    groups = {}
    for f in fields(cls):
        options = typing.get_args(hints[f.name]) or (hints[f.name],)
        accepted = tuple(t for t in options if isinstance(t, type) and issubclass(t, BaseConfig))
        if accepted:
            groups[f.name] = accepted
    return groups


def section(key: str, *fallbacks: str, config_name: str = "ppo_trainer", shared: bool = False):
    """Class decorator: a `BaseConfig` dataclass whose fields take their defaults from the yaml at ``key``
    (a field missing there: from the first of ``fallbacks`` that has it). ``shared``: the class is used in
    several places, so it has no PREFIX of its own. Every field must have a yaml value."""

    def wrap(cls):
        tree = yaml_defaults(config_name)
        sources = [at(tree, k) for k in (key, *fallbacks)]
        cls._YAML = (key, config_name)
        if not shared:
            cls.PREFIX = key
        hints = typing.get_type_hints(cls, localns={cls.__name__: cls})
        for name in cls.__dict__.get("__annotations__", {}):
            if typing.get_origin(hints[name]) is ClassVar or isinstance(hints[name], InitVar):
                continue
            source = next((s for s in sources if name in s), None)
            if source is None:
                raise TypeError(f"{cls.__name__}.{name} has no default: add {key}.{name} to {config_name}.yaml")
            setattr(cls, name, _default(hints[name], source[name]))
        return dataclass(repr=False, eq=False)(cls)

    return wrap


def _default(hint: Any, value: Any) -> Any:
    options = typing.get_args(hint) or (hint,)
    group = next((t for t in options if isinstance(t, type) and issubclass(t, BaseConfig)), None)
    if group is not None:  # a fresh copy each time: no default shares a list or dict with another, or the cache
        return dataclasses.field(default_factory=lambda: group.from_dict(copy.deepcopy(value), defaults=True))
    if isinstance(value, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, value))
    return value
