"""Reading config values the same way everywhere.

Config sections reach the code as OmegaConf nodes (from the yaml), dataclasses (the Python API),
plain dicts or SimpleNamespaces (tests); ``config_get`` reads all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def config_get(config: Any, key: str, default: Any = None) -> Any:
    """``config.<key>`` where ``key`` may be dotted (``"kl_ctrl.kl_coef"``).

    Returns ``default`` when any part of the path is missing or None, so a ``null`` in the yaml
    means "use the default".
    """
    node = config
    for part in key.split("."):
        if node is None:
            return default
        if isinstance(node, Mapping):
            node = node.get(part) if part in node else None
        else:
            node = getattr(node, part, None)
    return default if node is None else node


def uses_token_budget(use_dynamic_bsz: bool | None, remove_padding: bool) -> bool:
    """Whether a role sizes its micro-batches by a token budget: ``use_dynamic_bsz`` when set, else
    (null, the default) whenever its forwards are packed (``use_remove_padding``), since packed
    memory grows with tokens, not rows."""
    return bool(remove_padding) if use_dynamic_bsz is None else bool(use_dynamic_bsz)
