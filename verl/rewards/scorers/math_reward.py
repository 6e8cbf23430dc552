"""MATH rule reward: the last ``\\boxed{...}`` answer compared with the reference as strings.

The default is the original verl's (Hendrycks et al.'s MATH code): both answers go through
:func:`strip_string`, a fixed list of textual clean-ups (spaces, ``\\left``/``\\right``, ``tfrac``/``dfrac``,
degrees, ``\\$``, ``\\%``, a unit after ``\\text{ ``, ``k = `` prefixes of at most two characters,
``\\frac12`` and ``\\sqrt3`` braces, exactly ``0.5`` and integer ``a/b`` as ``\\frac{a}{b}``), then must be
equal; when the clean-up fails the raw strings are compared. So ``0.25`` is not ``\\frac{1}{4}`` and
``1,000`` is not ``1000``, as in the original's logs.

``normalize=True`` (``custom_reward_function.reward_kwargs={normalize: true}``) is this project's more
forgiving comparison: every decimal and integer fraction in one reduced spelling (``0.25`` =
``1/4`` = ``\\frac{1}{4}``, ``2.0`` = ``2``), thousands separators, ``%`` and ``$``, ``\\text``/``\\mbox``
units, one-symbol ``x =`` prefixes, ``\\fbox``, and a reference that is a full solution reduced to its
box. There is no symbolic algebra in either: ``\\frac{2}{4}`` and ``\\frac{1}{2}`` differ.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_SPACES = re.compile(" *")


def find_boxed(string: str) -> str | None:
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
        end = closing_brace(string, brace)
        return None if end is None else cmd + string[brace:end + 1]
    if brace > after:
        # "\boxed 5": the answer runs to the end of the math span or the line.
        answer = re.split(r"[$\n]", string[brace:], maxsplit=1)[0].strip()
        return f"{cmd} {answer}" if answer else None
    return None


def unbox(boxed: str) -> str:
    """The content of a string returned by :func:`find_boxed`."""
    for cmd in _BOX_COMMANDS:
        if boxed.startswith(cmd + " "):
            return boxed[len(cmd) + 1:]
        if boxed.startswith(cmd + "{") and boxed.endswith("}"):
            return boxed[len(cmd) + 1:-1]
    raise ValueError(f"not a boxed answer: {boxed[:80]!r} (expected '\\boxed{{...}}' or '\\boxed ...')")


def closing_brace(string: str, open_index: int) -> int | None:
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
        end = closing_brace(string, i)
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


def normalize_answer(string: str) -> str:
    """Canonical form of a LaTeX answer (normalised scoring; see the module docstring)."""
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


# ----------------------------------------------------------------------------- the original's comparison

def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` of ``string`` (or ``\\boxed <text up to $>``, or ``\\fbox{...}`` when there is
    no ``\\boxed``), braces balanced; None when there is none or it never closes. As the original."""
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    start = string.rfind("\\boxed")
    if start < 0:
        start = string.rfind("\\fbox")
        if start < 0:
            return None
    opening = string.find("{", start)
    end = None if opening < 0 else closing_brace(string, opening)
    return None if end is None else string[start:end + 1]


def remove_boxed(boxed: str) -> str:
    """The content of ``\\boxed{...}`` or ``\\boxed ...``; ValueError for anything else (an ``\\fbox``
    too, as in the original, whose scorer then gives 0)."""
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed "):]
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{"):-1]
    raise ValueError(f"not a boxed answer: {boxed[:80]!r}")


def _fix_fracs(string: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; gives up (unchanged) on a
    ``\\frac`` followed by fewer than two characters."""
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[0] == "{":  # an empty part (a trailing \frac) raises, as the original does
            out += part
            continue
        if len(part) < 2:
            return string
        first, second, rest = part[0], part[1], part[2:]
        out += "{" + first + "}" + (second + rest if second == "{" else "{" + second + "}" + rest)
    return out


def _fix_a_slash_b(string: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` for two plain integers; anything else unchanged."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return string
    return f"\\frac{{{a}}}{{{b}}}" if string == f"{a}/{b}" else string


def _fix_sqrt(string: str) -> str:
    parts = string.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        out += "\\sqrt" + (part if part.startswith("{") else "{" + part[0] + "}" + part[1:])
    return out


def strip_string(string: str, percent_signs: tuple[str, ...] = ("\\\\%", "\\%")) -> str:
    """The original's clean-up of a MATH answer (see the module docstring); raises on inputs it cannot
    handle (e.g. two ``\\text{ `` units, or a trailing ``\\sqrt``). ``percent_signs`` are removed in order
    (PRM800K's copy of this code removes ``\\%`` twice instead)."""
    s = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    if "\\text{ " in s:
        units = s.split("\\text{ ")
        if len(units) != 2:
            raise ValueError("more than one unit")
        s = units[0]
    for sign in percent_signs:
        s = s.replace(sign, "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(answer: str | None, reference: str | None, normalize: bool = False) -> bool:
    """Whether two answers are the same after the clean-up (the original's, or ``normalize``: this
    project's). A missing answer is never equivalent."""
    if answer is None or reference is None:
        return False
    if normalize:
        return normalize_answer(answer) == normalize_answer(reference)
    try:
        return strip_string(answer) == strip_string(reference)
    except (ValueError, IndexError):  # the clean-up gave up: compare as written, as the original does
        return answer == reference


def compute_score(solution_str: str, ground_truth: str, normalize: bool = False) -> float:
    """1.0 if the last boxed answer in ``solution_str`` matches ``ground_truth``, else 0.0.

    With ``normalize``, a ground truth that still contains a ``\\boxed{}`` (a full reference solution)
    is reduced to its boxed answer first."""
    reference = str(ground_truth)
    if not normalize:
        boxed = last_boxed_only_string(solution_str)
        try:
            answer = None if boxed is None else remove_boxed(boxed)
        except ValueError:
            return 0.0
        return 1.0 if is_equiv(answer, reference) else 0.0
    boxed = find_boxed(solution_str)
    if boxed is None:
        return 0.0
    if any(cmd in reference for cmd in _BOX_COMMANDS):
        reference_box = find_boxed(reference)
        reference = unbox(reference_box) if reference_box else reference
    return 1.0 if is_equiv(unbox(boxed), reference, normalize=True) else 0.0
