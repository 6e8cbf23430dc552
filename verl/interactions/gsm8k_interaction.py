"""A simulated user for GSM8K: it checks the model's last answer (``#### <number>``) against the row's
ground truth, ends the episode when it is right, and otherwise asks the model to try again."""

from __future__ import annotations

from verl.interactions.base import BaseInteraction
from verl.rewards.scorers import gsm8k

__all__ = ["Gsm8kInteraction"]

RETRY = "Your answer is not correct. Check your reasoning and try again; end with #### <number>."


class Gsm8kInteraction(BaseInteraction):
    """Needs ``ground_truth`` in the row's ``extra_info["interaction_kwargs"]``; config ``retry_message``."""

    async def start_interaction(self, instance_id: str | None = None, ground_truth=None, **kwargs) -> str:
        if ground_truth is None:
            raise ValueError("Gsm8kInteraction needs extra_info['interaction_kwargs']['ground_truth'] in every row")
        return await super().start_interaction(instance_id, ground_truth=str(ground_truth), **kwargs)

    async def generate_response(self, instance_id: str, messages: list[dict],
                                **kwargs) -> tuple[bool, str, float, dict]:
        answer = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        score = gsm8k.compute_score(answer, self._instances[instance_id]["ground_truth"], method="flexible")
        self._instances[instance_id]["score"] = score
        if score == 1.0:
            return True, "Your answer is correct.", score, {}
        return False, str(self.config.get("retry_message", RETRY)), score, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return float(self._instances.get(instance_id, {}).get("score", 0.0))
