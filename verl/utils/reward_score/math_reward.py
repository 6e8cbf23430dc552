"""MATH rule reward: the last ``\\boxed{...}`` answer, compared after string normalisation.

The comparison follows the approach of Hendrycks et al. (the MATH benchmark): both answers are
rewritten into a canonical LaTeX string and compared for equality. There is no symbolic algebra, so
``\\frac{2}{4}`` and ``\\frac{1}{2}`` stay different; the normalisation only removes notation that
does not change the value (spacing, ``\\left``/``\\right``, degrees, dollars, units, percent signs,
``x =`` prefixes) and unifies a few spellings of the same number (``\\dfrac12``, ``1/2``, ``0.5`` and
``\\frac{1}{2}`` all become ``\\frac{1}{2}``).
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_SPACES = re.compile(" *")


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in ``string``, braces balanced.

    Returns None when there is no box or its braces never close.
    """
    starts = [(string.rfind(cmd), cmd) for cmd in _BOX_COMMANDS]
    start, cmd = max(starts)
    if start < 0:
        return None
    after = start + len(cmd)
    brace = _SPACES.match(string, after).end()
    if string.startswith("{", brace):
        end = _closing_brace(string, brace)
        return None if end is None else cmd + string[brace:end + 1]
    if brace > after:
        # "\boxed 5": the answer runs to the end of the math span or the line.
        answer = re.split(r"[$\n]", string[brace:], maxsplit=1)[0].strip()
        return f"{cmd} {answer}" if answer else None
    return None


def remove_boxed(boxed: str) -> str:
    """The content of a string returned by :func:`last_boxed_only_string`."""
    for cmd in _BOX_COMMANDS:
        if boxed.startswith(cmd + " "):
            return boxed[len(cmd) + 1:]
        if boxed.startswith(cmd + "{") and boxed.endswith("}"):
            return boxed[len(cmd) + 1:-1]
    raise ValueError(f"not a boxed answer: {boxed[:80]!r} (expected '\\boxed{{...}}' or '\\boxed ...')")


def _closing_brace(string: str, open_index: int) -> int | None:
    """Index of the brace closing the one at ``open_index``, or None if it never closes."""
    depth = 0
    for i in range(open_index, len(string)):
        if string[i] == "{":
            depth += 1
        elif string[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _read_argument(string: str, i: int) -> tuple[str | None, int]:
    """One LaTeX macro argument starting at ``i``: a braced group, a ``\\command`` or one character."""
    if i >= len(string):
        return None, i
    if string[i] == "{":
        end = _closing_brace(string, i)
        return (None, i) if end is None else (string[i + 1:end], end + 1)
    if string[i] == "\\":
        match = re.match(r"\\[A-Za-z]+", string[i:])
        if match:
            return match.group(0), i + match.end()
    return string[i], i + 1


def _brace_fracs(string: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac\\pi2`` -> ``\\frac{\\pi}{2}``; braced ones unchanged."""
    out, i = [], 0
    while (j := string.find("\\frac", i)) >= 0:
        out.append(string[i:j] + "\\frac")
        i = j + len("\\frac")
        for _ in range(2):
            arg, i = _read_argument(string, i)
            if arg is None:
                break
            out.append("{" + arg + "}")
    out.append(string[i:])
    return "".join(out)


def _remove_unit(string: str) -> str:
    """Drop a trailing unit written as text: ``5\\text{ cm}``, ``3 \\mbox{m}^2`` -> the number."""
    match = re.fullmatch(r"(.+?)\s*\\(?:text|mbox|mathrm)\{\s*[A-Za-z][^{}]*\}(?:\^\{?\d\}?)?", string)
    return match.group(1) if match else string


def _drop_short_lhs(string: str) -> str:
    """``x = 5`` -> ``5`` when the left side is one short symbol (``k``, ``x_1``, ``\\theta``)."""
    parts = string.split("=")
    if len(parts) == 2 and re.fullmatch(r"[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+", parts[0].strip()):
        return parts[1].strip()
    return string


def _canonical_number(string: str) -> str:
    """Whole-string numbers in one spelling: ``1,000`` -> ``1000``, ``0.5`` and ``1/2`` ->
    ``\\frac{1}{2}``, ``2.0`` -> ``2``, ``\\frac{-1}{2}`` -> ``-\\frac{1}{2}``."""
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+", string):
        return string.replace(",", "")
    if match := re.fullmatch(r"(-?)(\d+)/(\d+)", string):
        sign, num, den = match.groups()
        # Written as a fraction: keep its terms as written (1/2 is \frac{1}{2}, 2/4 stays \frac{2}{4}).
        return f"{sign}\\frac{{{int(num)}}}{{{int(den)}}}" if int(den) else string
    if match := re.fullmatch(r"\\frac\{-([^{}]+)\}\{([^{}]+)\}", string):
        return f"-\\frac{{{match.group(1)}}}{{{match.group(2)}}}"
    if not re.fullmatch(r"-?\d*\.\d+", string):
        return string
    value = Fraction(string)  # a decimal: written as its exact reduced fraction
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def strip_string(string: str) -> str:
    """Canonical form of a LaTeX answer (see the module docstring for what is normalised)."""
    s = str(string).strip().replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _remove_unit(s.strip())
    s = re.sub(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\%", "").replace("%", "")
    s = _drop_short_lhs(s)
    s = s.replace(" ", "").rstrip(".")
    s = re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", s)  # ".5" -> "0.5", "{.5}" -> "{0.5}"
    s = re.sub(r"\\sqrt([^{\\\[])", r"\\sqrt{\1}", s)
    s = _brace_fracs(s)
    return _canonical_number(s)


def is_equiv(answer: str | None, reference: str | None) -> bool:
    """True when both answers normalise to the same string. A missing answer is never equivalent."""
    if answer is None or reference is None:
        return False
    return strip_string(answer) == strip_string(reference)


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last boxed answer in ``solution_str`` matches ``ground_truth``, else 0.0.

    A ground truth that still contains a ``\\boxed{}`` (a full reference solution) is reduced to its
    boxed answer first.
    """
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    reference = str(ground_truth)
    if any(cmd in reference for cmd in _BOX_COMMANDS):
        reference_box = last_boxed_only_string(reference)
        reference = remove_boxed(reference_box) if reference_box else reference
    return 1.0 if is_equiv(remove_boxed(boxed), reference) else 0.0
