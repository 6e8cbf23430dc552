"""Name -> implementation registries behind the config keys that choose one by name
(``algorithm.adv_estimator``, ``actor_rollout_ref.actor.policy_loss.loss_mode``,
``reward_model.reward_manager``, ``actor_rollout_ref.rollout.name``)."""

from __future__ import annotations

import difflib
from typing import Any

__all__ = ["Registry", "as_name"]


def as_name(name: Any) -> str:
    """A registry name: a str, or an enum member whose ``.value`` is one."""
    value = getattr(name, "value", name)
    if not isinstance(value, str):
        raise TypeError(f"registry names are strings (or enums with a str .value), got {name!r}")
    return value


class Registry(dict):
    """A dict of name -> implementation, filled by the :meth:`register` decorator.

    ``kind`` says what is registered ("advantage estimator"), ``key`` the config key that picks it;
    both go into the error messages."""

    def __init__(self, kind: str, key: str | None = None):
        super().__init__()
        self.kind, self.key = kind, key

    def register(self, name: Any):
        """Decorator adding a function or class under ``name``; a second, different one is an error."""
        key = as_name(name)

        def decorator(obj):
            existing = dict.get(self, key)
            if existing is not None and existing is not obj:
                raise ValueError(f"{self.kind} {key!r} is already registered to "
                                 f"{existing.__module__}.{existing.__qualname__}; pick another name")
            self[key] = obj
            return obj

        return decorator

    def names(self) -> list[str]:
        return sorted(self)

    def lookup(self, name: Any):
        """The implementation under ``name``; a ValueError naming the registered ones otherwise."""
        key = as_name(name)
        if key in self:
            return self[key]
        guess = difflib.get_close_matches(key, self.names(), n=1, cutoff=0.6)
        hint = f" Did you mean {guess[0]!r}?" if guess else ""
        where = f" (set by {self.key})" if self.key else ""
        raise ValueError(f"unknown {self.kind} {key!r}; registered: {', '.join(self.names())}{where}.{hint}")
