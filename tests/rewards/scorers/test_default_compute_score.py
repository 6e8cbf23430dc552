import pytest

import verl.rewards.scorers as reward_score
from verl.rewards.scorers import default_compute_score, register_score


def test_dispatch_to_gsm8k_and_math():
    assert default_compute_score("openai/gsm8k", "#### 72", "72") == 1.0
    assert default_compute_score("openai/gsm8k", "The answer is 72", "72") == 0.0
    assert default_compute_score("openai/gsm8k", "The answer is 72", "72", method="flexible") == 1.0
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert default_compute_score(source, r"\boxed{\frac12}", "0.5") == 1.0
    assert isinstance(default_compute_score("openai/gsm8k", "#### 1", "2"), float)


def test_unknown_source_says_what_is_known_and_how_to_plug_in():
    with pytest.raises(ValueError) as info:
        default_compute_score("my/task", "x", "y")
    message = str(info.value)
    assert "'my/task'" in message
    assert "openai/gsm8k" in message and "lighteval/MATH" in message
    assert "custom_reward_function.path" in message


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(reward_score, "_SCORERS", dict(reward_score._SCORERS))


def test_register_new_source_float_and_dict(scratch_registry):
    @register_score("toy/arithmetic")
    def toy(solution_str, ground_truth, extra_info=None, **kwargs):
        return int(solution_str.strip() == str(ground_truth))

    @register_score("toy/with_info")
    def toy_info(solution_str, ground_truth, extra_info=None, **kwargs):
        return {"score": 0.5, "acc": True, "index": extra_info["index"]}

    result = default_compute_score("toy/arithmetic", " 12 ", 12)
    assert result == 1.0 and isinstance(result, float)
    assert default_compute_score("toy/with_info", "", "", extra_info={"index": 3}) == {
        "score": 0.5, "acc": True, "index": 3}
    assert "toy/arithmetic" in reward_score.registered_data_sources()


def test_registering_a_taken_source_needs_override(scratch_registry):
    with pytest.raises(ValueError, match="openai/gsm8k"):
        register_score("openai/gsm8k")(lambda solution_str, ground_truth, **kw: 0.0)
    register_score("openai/gsm8k", override=True)(lambda solution_str, ground_truth, **kw: 0.25)
    assert default_compute_score("openai/gsm8k", "#### 72", "72") == 0.25


def test_dict_without_score_is_rejected(scratch_registry):
    register_score("toy/bad")(lambda solution_str, ground_truth, **kw: {"acc": 1})
    with pytest.raises(ValueError, match="'score'"):
        default_compute_score("toy/bad", "", "")
