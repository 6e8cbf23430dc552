"""numina_* (the original's prime_math grader): scores worked out by hand from its rules, and the sandbox
that keeps its evaluation of model text away from the trainer.

The grader-logic tests import the grader in this process on benign text (it only ever sees model text in
the sandbox); the rest go through ``default_compute_score`` and the sandbox workers."""

import os
import subprocess
import sys
import threading
import time

import pytest

from verl.rewards.scorers import default_compute_score
from verl.rewards.scorers.prime_math import DATA_SOURCES, compute_score
from verl.rewards.scorers.prime_math.grader import extract_answer, grade, math_equal
from verl.sandbox.process import isolation

needs_sandbox = pytest.mark.skipif(isolation() != "namespaces", reason=f"no sandbox on this machine: {isolation()}")

# (response, reference, correct): why each holds, rule by rule.
HAND_WORKED = [
    # "answer is" then a trailing "." -- the second normalisation reads "42." as the float 42.
    ("Thus the answer is 42.", "42", True),
    # Hendrycks clean-up: exactly "0.5" becomes \frac{1}{2}
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", True),
    # both fractions of integers: compared as written, so an unreduced one is wrong
    ("\\boxed{2/4}", "\\frac{1}{2}", False),
    # 1/3 - 0.333 is not 0 for sympy, and 0.333 is 0.1% off (more than the 1e-4 tolerance)
    ("\\boxed{0.333}", "\\frac{1}{3}", False),
    # |33.3333 - 33.33333| = 3e-5 <= 1e-4 x 33.33: within the relative tolerance
    ("\\boxed{33.3333}", "33.33333", True),
    # 1000.0001 is no integer for stage 1, but within 1e-4 of 1000 for stage 2
    ("\\boxed{1000.0001}", "1000", True),
    # "50\%" loses its percent sign; 0.5 x 100 = 50
    ("\\boxed{50\\%}", "0.5", True),
    # "$" removed by the second normalisation
    ("\\boxed{\\$18}", "18", True),
    # 2\pi with pi = 3.14 is 6.28 (with math.pi 6.2832 is 0.05% off, too far)
    ("\\boxed{2\\pi}", "6.28", True),
    # 6.2832 vs 2 x math.pi = 6.283185: 2.4e-6 relative
    ("\\boxed{6.2832}", "2\\pi", True),
    # tuples element by element, in order
    ("\\boxed{(2, 1)}", "(1,2)", False),
    ("\\boxed{\\frac{1}{2}, \\frac{1}{3}}", "\\frac12,\\frac13", True),
    # sympy's Interval.Ropen(1, 3) is [1, 3)
    ("\\boxed{Interval.Ropen(1, 3)}", "[1, 3)", True),
    # a base-2 number keeps the digits before "_" as a decimal number: 101_2 is read as 101
    ("\\boxed{101_2}", "101", True),
    # "x" before "_" is not a number: the comparison raises, which scores 0
    ("\\boxed{x_1}", "5", False),
    # sympy: (x+2)^2 + (y-3)^2 - (x^2 + y^2 + 4x - 6y + 13) simplifies to 0 (the original's own test)
    ("x^2 + y^2 + 4x - 6y + 13", "(x + 2)^2 + (y - 3)^2 ", True),
    # three unknown letters: stage 1 refuses sympy, and the original's symbolic stage never succeeds
    ("\\boxed{a+b+c}", "c+b+a", False),
    # pylatexenc turns both into sqrt(3)/3 and 1/sqrt(3), whose difference sympy simplifies to 0
    ("\\boxed{\\frac{\\sqrt{3}}{3}}", "\\frac{1}{\\sqrt{3}}", True),
    # a mixed number: 7 3/4 -> 7+3/4 = 31/4
    ("So we get 7 3/4", "\\frac{31}{4}", True),
    # thousands separators, units after \text{ , degrees, a short "x =" prefix
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{5 \\text{ cm}}", "5", True),
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{x = 5}", "5", True),
    ("The answer is 5. Because math.", "5", True),
]


@pytest.mark.parametrize("response,reference,correct", HAND_WORKED)
def test_hand_worked_scores(response, reference, correct):
    assert grade(response, reference)["correct"] is correct


def test_answer_extraction_follows_the_markers_in_order():
    # after the last "answer is", then before the last ". ", then after the last "=": "12"
    assert extract_answer("We know 3 = 3. The answer is x = 12. Done") == (True, "12")
    # inside the last box, which wins over the text around it
    assert extract_answer("so \\boxed{7} and finally \\boxed{\\frac{9}{2}} is it") == (True, "\\frac{9}{2}")
    # "is the answer" keeps what comes before it; no digit means not matched (the text is still graded)
    assert extract_answer("Paris is the answer") == (False, "Paris")


