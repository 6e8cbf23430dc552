"""Code rewards: run the response's program against the row's test cases in the sandbox.

``ground_truth`` (a dict or its JSON string) holds ``inputs`` and ``outputs``, lists of equal length,
as the APPS / CodeContests / TACO exports do:

- standard input / output: each input is fed on stdin, the printed text must equal the output
  (compared line by line with trailing whitespace ignored);
- with ``fn_name``: each input is the list of arguments of a call ``fn_name(*args)`` (a top-level
  function, or a method of a ``Solution`` class as LeetCode-style rows have it), and the result must
  equal the output (a list of one value is compared to the value too).

The program is the last fenced code block of the response (```python ... ``` or ``` ... ```), or the
whole response when it has none. Each test runs in its own sandbox (:mod:`verl.sandbox.process`):
hostile code scores 0 and cannot reach the trainer. Score: 1.0 when every test passes, else 0.0 (the
original's rule for these data sources), with ``tests_passed`` (how many passed before the first
failure; the rest are not run) beside it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from verl.sandbox.process import SandboxLimits, run_python

DATA_SOURCES = ("codecontests", "apps", "codeforces", "taco")
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_CALL_HARNESS = """
import json, sys
{program}

_args = json.loads(sys.stdin.read())
_name = {fn_name!r}
_fn = globals().get(_name)
if _fn is None and "Solution" in globals():
    _fn = getattr(Solution(), _name)
print(json.dumps(_fn(*_args)))
"""


def extract_program(solution_str: str) -> str:
    blocks = _FENCE.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def parse_tests(ground_truth: Any) -> dict:
    """The test cases as a dict; raises ValueError naming what is wrong with them."""
    tests = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
        raise ValueError("a code row's ground_truth must be a dict (or its JSON) with 'inputs' and 'outputs' lists, "
                         f"got {str(ground_truth)[:120]!r}")
    if len(tests["inputs"]) != len(tests["outputs"]) or not len(tests["inputs"]):
        raise ValueError(f"a code row's ground_truth has {len(tests['inputs'])} inputs and {len(tests['outputs'])} "
                         "outputs; they must be equal in number and not empty")
    return tests


def _same_text(got: str, expected: Any) -> bool:
    expected = "\n".join(map(str, expected)) if isinstance(expected, list) else str(expected)
    lines = lambda text: [line.rstrip() for line in text.strip().splitlines()]  # noqa: E731
    return lines(got) == lines(expected)


def _same_value(got: str, expected: Any) -> bool:
    try:
        value = json.loads(got)
    except json.JSONDecodeError:
        return False
    return value == expected or (isinstance(expected, list) and len(expected) == 1 and value == expected[0])


def compute_score(solution_str: str, ground_truth: Any, extra_info=None, limits: SandboxLimits | None = None) -> dict:
    tests = parse_tests(ground_truth)
    program = extract_program(solution_str)
    limits = limits or SandboxLimits()
    fn_name = tests.get("fn_name")
    passed = 0
    for test_input, expected in zip(tests["inputs"], tests["outputs"]):
        if fn_name:
            args = test_input if isinstance(test_input, list) else [test_input]
            result = run_python(_CALL_HARNESS.format(program=program, fn_name=fn_name), json.dumps(args), limits)
            ok = result.ok and _same_value(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "",
                                           expected)
        else:
            stdin = "\n".join(map(str, test_input)) if isinstance(test_input, list) else str(test_input)
            result = run_python(program, stdin, limits)
            ok = result.ok and _same_text(result.stdout, expected)
        if not ok:
            break  # all must pass: the first failure decides
        passed += 1
    return {"score": 1.0 if passed == len(tests["inputs"]) else 0.0, "tests_passed": passed}
