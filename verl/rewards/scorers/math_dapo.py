"""DAPO's math reward (data sources ``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*``), as the
original verl scores them: the answer is the text after the last ``Answer:`` in the response's last 300
characters (the DAPO prompt asks for ``Answer: $Answer``), normalised the Minerva way
(:func:`normalize_final_answer`: the part after the last ``=``, units and filler words removed, the
content of ``$...$``, ``\\text{}``, ``\\textbf{}``, ``\\overline{}`` and ``\\boxed{}`` taken,
``\\frac12``/``\\sqrt2`` braced, ``1,000`` -> ``1000``) and compared with the normalised ground truth.

Returns ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` (``pred`` feeds ``maj@k`` in validation);
a response without an ``Answer:`` line scores -1 with ``pred="[INVALID]"``, as in the scorer the DAPO
recipe's published runs used. ``boxed_fallback=True`` (``custom_reward_function.reward_kwargs``) then
takes the last ``\\boxed{}`` of the last 100 characters instead, normalised the same way, as some later
versions of the original do. ``strict_box_verify=True`` only takes that box and compares it with the
ground truth as written.
"""

from __future__ import annotations

import re

from verl.rewards.scorers.math_reward import closing_brace

__all__ = ["compute_score", "normalize_final_answer"]

_SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                  (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
_REMOVED = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
            "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
            "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
            "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
            r",\!", "{,}", '"', "\\dots"]
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def normalize_final_answer(answer: str) -> str:
    """Minerva-style normalisation of a final answer (see the module docstring)."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in _REMOVED:
        answer = answer.replace(expression, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _last_boxed(string: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = string.rfind("\\boxed{")
    if start < 0:
        return None
    end = closing_brace(string, start + len("\\boxed"))
    return None if end is None else string[start + len("\\boxed{"):end]


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
                  boxed_fallback: bool = False) -> dict:
    tail = solution_str[-300:]  # the longest MATH-500 answer has 159 characters
    if strict_box_verify:
        pred = _last_boxed(tail[-100:])
        correct = pred == ground_truth
    else:
        found = _ANSWER.findall(tail)
        pred = normalize_final_answer(found[-1] if found else "[INVALID]")
        correct = pred == normalize_final_answer(str(ground_truth))
        boxed = None if found or not boxed_fallback else _last_boxed(tail[-100:])
        if boxed is not None:  # no "Answer:" line: the last box of the last 100 characters, normalised
            pred = normalize_final_answer(boxed)
            correct = pred == normalize_final_answer(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}
