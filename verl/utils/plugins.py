"""User classes declared in YAML files (tools, interactions): reading the list and importing each class,
with errors that name the file, the entry and the fix."""

from __future__ import annotations

import importlib
import os

__all__ = ["import_subclass", "yaml_entries"]


def yaml_entries(path: str, list_key: str, config_key: str, see: str) -> list[tuple[str, dict]]:
    """``(where, entry)`` for each item of the file's ``list_key:`` list (``where`` names file and index)."""
    from omegaconf import OmegaConf

    if not path or not os.path.isfile(path):
        raise FileNotFoundError(f"{config_key}={path!r}: no such file. Give a YAML file with a '{list_key}:' list "
                                f"(see {see})")
    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    entries = spec.get(list_key) if isinstance(spec, dict) else None
    if not entries:
        raise ValueError(f"{path}: no '{list_key}:' list; {config_key} must list at least one entry (see {see})")
    return [(f"{path}, {list_key}[{i}]", entry if isinstance(entry, dict) else {}) for i, entry in enumerate(entries)]


def import_subclass(class_name: str, base: type, where: str) -> type:
    """The class at dotted path ``class_name``, which must subclass ``base``."""
    module_name, _, attr = class_name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{where}: cannot import {class_name!r} ({err})") from err
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{where}: {class_name} is not a subclass of {base.__module__}.{base.__name__}")
    return cls
