"""Config helpers the original verl exposes here."""

from __future__ import annotations

from dataclasses import is_dataclass
from typing import Any

__all__ = ["omega_conf_to_dataclass"]


def omega_conf_to_dataclass(config: Any, dataclass_type: type | None = None) -> Any:
    """``config`` (an OmegaConf node or a dict) as a ``dataclass_type`` instance, as the original's function of
    this name: keys it lacks keep the class's defaults (for this project's config classes, the yaml's). Without
    a ``dataclass_type`` the node must name its class in ``_target_`` (Hydra instantiates it). A config that
    is already an object is returned as it is."""
    from omegaconf import DictConfig, OmegaConf

    from verl.base_config import BaseConfig

    if dataclass_type is None:
        if not isinstance(config, (DictConfig, dict)) or "_target_" not in config:
            raise ValueError("omega_conf_to_dataclass without a dataclass_type needs a config naming its class in "
                             f"_target_; got {type(config).__name__}. Pass the class, e.g. "
                             "omega_conf_to_dataclass(config.algorithm, AlgoConfig)")
        from hydra.utils import instantiate

        return instantiate(config, _convert_="partial")
    if not is_dataclass(dataclass_type):
        raise ValueError(f"{dataclass_type} is not a dataclass")
    if isinstance(config, dataclass_type):
        return config
    if issubclass(dataclass_type, BaseConfig):
        return dataclass_type.from_config(config)
    merged = OmegaConf.merge(OmegaConf.structured(dataclass_type), OmegaConf.create(config))
    return OmegaConf.to_object(merged)
