import pytest

from verl.utils.reward_score.math_reward import (
    compute_score,
    is_equiv,
    last_boxed_only_string,
    remove_boxed,
    strip_string,
)


def test_last_boxed_with_nested_braces():
    text = r"first \boxed{\frac{1}{2}} then \boxed{\frac{\sqrt{3}}{2}} done"
    assert last_boxed_only_string(text) == r"\boxed{\frac{\sqrt{3}}{2}}"
    assert remove_boxed(last_boxed_only_string(text)) == r"\frac{\sqrt{3}}{2}"


def test_boxed_space_form_and_fbox():
    assert last_boxed_only_string(r"so $\boxed 5$ ok") == r"\boxed 5"
    assert remove_boxed(r"\boxed 5") == "5"
    assert remove_boxed(last_boxed_only_string(r"\fbox{7}")) == "7"
    assert last_boxed_only_string(r"\boxed {5}") == r"\boxed{5}"


def test_missing_or_unbalanced_box():
    assert last_boxed_only_string("the answer is 5") is None
    assert last_boxed_only_string(r"\boxed{1 + {2}") is None
    with pytest.raises(ValueError, match="boxed"):
        remove_boxed("5")


@pytest.mark.parametrize("a, b", [
    (r"\frac12", r"\frac{1}{2}"),
    ("0.5", r"\frac{1}{2}"),
    (r"\dfrac{1}{2}", "1/2"),
    (r"\tfrac{3}{4}", "0.75"),
    (r"5\text{ cm}", "5"),
    (r"3\mbox{ m}^2", "3"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"90^\circ", "90"),
    (r"\$10", "10"),
    (r"50\%", "50"),
    ("x = 5", "5"),
    (r"\theta = \frac{\pi}{4}", r"\frac\pi4"),
    (".5", "0.5"),
    ("5.", "5"),
    (r"\sqrt2", r"\sqrt{2}"),
    ("1,000", "1000"),
    ("2.0", "2"),
    ("-0.5", r"\frac{-1}{2}"),
    (r"\text{(A)}", "(A)"),
])
def test_equivalent_spellings(a, b):
    assert is_equiv(a, b)


@pytest.mark.parametrize("a, b", [
    (r"\frac{2}{4}", r"\frac{1}{2}"),  # no algebra: unreduced fractions differ
    ("x + y = 5", "5"),  # the left side is not a single symbol, so it stays
    ("2", "3"),
    (r"\leftarrow", "arrow"),  # \left is only removed as a whole command
])
def test_different_answers(a, b):
    assert not is_equiv(a, b)


def test_missing_answer_is_never_equivalent():
    assert not is_equiv(None, "5")
    assert not is_equiv(None, None)


def test_strip_string_canonical_forms():
    assert strip_string(r"\frac{-1}{2}") == r"-\frac{1}{2}"
    assert strip_string("0.25") == r"\frac{1}{4}"
    assert strip_string(r"\sqrt[3]{2}") == r"\sqrt[3]{2}"


def test_compute_score():
    solution = r"Adding the halves gives $\boxed{\dfrac{1}{2}}$."
    assert compute_score(solution, r"\frac{1}{2}") == 1.0
    assert compute_score(solution, "0.5") == 1.0
    assert compute_score(solution, r"\frac{1}{3}") == 0.0
    assert compute_score("the answer is 1/2", r"\frac{1}{2}") == 0.0


def test_compute_score_reduces_a_full_reference_solution_to_its_box():
    reference = r"Half of 1 is $\boxed{\frac{1}{2}}$."
    assert compute_score(r"\boxed{0.5}", reference) == 1.0
