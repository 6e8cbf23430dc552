"""GSM8K scoring worked by hand: the default is the original verl's (exact strings), ``normalize=True``
this project's number normalisation."""

import pytest

from verl.rewards.scorers.gsm8k import compute_score, extract_solution, normalize_number

SEVERAL_NUMBERS = "She has 5 apples and buys 3 more, so 5 + 3 = 8. #### 8 apples, or maybe 9"


def test_strict_takes_the_marked_answer_and_flexible_the_last_number():
    assert extract_solution(SEVERAL_NUMBERS, "strict") == "8"
    assert extract_solution(SEVERAL_NUMBERS, "flexible") == "9"
    assert compute_score(SEVERAL_NUMBERS, "8") == 1.0
    assert compute_score(SEVERAL_NUMBERS, "8", method="flexible") == 0.0


def test_the_last_marker_wins_in_strict_mode():
    assert extract_solution("#### 3\nno wait\n#### 4", "strict") == "4"


def test_strict_needs_the_marker_flexible_does_not():
    text = "Natalia sold 48 + 24 = 72 clips. The answer is 72"
    assert compute_score(text, "72") == 0.0
    assert compute_score(text, "72", method="flexible") == 1.0


@pytest.mark.parametrize("response, expected", [
    ("#### 72", 1.0),
    ("#### 1,000", 0.0),     # "1000" after the commas go: not "72"
    ("#### $72", 0.0),       # "$" is not part of the original's number: no match at all
    ("####72", 0.0),         # the original wants one space after the marker
    ("#### 72.00", 0.0),     # compared as strings: "72.00" != "72"
    ("#### 72.", 0.0),       # the trailing dot is part of the match: "72."
    ("#### -72", 0.0),
])
def test_the_default_is_the_originals_exact_comparison(response, expected):
    assert compute_score(response, "72") == expected
    assert compute_score("#### 1,000", "1000") == 1.0  # strict mode drops commas ...
    assert compute_score("so 1,000", "1000", method="flexible") == 0.0  # ... flexible mode keeps them


def test_flexible_skips_lone_dots_and_keeps_the_first_match_when_all_are_dots():
    assert extract_solution("The total is 7 . . .", "flexible") == "7"
    assert extract_solution("no digits here ...", "flexible") == "..."  # one match, not a lone "."
    assert extract_solution("just . here", "flexible") == "."
    assert compute_score("just . here", "72", method="flexible", format_score=0.1) == 0.1


@pytest.mark.parametrize("response, truth", [
    ("#### 1,234", "1234"), ("#### $1,234.", "1234"), ("#### -$5", "-5"), ("####72", "72"), ("#### 72.0", "72"),
    ("#### 72.50", "72.5"), ("#### .5", "0.5"),
])
def test_normalized_scoring_accepts_other_spellings_of_the_number(response, truth):
    assert compute_score(response, truth, normalize=True) == 1.0


def test_normalized_scoring_still_tells_numbers_apart():
    assert compute_score("#### 072", "72", normalize=True) == 0.0
    assert compute_score("It costs $18.", "18", method="flexible", normalize=True) == 1.0
    assert normalize_number("$1,000.00") == "1000"
    assert extract_solution("no digits here ...", "flexible", normalize=True) is None


def test_only_the_last_300_characters_are_searched():
    answer_then_padding = "#### 72" + " and that is final" + "." * 300
    assert compute_score(answer_then_padding, "72") == 0.0
    padding_then_answer = "reasoning with 1 2 3 " * 100 + "#### 72"
    assert len(padding_then_answer) > 300
    assert compute_score(padding_then_answer, "72") == 1.0


def test_format_score_is_given_for_a_wrong_but_well_formed_answer():
    assert compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert compute_score("no answer at all", "72", format_score=0.1) == 0.0
    assert compute_score("#### 72", "72", score=2.0) == 2.0


def test_integer_ground_truth_and_bad_method():
    assert compute_score("#### 72", 72) == 1.0
    with pytest.raises(ValueError, match="strict"):
        compute_score("#### 72", "72", method="loose")
