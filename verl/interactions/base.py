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
are listed in the YAML file ``multi_turn.interaction_config_path`` and loaded by
:func:`verl.interactions.utils.interaction_registry.initialize_interactions_from_config`; a row picks one
by ``extra_info["interaction_kwargs"]["name"]`` (the only one when there is one).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any

__all__ = ["BaseInteraction"]


class BaseInteraction(ABC):
    """The interaction interface (see the module docstring); subclass it and implement ``generate_response``."""

    def __init__(self, config: dict):
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")  # the registry sets it from the file
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

