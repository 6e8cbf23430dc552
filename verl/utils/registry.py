"""Name -> implementation registries behind the config keys that choose one by name
(``algorithm.adv_estimator``, ``actor_rollout_ref.actor.policy_loss.loss_mode``,
``reward_model.reward_manager``, ``actor_rollout_ref.rollout.name``)."""

from __future__ import annotations

import difflib
import logging
from typing import Any

__all__ = ["Registry", "as_name"]

logger = logging.getLogger(__name__)


def as_name(name: Any) -> str:
    """A registry name: a str, or an enum member whose ``.value`` is one."""
    value = getattr(name, "value", name)
    if not isinstance(value, str):
        raise TypeError(f"registry names are strings (or enums with a str .value), got {name!r}")
    return value


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _same_definition(existing: Any, new: Any) -> bool:
    """Whether ``new`` is the same definition as ``existing`` run again: one qualified name in one source file
    (``inspect.getsourcefile``; False when unknown), as after a module reload or a re-import of an edited file."""
    import inspect

    if getattr(existing, "__qualname__", None) != getattr(new, "__qualname__", None):
        return False
    try:
        first, second = inspect.getsourcefile(existing), inspect.getsourcefile(new)
    except TypeError:  # builtins
        return False
    return first is not None and first == second


class Registry(dict):
    """A dict of name -> implementation, filled by the :meth:`register` decorator.

    ``kind`` says what is registered ("advantage estimator"), ``key`` the config key that picks it;
    both go into the error messages. A subclass may reword the two errors (:meth:`unknown_message`,
    :meth:`duplicate_message`) or, with ``replaces = True``, let a second registration of a name
    replace the first (with a warning) instead of raising."""

    replaces = False

    def __init__(self, kind: str, key: str | None = None):
        super().__init__()
        self.kind, self.key = kind, key

    def register(self, name: Any):
        """Decorator adding a function or class under ``name``. Registering the same object again is
        fine; so is a new version of the same definition (same qualified name and source file: a module
        reloaded, or a custom reward file edited and imported again), which replaces the old one with a warning. A different one raises
        ValueError, or replaces it when ``replaces``."""
        key = as_name(name)

        def decorator(obj):
            existing = dict.get(self, key)
            if existing is not None and existing is not obj:
                if not (self.replaces or _same_definition(existing, obj)):
                    raise ValueError(self.duplicate_message(key, existing, obj))
                logger.warning("%s %r: %s replaces %s", self.kind, key, _describe(obj), _describe(existing))
            self[key] = obj
            return obj

        return decorator

    def names(self) -> list[str]:
        return sorted(self)

    def lookup(self, name: Any):
        """The implementation under ``name``; a ValueError (:meth:`unknown_message`) otherwise."""
        key = as_name(name)
        if key in self:
            return self[key]
        raise ValueError(self.unknown_message(key))

    def choices_hint(self, key: str) -> str:
        """``a, b (set by <config key>). Did you mean 'a'?``: the registered names, for an unknown ``key``."""
        return f"{', '.join(self.names())}{self.where()}.{self.did_you_mean(key)}"

    def where(self) -> str:
        return f" (set by {self.key})" if self.key else ""

    def did_you_mean(self, key: str) -> str:
        guess = difflib.get_close_matches(key, self.names(), n=1, cutoff=0.6)
        return f" Did you mean {guess[0]!r}?" if guess else ""

    def unknown_message(self, key: str) -> str:
        return f"unknown {self.kind} {key!r}; registered: {self.choices_hint(key)}"

    def duplicate_message(self, key: str, existing: Any, new: Any) -> str:
        return f"{self.kind} {key!r} is already registered to {_describe(existing)}; pick another name"
