"""Simulated users for multi-turn rollouts (``actor_rollout_ref.rollout.multi_turn.interaction_config_path``)."""

from verl.interactions.base import BaseInteraction
from verl.interactions.utils.interaction_registry import initialize_interactions_from_config

__all__ = ["BaseInteraction", "initialize_interactions_from_config"]
