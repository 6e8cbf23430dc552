"""DAPO's math reward and the search-style exact match, worked by hand, and their data sources."""

import pytest

from verl.rewards.scorers import default_compute_score, find_scorer
from verl.rewards.scorers.math_dapo import compute_score as dapo_score
from verl.rewards.scorers.math_dapo import normalize_final_answer
from verl.rewards.scorers.search_qa import compute_score as em_score
from verl.rewards.scorers.search_qa import normalize_answer


@pytest.mark.parametrize("raw, normalized", [
    ("$1,000$", "1000"),               # the content of $...$, thousands separator dropped
    ("x = 5", "5"),                    # the part after the last "="
    (r"\text{5 cm}", "5"),             # the unit word goes, then \text{} is unwrapped
    (r"\boxed{42}", "42"),
    (r"\frac12", r"\frac{1}{2}"),
    (r"\sqrt2", r"\sqrt{2}"),
    ("12 dollars", "12"),
    (r"90^\circ", "90"),
    ("an apple", "apple"),             # "an " and spaces removed
])
def test_minerva_normalization_by_hand(raw, normalized):
    assert normalize_final_answer(raw) == normalized


def test_dapo_score_reads_the_last_answer_line():
    right = "Let me think. 6 * 7 = 42.\nAnswer: 42"
    assert dapo_score(right, "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert dapo_score("Answer: 41\nwait\nAnswer: $1,000$", "1000")["acc"]  # the last one, normalised
    wrong = dapo_score("Answer: 41", "42")
    assert wrong == {"score": -1.0, "acc": False, "pred": "41"}
    missing = dapo_score("the result is 42", "42")  # no "Answer:" line
    assert missing["score"] == -1.0 and missing["pred"] == "[INVALID]"
    assert dapo_score("answer : 42", "42")["acc"]  # case-insensitive, spaces around ":"
    assert not dapo_score("Answer: 42\n" + "x" * 300, "42")["acc"]


def test_dapo_boxed_fallback_is_an_option():
    assert dapo_score(r"so it is \boxed{1,000}", "1000") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    fallback = dict(boxed_fallback=True)
    assert dapo_score(r"so it is \boxed{1,000}", "1000", **fallback) == {"score": 1.0, "acc": True, "pred": "1000"}
    assert dapo_score(r"\boxed{42}" + "." * 120, "42", **fallback)["pred"] == "[INVALID]"  # not in the last 100
    assert not dapo_score("Answer: 41\n" + r"\boxed{42}", "42", **fallback)["acc"]  # an Answer: line wins


def test_dapo_strict_box_compares_the_last_box_as_written():
    assert dapo_score(r"so \boxed{42}", "42", strict_box_verify=True)["acc"]
    assert not dapo_score(r"so \boxed{42.0}", "42", strict_box_verify=True)["acc"]
    assert dapo_score(r"\boxed{42}" + "." * 120, "42", strict_box_verify=True)["pred"] is None  # last 100 only


def test_exact_match_by_hand():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    truth = {"target": ["Eiffel Tower", "La tour Eiffel"]}
    assert em_score("<answer> the eiffel tower. </answer>", truth) == 1.0
    assert em_score("<answer>Paris</answer> ... <answer>La Tour Eiffel</answer>", truth) == 1.0  # the last one
    assert em_score("<answer>Paris</answer>", truth, format_score=0.1) == 0.1
    assert em_score("Eiffel Tower", truth) == 0.0  # no tags: no answer
    assert em_score("<answer>Paris</answer>", "paris") == 1.0  # a plain string target
    spam = "<answer>x</answer>" * 11 + "<answer>Eiffel Tower</answer>"
    assert em_score(spam, truth) == 0.25  # right, but among more than 10 answer tags


def test_data_sources_dispatch_as_the_original_names_them():
    for source in ("math_dapo", "math", "math_dapo_reasoning", "aime2024", "aime_2025"):
        assert default_compute_score(source, "Answer: 7", "7")["acc"]
    assert default_compute_score("searchR1_nq", "<answer>x</answer>", {"target": ["x"]}) == 1.0
    # the six numina names exactly (not a numina_* prefix, as the original lists them)
    assert find_scorer("numina_olympiads") is not None and find_scorer("numina_other") is None
    assert find_scorer("aim") is None
    with pytest.raises(ValueError, match="No rule reward is registered for data_source='searchR2'"):
        default_compute_score("searchR2", "x", "x")


def test_geometry3k_is_accuracy_and_format_by_hand():
    pytest.importorskip("mathruler")  # in the test extras; the scorer names the package when it is missing
    think = "<think>the angles sum to 180</think> "
    assert default_compute_score("hiyouga/geometry3k", think + r"so \boxed{2\sqrt{3}}", r"2\sqrt{3}") == 1.0
    # right but unformatted: 0.9; sympy sees 0.5 = 1/2
    assert default_compute_score("hiyouga/geometry3k", r"so \boxed{0.5}", r"\frac{1}{2}") == pytest.approx(0.9)
    assert default_compute_score("hiyouga/geometry3k", think + r"\boxed{7}", "8") == pytest.approx(0.1)  # format only
    assert default_compute_score("hiyouga/geometry3k", "8", "8", use_boxed=False, format_score=0.0) == 1.0
