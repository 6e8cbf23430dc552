"""Exact-match reward for search-style question answering (data sources ``searchR1_*``), as the original
verl scores them: the answer is the text of the last ``<answer>...</answer>`` in the response; it scores
``score`` (1.0) when, lower-cased and stripped of punctuation, articles (a, an, the) and extra spaces, it
equals one of the ground truth's ``target`` answers (a quarter of it when the response holds more than
10 ``<answer>`` or ``</answer>`` tags), ``format_score`` (0.0) when it does not, and 0 when the response
has no answer tags."""

from __future__ import annotations

import re
import string

__all__ = ["compute_score", "normalize_answer"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _targets(ground_truth) -> list[str]:
    targets = ground_truth.get("target") if isinstance(ground_truth, dict) else ground_truth
    if isinstance(targets, str):
        return [targets]
    return [str(t) for t in list(targets if targets is not None else [])]


def compute_score(solution_str: str, ground_truth, format_score: float = 0.0, score: float = 1.0) -> float:
    matches = _ANSWER.findall(solution_str)
    if not matches:
        return 0.0
    answer = normalize_answer(matches[-1].strip())
    if not any(normalize_answer(t) == answer for t in _targets(ground_truth)):
        return float(format_score)
    # A right answer buried among many answer tags (more than 10 of either) earns a quarter.
    if solution_str.count("<answer>") > 10 or solution_str.count("</answer>") > 10:
        return float(score) / 4
    return float(score)
