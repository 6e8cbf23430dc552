"""The rule reward of the demo's toy task (reverse a digit string), on hand-worked cases."""

import subprocess
import sys

import pytest

from verl.rewards.scorers import default_compute_score
from verl.rewards.scorers.reverse_digits import DATA_SOURCE, compute_score


@pytest.mark.parametrize("response, ground_truth, expected", [
    ("4183", "4183", {"score": 1.0, "acc": 1.0, "truncated": 0.0}),      # Reverse 3814: right
    (" 4183\n", "4183", {"score": 1.0, "acc": 1.0, "truncated": 0.0}),   # surrounding whitespace is ignored
    ("418", "4183", {"score": 0.0, "acc": 0.0, "truncated": 1.0}),       # last digit dropped: the teacher's mistake
    ("183", "4183", {"score": 0.0, "acc": 0.0, "truncated": 0.0}),       # first digit dropped: another mistake
    ("3814", "4183", {"score": 0.0, "acc": 0.0, "truncated": 0.0}),      # not reversed
    ("41830", "4183", {"score": 0.0, "acc": 0.0, "truncated": 0.0}),     # one digit too many
    ("4 1 8 3", "4183", {"score": 0.0, "acc": 0.0, "truncated": 0.0}),   # spaces inside are not the answer
    ("", "4183", {"score": 0.0, "acc": 0.0, "truncated": 0.0}),
    ("", "4", {"score": 0.0, "acc": 0.0, "truncated": 0.0}),             # nothing is not a 1-digit truncation
])
def test_compute_score(response, ground_truth, expected):
    assert compute_score(response, ground_truth) == expected


def test_dispatched_by_data_source():
    assert default_compute_score(DATA_SOURCE, "4183", "4183", extra_info={"digits": "3814"})["score"] == 1.0
    assert default_compute_score(DATA_SOURCE, "418", "4183")["truncated"] == 1.0


def test_registered_as_soon_as_the_package_is_imported():
    """Trainer processes and Ray workers only import verl.rewards.scorers: that must be enough."""
    code = ("from verl.rewards.scorers import registered_data_sources as r; "
            f"assert {DATA_SOURCE!r} in r(), r()")
    subprocess.run([sys.executable, "-c", code], check=True)
