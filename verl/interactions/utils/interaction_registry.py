"""The interaction registry: the classes an interaction config file names, one instance each.

The file (``actor_rollout_ref.rollout.multi_turn.interaction_config_path``) lists the interactions::

    interaction:
      - name: gsm8k                      # optional: the class name without "Interaction", lower-cased
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}                       # passed to the class, with "name" added

A row picks one by ``extra_info["interaction_kwargs"]["name"]``.
"""

from __future__ import annotations

import logging

from verl.interactions.base import BaseInteraction
from verl.utils.plugins import import_subclass, yaml_entries

__all__ = ["get_interaction_class", "initialize_interactions_from_config"]

logger = logging.getLogger(__name__)

CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
_EXAMPLE_CLASS = "verl.interactions.gsm8k_interaction.Gsm8kInteraction"


def get_interaction_class(cls_name: str, where: str = "interaction class_name") -> type[BaseInteraction]:
    """The `BaseInteraction` subclass at dotted path ``cls_name`` (``package.module.ClassName``)."""
    return import_subclass(cls_name, BaseInteraction, where)


def default_interaction_name(cls_name: str) -> str:
    """The name of an entry without one: ``pkg.Gsm8kInteraction`` -> ``gsm8k``, ``pkg.Tutor`` -> ``tutor``."""
    return cls_name.rpartition(".")[2].removesuffix("Interaction").lower()


def initialize_interactions_from_config(interaction_config_file: str,
                                        config_key: str = CONFIG_KEY) -> dict[str, BaseInteraction]:
    """``{name: interaction}`` for every entry of the file; errors name the file, the entry and the fix.

    ``config_key`` is the setting that named the file, for the messages."""
    interactions: dict[str, BaseInteraction] = {}
    for where, entry in yaml_entries(interaction_config_file, "interaction", config_key,
                                     "verl/interactions/utils/interaction_registry.py"):
        class_name = entry.get("class_name")
        if not class_name:
            raise ValueError(f"{where}: needs class_name (e.g. {_EXAMPLE_CLASS})")
        cls = get_interaction_class(class_name, where)
        name = str(entry.get("name") or default_interaction_name(class_name))
        if name in interactions:
            raise ValueError(f"{where}: a second interaction named {name!r}; each entry needs its own name")
        interactions[name] = cls({**(entry.get("config") or {}), "name": name})
        logger.info("interaction %r: %s", name, class_name)
    return interactions
