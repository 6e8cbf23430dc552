"""A simulated user for GSM8K: it grades the model's last answer as the GSM8K reward does by default
(``strict``: only a final ``#### <number>`` counts), ends the episode when it is right, and otherwise asks
the model to reflect and try again. Its turn score is 1.0 for a right answer and 0.0 otherwise."""

from __future__ import annotations

from verl.interactions.base import BaseInteraction
from verl.rewards.scorers import gsm8k

__all__ = ["Gsm8kInteraction"]

CORRECT = "Your response is correct!"
RETRY = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    """Needs ``ground_truth`` in the row's ``extra_info["interaction_kwargs"]``; config ``retry_message``
    replaces the reply to a wrong answer."""

    async def start_interaction(self, instance_id: str | None = None, ground_truth=None, **kwargs) -> str:
        if ground_truth is None:
            raise ValueError("Gsm8kInteraction needs extra_info['interaction_kwargs']['ground_truth'] in every row")
        return await super().start_interaction(instance_id, ground_truth=str(ground_truth), **kwargs)

    async def generate_response(self, instance_id: str, messages: list[dict],
                                **kwargs) -> tuple[bool, str, float, dict]:
        answer = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        score = gsm8k.compute_score(answer, self._instances[instance_id]["ground_truth"], method="strict",
                                    format_score=0.0, score=1.0)
        self._instances[instance_id]["score"] = score
        if score == 1.0:
            return True, CORRECT, score, {}
        return False, str(self.config.get("retry_message", RETRY)), score, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return float(self._instances.get(instance_id, {}).get("score", 0.0))
