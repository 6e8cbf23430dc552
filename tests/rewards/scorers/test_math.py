import pytest

"""MATH scoring worked by hand: the default is the original verl's (Hendrycks' string clean-up),
``normalize=True`` this project's canonical numbers."""

from verl.rewards.scorers.math_reward import (
    compute_score,
    find_boxed,
    is_equiv,
    last_boxed_only_string,
    normalize_answer,
    remove_boxed,
    strip_string,
    unbox,
)


def test_last_boxed_with_nested_braces():
    text = r"first \boxed{\frac{1}{2}} then \boxed{\frac{\sqrt{3}}{2}} done"
    assert last_boxed_only_string(text) == r"\boxed{\frac{\sqrt{3}}{2}}"
    assert remove_boxed(last_boxed_only_string(text)) == r"\frac{\sqrt{3}}{2}"


def test_boxed_space_form_and_fbox():
    assert last_boxed_only_string(r"so $\boxed 5$ ok") == r"\boxed 5"
    assert remove_boxed(r"\boxed 5") == "5"
    assert last_boxed_only_string(r"\fbox{7}") == r"\fbox{7}"
    with pytest.raises(ValueError, match="boxed"):  # the original cannot unbox an \fbox: its score is 0
        remove_boxed(r"\fbox{7}")
    assert compute_score(r"\fbox{7}", "7") == 0.0
    assert last_boxed_only_string(r"\boxed {5}") == r"\boxed {5}"  # "\boxed " form: the rest up to "$"
    # normalised: \fbox and "\boxed {5}" read as boxes
    assert unbox(find_boxed(r"\fbox{7}")) == "7" and find_boxed(r"\boxed {5}") == r"\boxed{5}"
    assert compute_score(r"\fbox{7}", "7", normalize=True) == 1.0


def test_missing_or_unbalanced_box():
    assert last_boxed_only_string("the answer is 5") is None
    assert last_boxed_only_string(r"\boxed{1 + {2}") is None
    assert find_boxed(r"\boxed{1 + {2}") is None
    with pytest.raises(ValueError, match="boxed"):
        remove_boxed("5")


@pytest.mark.parametrize("a, b", [
    (r"\frac12", r"\frac{1}{2}"),
    ("0.5", r"\frac{1}{2}"),
    (r"\dfrac{1}{2}", "1/2"),
    (r"5\text{ cm}", "5"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"90^\circ", "90"),
    (r"\$10", "10"),
    (r"50\%", "50"),
    ("x = 5", "5"),
    (".5", r"\frac{1}{2}"),
    (r"\sqrt2", r"\sqrt{2}"),
    (r"\frac1{72}", r"\frac{1}{72}"),
])
def test_the_originals_clean_up(a, b):
    assert is_equiv(a, b)


@pytest.mark.parametrize("a, b", [
    ("0.25", r"\frac{1}{4}"),  # only exactly 0.5 is rewritten as a fraction
    ("1,000", "1000"),
    ("2.0", "2"),
    ("50%", "50"),  # only "\%" is removed
    (r"3\mbox{ m}^2", "3"),
    (r"\theta = \frac{\pi}{4}", r"\frac\pi4"),  # the left side is longer than two characters
    ("5.", "5"),
])
def test_spellings_the_original_scores_as_different(a, b):
    assert not is_equiv(a, b)
    assert is_equiv(a, b, normalize=True)


def test_when_the_clean_up_fails_the_raw_strings_are_compared():
    with pytest.raises(IndexError):
        strip_string(r"2\sqrt")  # a \sqrt with nothing after it
    assert is_equiv(r"2\sqrt", r"2\sqrt") and not is_equiv(r"2\sqrt", r"2 \sqrt")  # compared as written
    assert strip_string(r"\sqrt3") == r"\sqrt{3}" and strip_string("k = 7") == "7"


def test_a_slash_b_with_a_non_integer_side_stays_as_written():
    assert strip_string("x / 2") == "x/2" and strip_string("3/4") == r"\frac{3}{4}"
    assert compute_score(r"\boxed{x / 2}", "x/2") == 1.0
    assert compute_score(r"\boxed{\left(\pi/2\right)}", r"(\pi/2)") == 1.0

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
def test_normalized_equivalent_spellings(a, b):
    assert is_equiv(a, b, normalize=True)


@pytest.mark.parametrize("a, b", [
    (r"\frac{2}{4}", r"\frac{1}{2}"),  # no algebra: unreduced fractions differ
    ("x + y = 5", "5"),  # the left side is not a single symbol, so it stays
    ("2", "3"),
])
def test_different_answers(a, b):
    assert not is_equiv(a, b) and not is_equiv(a, b, normalize=True)


def test_the_originals_quirks_are_kept():
    assert is_equiv(r"\leftarrow", "arrow")  # the original removes "\left" inside "\leftarrow"
    assert not is_equiv(r"\leftarrow", "arrow", normalize=True)  # normalised: only the whole command


def test_missing_answer_is_never_equivalent():
    assert not is_equiv(None, "5")
    assert not is_equiv(None, None)


def test_normalize_answer_canonical_forms():
    assert normalize_answer(r"\frac{-1}{2}") == r"-\frac{1}{2}"
    assert normalize_answer("0.25") == r"\frac{1}{4}"
    assert normalize_answer(r"\sqrt[3]{2}") == r"\sqrt[3]{2}"


def test_compute_score():
    solution = r"Adding the halves gives $\boxed{\dfrac{1}{2}}$."
    assert compute_score(solution, r"\frac{1}{2}") == 1.0
    assert compute_score(solution, "0.5") == 1.0
    assert compute_score(solution, r"\frac{1}{3}") == 0.0
    assert compute_score("the answer is 1/2", r"\frac{1}{2}") == 0.0
    assert compute_score(r"\boxed{0.25}", r"\frac{1}{4}") == 0.0
    assert compute_score(r"\boxed{0.25}", r"\frac{1}{4}", normalize=True) == 1.0


def test_normalized_compute_score_reduces_a_full_reference_solution_to_its_box():
    reference = r"Half of 1 is $\boxed{\frac{1}{2}}$."
    assert compute_score(r"\boxed{0.5}", reference, normalize=True) == 1.0
    assert compute_score(r"\boxed{0.5}", reference) == 0.0