def test_pi_is_tried_with_both_values_and_numbers_with_percent_factors():
    assert math_equal("3.14", "\\pi", pi=3.14) and not math_equal("3.14", "\\pi")  # 0.05% off math.pi
    assert math_equal("25", "0.25") and math_equal("0.25", "25")  # x100 and /100
    assert not math_equal("2.5", "0.25")


def test_the_original_test_cases_score_one():
    matrix = "\\begin{bmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19 \n \\end{bmatrix}"
    reference = "\\begin{pmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19\n \\end{pmatrix}"
    assert grade(matrix, reference)["correct"]  # pylatexenc renders both matrices to the same text
    assert grade("\\frac{\\sqrt{505}}{7}", "\\frac{\\sqrt{505}}{7}")["correct"]


@needs_sandbox
def test_every_numina_source_is_graded_in_the_sandbox():
    for source in DATA_SOURCES:
        assert default_compute_score(source, "The answer is \\boxed{\\frac{3}{4}}", "0.75") == 1.0
    assert default_compute_score("numina_amc_aime", "The answer is \\boxed{12}", "13") == 0.0


@needs_sandbox
def test_model_text_evaluated_by_the_grader_runs_in_the_sandbox():
    # The grader evaluates a \\pi answer as Python (written without "_", which would make it a base-n
    # number): (2 if open(path) else 3) x pi matches 2 x pi only where the file opens.
    probe = "\\boxed{{(2 if open({path!r}) else 3)*\\pi}}"
    assert compute_score(probe.format(path="/etc/passwd"), "2\\pi") == 1.0  # evaluated: /etc is shown read-only
    here = f"/tmp/verl-prime-probe-{os.getpid()}"
    with open(here, "w") as f:
        f.write("on the host")
    try:
        assert compute_score(probe.format(path=here), "2\\pi") == 0.0  # the trainer's files are not there
    finally:
        os.remove(here)
    target = f"/tmp/verl-prime-write-{os.getpid()}"
    # writing raises there (nothing in a grader worker is writable), so the text stays text: 0
    assert compute_score(f"\\boxed{{(open({target!r}, 'w').write('x'))*\\pi}}", "3.14") == 0.0
    assert not os.path.exists(target)


# Evaluated by the grader, this makes re.match always match, after which every answer and reference lose
# their first character as "$" amounts -- "5" and "3" both become "" and are equal.
PATCH = "\\boxed{(setattr(re, 'match', lambda *a:1) or 1)*\\pi}"


def test_the_patch_forges_later_grades_in_one_process():
    code = ("from verl.rewards.scorers.prime_math.grader import grade\n"
            f"grade({PATCH!r}, '7')\nprint(grade('The answer is \\\\boxed{{5}}', '3')['correct'])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "True", run.stderr  # what the isolation below is for


@needs_sandbox
def test_a_response_cannot_change_how_later_ones_are_graded():
    compute_score(PATCH, "7")  # patches only the fork that graded it
    assert compute_score("The answer is \\boxed{5}", "3") == 0.0


@needs_sandbox
def test_grading_that_hangs_scores_zero_after_the_timeout_and_the_next_one_works(caplog):
    start = time.monotonic()
    # "x" lets stage 1 hand the difference to sympy, which would compute 9**999999999
    assert compute_score("\\boxed{9**999999999}", "x", timeout=1.5) == 0.0
    assert time.monotonic() - start < 30  # not the 9**999999999 itself
    assert "prime_math grading gave no verdict (timeout)" in caplog.text
    assert compute_score("The answer is \\boxed{4}", "4") == 1.0


@needs_sandbox
def test_concurrent_callers_get_their_own_answers():
    results = {}

    def score(i):
        results[i] = compute_score(f"The answer is \\boxed{{{i}}}", str(i if i % 3 else i + 1))

    threads = [threading.Thread(target=score, args=(i,)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: (1.0 if i % 3 else 0.0) for i in range(24)}


@needs_sandbox
def test_a_repeated_answer_is_graded_once(monkeypatch):
    from verl.rewards.scorers import prime_math

    sent = []
    pool = prime_math.grader_pool()
    real_call = pool.call
    monkeypatch.setattr(pool, "call", lambda arg, timeout=None: sent.append(arg) or real_call(arg, timeout))
    monkeypatch.setattr(prime_math, "_verdicts", prime_math._Verdicts())
    # three phrasings of the same answer "17" to one reference, then another reference
    scores = [compute_score(text, "17") for text in ("The answer is 17", "so \\boxed{17}", "we get 17")]
    scores.append(compute_score("The answer is 17", "18"))
    assert scores == [1.0, 1.0, 1.0, 0.0]
    assert sent == [{"answer": "17", "ground_truth": "17"}, {"answer": "17", "ground_truth": "18"}]
