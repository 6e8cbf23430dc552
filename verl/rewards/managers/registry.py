"""Name -> reward manager class, so ``reward_model.reward_manager=<name>`` can pick one."""

from __future__ import annotations

from verl.utils.registry import Registry

__all__ = ["register", "get_reward_manager_cls", "registered_reward_managers"]

_REGISTRY = Registry("reward manager", "reward_model.reward_manager")


def register(name: str):
    """Class decorator adding a reward manager under ``name``."""
    return _REGISTRY.register(name)


def registered_reward_managers() -> list[str]:
    return _REGISTRY.names()


def get_reward_manager_cls(name: str) -> type:
    return _REGISTRY.lookup(name)
