"""Gsm8kInteraction grades as the GSM8K reward's strict method: only a final ``#### <number>`` counts."""

import asyncio

import pytest

from verl.interactions.gsm8k_interaction import CORRECT, RETRY, Gsm8kInteraction


def turn(user, instance, *assistant_texts):
    messages = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. Total?"}]
    messages += [{"role": "assistant", "content": text} for text in assistant_texts]
    return asyncio.run(user.generate_response(instance, messages))


@pytest.fixture
def user_and_instance():
    user = Gsm8kInteraction({"name": "gsm8k"})
    return user, asyncio.run(user.start_interaction("episode-1", ground_truth="72"))


def test_the_originals_replies():
    assert CORRECT == "Your response is correct!"
    assert RETRY == "Your response is incorrect! You need to reflect on your answer and try again."


@pytest.mark.parametrize("answer, expected", [
    ("48 + 24 = 72\n#### 72", (True, CORRECT, 1.0, {})),
    ("The answer is 72", (False, RETRY, 0.0, {})),              # no "#### ": strict finds no answer
    ("####72", (False, RETRY, 0.0, {})),                        # strict needs the space after ####
    ("#### 1,000 ... no wait, #### 72", (True, CORRECT, 1.0, {})),  # the last marker counts
    ("#### 72 first, then #### 71", (False, RETRY, 0.0, {})),
    ("#### 7,2", (True, CORRECT, 1.0, {})),                     # strict drops commas: "72"
])
def test_strict_grading_of_the_last_assistant_turn(user_and_instance, answer, expected):
    user, instance = user_and_instance
    assert turn(user, instance, answer) == expected


def test_only_the_last_assistant_message_is_graded_and_the_score_kept(user_and_instance):
    user, instance = user_and_instance
    assert turn(user, instance, "#### 72", "on reflection #### 70") == (False, RETRY, 0.0, {})
    assert asyncio.run(user.calculate_score(instance)) == 0.0
    assert turn(user, instance, "#### 70", "#### 72")[0] is True
    assert asyncio.run(user.calculate_score(instance)) == 1.0
    asyncio.run(user.finalize_interaction(instance))
    assert asyncio.run(user.calculate_score(instance)) == 0.0  # state released


def test_ground_truth_is_compared_as_text_and_is_required():
    user = Gsm8kInteraction({})
    instance = asyncio.run(user.start_interaction(ground_truth=18))  # a number in the parquet: "18"
    assert turn(user, instance, "#### 18") == (True, CORRECT, 1.0, {})
    with pytest.raises(ValueError, match=r"needs extra_info\['interaction_kwargs'\]\['ground_truth'\]"):
        asyncio.run(user.start_interaction())


def test_retry_message_from_the_config_replaces_the_reply_to_a_wrong_answer():
    user = Gsm8kInteraction({"retry_message": "Wrong. Try again."})
    instance = asyncio.run(user.start_interaction(ground_truth="3"))
    assert turn(user, instance, "#### 4") == (False, "Wrong. Try again.", 0.0, {})
