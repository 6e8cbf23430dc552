import pytest

from verl.utils.reward_score.gsm8k import compute_score, extract_solution, normalize_number

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


def test_commas_dollars_and_trailing_dot_are_stripped():
    assert compute_score("#### 1,234", "1234") == 1.0
    assert compute_score("#### $1,234.", "1234") == 1.0
    assert compute_score("#### -$5", "-5") == 1.0
    assert compute_score("It costs $18.", "18", method="flexible") == 1.0


def test_zero_fraction_is_trimmed_but_other_spellings_are_not_equal():
    # Documented decision: "72.0" and "72" are the same answer; "072" is not "72".
    assert compute_score("#### 72.0", "72") == 1.0
    assert compute_score("#### 72.50", "72.5") == 1.0
    assert compute_score("#### .5", "0.5") == 1.0
    assert compute_score("#### 072", "72") == 0.0
    assert normalize_number("$1,000.00") == "1000"


def test_lone_dots_are_not_numbers():
    assert extract_solution("The total is 7 . . .", "flexible") == "7"
    assert extract_solution("no digits here ...", "flexible") is None


def test_only_the_last_300_characters_are_searched():
    answer_then_padding = "#### 72" + " and that is final" + "." * 300
    assert compute_score(answer_then_padding, "72") == 0.0
    assert compute_score(answer_then_padding, "72", method="flexible") == 0.0
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
