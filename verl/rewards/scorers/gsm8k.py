"""GSM8K rule reward: compare the model's final number with the reference answer.

The model is asked to end its reasoning with ``#### <answer>`` (the format of the GSM8K solutions).
Only the last 300 characters are searched. Two ways to find the model's answer:

- ``strict``: the last ``#### <number>`` (one space after the marker); a response without it gets 0;
- ``flexible``: the last number anywhere in the text, marker or not.

By default the answer is compared with the ground truth exactly as the original verl does, so that
curves can be compared with published logs: a strict answer loses its commas, a flexible one keeps
them, and the strings must then be equal (``72.00``, ``#### $72``, ``####72`` and ``72.`` all score 0
against ``72``).

``normalize=True`` (``custom_reward_function.reward_kwargs={normalize: true}``) compares numbers as
normalised strings instead: any spacing after ``####``, commas and ``$`` removed, a trailing ``.``
dropped, a fractional part trimmed of trailing zeros (``72.0`` is ``72``, ``2.50`` is ``2.5``), ``.5``
given its leading zero. Anything else must still match (``072`` is not ``72``, ``1/2`` is not ``0.5``).
"""

from __future__ import annotations

import re

# Only the tail of the response is searched: the answer comes last, the reasoning before it is full of
# intermediate numbers, and regex time on very long rollouts stays bounded.
_TAIL_CHARS = 300

# The original's patterns: a number is "-"? then digits, dots and commas.
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
# Normalised: optional "$" and "-" in either order, at least one digit, any spacing after "####".
_NUMBER = r"\$?-?\$?[0-9.,]*[0-9][0-9.,]*"
_STRICT_NORMALIZED = re.compile(r"####\s*(" + _NUMBER + ")")
_FLEXIBLE_NORMALIZED = re.compile(_NUMBER)


def normalize_number(text: str) -> str:
    """Canonical string form of a number as written by a model or in the GSM8K answers."""
    text = str(text).strip().replace(",", "").replace("$", "").rstrip(".")
    sign = "-" if text.startswith("-") else ""
    digits = text[len(sign):]
    if digits.startswith("."):
        digits = "0" + digits
    if "." in digits:
        digits = digits.rstrip("0").rstrip(".")
    return sign + digits


def extract_solution(solution_str: str, method: str = "strict", normalize: bool = False) -> str | None:
    """The answer found in the last 300 characters of ``solution_str`` (see the module docstring), or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    if normalize:
        matches = (_STRICT_NORMALIZED if method == "strict" else _FLEXIBLE_NORMALIZED).findall(tail)
        return normalize_number(matches[-1]) if matches else None
    if method == "strict":
        matches = _STRICT.findall(tail)
        return matches[-1].replace(",", "").replace("$", "") if matches else None
    matches = _FLEXIBLE.findall(tail)
    if not matches:
        return None
    # The last match that is not a lone "." (the original keeps the first match when all are).
    return next((m for m in reversed(matches) if m not in ("", ".")), matches[0])


def compute_score(solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0, normalize: bool = False) -> float:
    """``score`` if the extracted answer equals ``ground_truth``, ``format_score`` if an answer was found
    but is wrong, and 0.0 if no answer was found."""
    answer = extract_solution(solution_str, method=method, normalize=normalize)
    if answer is None:
        return 0.0
    reference = normalize_number(ground_truth) if normalize else str(ground_truth)
    return float(score) if answer == reference else float(format_score)
