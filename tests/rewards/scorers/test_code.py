"""Code rewards by hand: programs against stdin/stdout and call-based test cases, in the sandbox."""

import json

import pytest

from verl.rewards.scorers import default_compute_score
from verl.rewards.scorers.code import extract_program, parse_tests
from verl.sandbox.process import isolation

pytestmark = pytest.mark.skipif(isolation() != "namespaces", reason=f"no sandbox on this machine: {isolation()}")

STDIO = json.dumps({"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]})
CALL = {"inputs": [[[1, 2, 3]], [[]]], "outputs": [[6], [0]], "fn_name": "total"}


def test_stdin_stdout_all_pass_scores_one():
    response = "Here it is:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone."
    assert default_compute_score("codecontests", response, STDIO) == {"score": 1.0, "tests_passed": 2}


def test_one_failing_case_scores_zero():
    response = "```python\na, b = map(int, input().split())\nprint(a + abs(b))\n```"  # wrong for 10 -3
    assert default_compute_score("apps", response, STDIO) == {"score": 0.0, "tests_passed": 1}


def test_call_based_rows_and_a_solution_class():
    plain = "```python\ndef total(xs):\n    return sum(xs)\n```"
    leetcode = "```python\nclass Solution:\n    def total(self, xs):\n        return sum(xs)\n```"
    assert default_compute_score("taco", plain, CALL)["score"] == 1.0
    assert default_compute_score("taco", leetcode, CALL)["score"] == 1.0


def test_hostile_or_broken_programs_score_zero():
    for program in ("while True: pass", "import os\nos.system('rm -rf /')\nprint(3)", "syntax error here",
                    "import socket; socket.create_connection(('1.1.1.1', 80))"):
        assert default_compute_score("codeforces", f"```python\n{program}\n```", STDIO)["score"] == 0.0, program


def test_program_extraction_and_bad_test_cases():
    assert extract_program("a\n```py\nprint(1)\n```\nb\n```python\nprint(2)\n```") == "print(2)\n"
    assert extract_program("print(3)") == "print(3)"
    with pytest.raises(ValueError, match="'inputs' and 'outputs'"):
        parse_tests('{"input": [1]}')
    with pytest.raises(ValueError, match="2 inputs and 1 outputs"):
        parse_tests({"inputs": [1, 2], "outputs": [1]})
