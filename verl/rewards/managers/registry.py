"""Name -> reward manager class, so ``reward_model.reward_manager=<name>`` can pick one.

A user's manager joins with ``@register("<name>")`` in a module imported before the run looks the name up: the
file of ``custom_reward_function.path`` is imported first for that
(:func:`verl.rewards.loading.find_reward_manager_cls`), as in the original.
"""

from __future__ import annotations

from typing import Any

from verl.utils.registry import Registry

__all__ = ["REWARD_MANAGER_REGISTRY", "register", "get_reward_manager_cls", "registered_reward_managers"]


class _RewardManagerRegistry(Registry):
    """The original's error texts first, then where to look and how to fix."""

    def unknown_message(self, key: str) -> str:
        return (f"Unknown reward manager: {key}. Registered: {self.choices_hint(key)} A manager of your own is "
                f"registered with @register({key!r}) from verl.workers.reward_manager in a module imported before the "
                "run, e.g. the file of custom_reward_function.path")

    def duplicate_message(self, key: str, existing: Any, new: Any) -> str:
        return (f"Reward manager {key} has already been registered: {existing.__module__}.{existing.__qualname__} vs "
                f"{new.__module__}.{new.__qualname__}; register yours under another name")


REWARD_MANAGER_REGISTRY = _RewardManagerRegistry("reward manager", "reward_model.reward_manager")


def register(name: str):
    """Class decorator adding a reward manager under ``name``; the same name for a different class is a
    ValueError (registering the same class again is allowed, e.g. on a module reload)."""
    return REWARD_MANAGER_REGISTRY.register(name)


def registered_reward_managers() -> list[str]:
    return REWARD_MANAGER_REGISTRY.names()


def get_reward_manager_cls(name: str) -> type:
    """The class registered under ``name`` (case-sensitive); a ValueError listing the registered names otherwise."""
    return REWARD_MANAGER_REGISTRY.lookup(name)
