"""Simulated users for multi-turn rollouts (``actor_rollout_ref.rollout.multi_turn.interaction_config_path``)."""

from verl.interactions.base import BaseInteraction, load_interactions

__all__ = ["BaseInteraction", "load_interactions"]
