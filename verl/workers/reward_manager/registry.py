"""Name -> reward manager class, so ``reward_model.reward_manager=<name>`` can pick one."""

from __future__ import annotations

__all__ = ["register", "get_reward_manager_cls", "registered_reward_managers"]

_REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator adding a reward manager under ``name``."""

    def decorator(cls: type) -> type:
        current = _REGISTRY.get(name)
        if current is not None and current is not cls:
            raise ValueError(f"reward manager {name!r} is already registered as {current.__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return decorator


def registered_reward_managers() -> list[str]:
    return sorted(_REGISTRY)


def get_reward_manager_cls(name: str) -> type:
    if name not in _REGISTRY:
        raise ValueError(f"Unknown reward manager {name!r} (reward_model.reward_manager). "
                         f"Registered: {registered_reward_managers()}")
    return _REGISTRY[name]
