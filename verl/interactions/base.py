"""Simulated users ("interactions") for multi-turn rollouts, declared as the original verl declares them.

When the model ends an assistant turn without calling a tool, the episode's interaction answers as the
user: its reply goes back into the conversation as a ``user`` message and the model takes another
turn, until the interaction ends the episode, ``max_user_turns`` / ``max_assistant_turns`` are reached,
or the response budget is used up. An interaction is a class with four coroutines, one *instance* per
episode:

- ``start_interaction(instance_id, **interaction_kwargs)``: set up the episode (the row's
  ``extra_info["interaction_kwargs"]``, e.g. the question and its ground truth);
- ``generate_response(instance_id, messages, **interaction_kwargs)``: read the conversation so far and
  return ``(should_terminate_sequence, reply text, turn score, extra dict)``;
- ``calculate_score(instance_id)``: a score for the episode (optional);
- ``finalize_interaction(instance_id)``: free the state.

The turn scores of an episode reach the reward function as ``extra_info["turn_scores"]``. Interactions
are listed in the YAML file ``multi_turn.interaction_config_path``; a row picks one by
``extra_info["interaction_kwargs"]["name"]`` (the only one when there is one)::

    interaction:
      - name: gsm8k
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any

from verl.utils.plugins import import_subclass, yaml_entries

__all__ = ["BaseInteraction", "load_interactions"]


class BaseInteraction(ABC):
    """The interaction interface (see the module docstring); subclass it and implement ``generate_response``."""

    def __init__(self, config: dict):
        self.config = dict(config or {})
        self.name = self.config.get("name", type(self).__name__)
        self._instances: dict[str, dict] = {}

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = dict(kwargs)
        return instance_id

    @abstractmethod
    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict]:
        """Return ``(should_terminate_sequence, reply, turn score, extra)`` for the conversation so far."""

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)


def load_interactions(path: str,
                      config_key: str = "actor_rollout_ref.rollout.multi_turn.interaction_config_path") -> dict:
    """``{name: interaction}`` from an interaction config YAML; errors name the file, the entry and the fix."""
    interactions = {}
    for where, entry in yaml_entries(path, "interaction", config_key, "verl/interactions/base.py"):
        class_name = entry.get("class_name")
        if not class_name:
            raise ValueError(f"{where}: needs class_name (e.g. verl.interactions.gsm8k_interaction.Gsm8kInteraction)")
        cls = import_subclass(class_name, BaseInteraction, where)
        name = str(entry.get("name") or class_name.rpartition(".")[2].removesuffix("Interaction").lower())
        if name in interactions:
            raise ValueError(f"{where}: a second interaction named {name!r}")
        interactions[name] = cls({**(entry.get("config") or {}), "name": name})
    return interactions
