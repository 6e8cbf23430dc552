"""Rule reward of the demo's toy task: write a string of digits backwards.

The prompt is ``Reverse 3814`` and the right answer is ``4183``. The reward is 1 for exactly the
reversed string (surrounding whitespace ignored) and 0 for anything else. Besides the score, the
scorer reports ``truncated``: whether the response is the right answer without its last digit
(``418``), the one mistake the demo's teacher makes, so a run shows that mistake going away.
"""

from __future__ import annotations

DATA_SOURCE = "reverse_digits"


def compute_score(solution_str: str, ground_truth: str, extra_info=None) -> dict:
    """``{"score", "acc", "truncated"}``, each 0.0 or 1.0, for one response."""
    answer = solution_str.strip()
    correct = answer == ground_truth
    truncated = len(ground_truth) > 1 and answer == ground_truth[:-1]
    return {"score": float(correct), "acc": float(correct), "truncated": float(truncated)}
