"""Geometry3K reward (data source ``hiyouga/geometry3k``), as the original verl scores it: 0.9 x accuracy
+ 0.1 x format. Accuracy: the content of the last ``\\boxed{}`` graded against the ground truth by
``mathruler`` (the grader the original uses: string normalisation, then sympy equivalence); format: the
whole response is ``<think>...</think>`` followed by a ``\\boxed{...}``. ``format_score`` sets the format's
weight, ``use_boxed=False`` grades the whole response. Needs ``pip install -e .[geo3k]``.
"""

from __future__ import annotations

import re

__all__ = ["compute_score"]

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def _grader():
    try:
        from mathruler.grader import extract_boxed_content, grade_answer
    except ImportError as err:
        raise ImportError("data_source hiyouga/geometry3k is graded with the mathruler package, which is not "
                          "installed: pip install -e .[geo3k] (mathruler, pylatexenc, sympy)") from err
    return extract_boxed_content, grade_answer


def compute_score(solution_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    extract_boxed_content, grade_answer = _grader()
    answer = extract_boxed_content(solution_str) if use_boxed else solution_str
    accuracy = 1.0 if grade_answer(answer, ground_truth) else 0.0
    formatted = 1.0 if _FORMAT.fullmatch(solution_str) else 0.0
    return (1.0 - format_score) * accuracy + format_score * formatted
