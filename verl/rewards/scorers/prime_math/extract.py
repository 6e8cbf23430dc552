"""Answer extraction of the original's ``prime_math`` grader: plain string work, no evaluation.

It runs on the trainer (the extracted answer and the reference are the grading key, so repeated answers
are graded once) and in the sandbox (:mod:`.grader` imports it). See :func:`extract_answer`.
"""

from __future__ import annotations


def last_boxed_content(text: str) -> str | None:
    """The content of the last ``\\boxed`` (else ``\\fbox``): from the first ``{`` after it to the point where
    the braces counted from the command balance again; None if there is no such span."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth, opening = 0, None
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
            if opening is None:
                opening = i
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return None if opening is None else text[opening + 1:i].strip()
    return None


def _after_last(text: str, marker: str) -> str | None:
    at = text.lower().rfind(marker)
    return None if at < 0 else text[at + len(marker):].strip()


def extract_answer(response: str) -> tuple[bool, str]:
    """``(matched, answer)``: the text after the last "answer:"/"answer is"/"answers are", before "is the
    answer" and the like, inside the last box, before the last ". ", after the last "is "/"="/": "/...;
    ``matched`` is whether a marker or a box was found and the answer has a digit (the score ignores it)."""
    matched = False
    for marker in ("answer:", "answer is", "answers are"):
        rest = _after_last(response, marker)
        if rest is not None:
            matched, response = True, rest
    for marker in ("is answer", "is the answer", "are answers", "are the answers"):
        at = response.lower().rfind(marker)
        if at >= 0:
            matched, response = True, response[:at].strip()
    boxed = last_boxed_content(response)
    if boxed:
        matched, response = True, boxed
    if ". " in response:
        response = response[:response.lower().rfind(". ")].strip()  # lower() may change the length, as there
    for marker in ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n"):
        rest = _after_last(response, marker)
        if rest is not None:
            matched, response = True, rest
    return matched and any(c.isdigit() for c in response), response
