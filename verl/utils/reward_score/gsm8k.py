"""GSM8K rule reward: compare the model's final number with the reference answer.

The model is asked to end its reasoning with ``#### <answer>`` (the format of the GSM8K solutions).
Two ways to find the model's answer:

- ``strict``: the last ``#### <number>`` in the text; a response without that marker gets 0.
- ``flexible``: the last number anywhere in the text, marker or not.

Numbers are compared as normalised strings, not as floats: commas and ``$`` are removed, a trailing
``.`` is dropped, and a fractional part is trimmed of trailing zeros (``72.0`` and ``72.00`` read as
``72``, ``2.50`` as ``2.5``) and ``.5`` gains its leading zero. Anything else must match exactly, so
``072`` is not ``72`` and ``1/2`` is not ``0.5``.
"""

from __future__ import annotations

import re

# Only the tail of the response is searched. The answer comes last; the reasoning before it is full of
# intermediate numbers (and sometimes an echoed "####" from the prompt) that flexible mode would
# otherwise pick up, and regex time on very long rollouts stays bounded.
_TAIL_CHARS = 300

# A number: optional "$" and "-" in either order, then digits with "," and "." inside. At least one
# digit is required, so a lone "." or "," is never an answer.
_NUMBER = r"\$?-?\$?[0-9.,]*[0-9][0-9.,]*"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_FLEXIBLE = re.compile(_NUMBER)


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


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The normalised answer found in the last 300 characters of ``solution_str``, or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    pattern = _STRICT if method == "strict" else _FLEXIBLE
    matches = pattern.findall(tail)
    if not matches:
        return None
    return normalize_number(matches[-1])


def compute_score(solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    """``score`` if the extracted answer equals ``ground_truth``, ``format_score`` if an answer was found
    but is wrong, and 0.0 if no answer was found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == normalize_number(ground_truth) else float(format_score)
