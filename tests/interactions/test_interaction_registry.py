"""The interaction config file (``interaction: - name, class_name, config``) -> one instance per entry."""

import asyncio

import pytest

from verl.interactions import BaseInteraction, initialize_interactions_from_config
from verl.interactions.gsm8k_interaction import Gsm8kInteraction
from verl.interactions.utils.interaction_registry import get_interaction_class

GSM8K = "verl.interactions.gsm8k_interaction.Gsm8kInteraction"


class Tutor(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        return False, self.config["hint"], 0.0, {}


def write(tmp_path, text):
    path = tmp_path / "interactions.yaml"
    path.write_text(text)
    return str(path)


def test_the_originals_example_file_gives_a_gsm8k_interaction_named_gsm8k(tmp_path):
    path = write(tmp_path, f'interaction:\n  - name: "gsm8k"\n    class_name: "{GSM8K}"\n    config: {{}}\n')
    interactions = initialize_interactions_from_config(path)
    assert list(interactions) == ["gsm8k"]
    assert type(interactions["gsm8k"]) is Gsm8kInteraction
    assert interactions["gsm8k"].name == "gsm8k" and interactions["gsm8k"].config == {"name": "gsm8k"}


def test_names_default_to_the_class_name_without_interaction_and_config_reaches_the_class(tmp_path):
    path = write(tmp_path, f"interaction:\n  - class_name: {GSM8K}\n"
                           f"  - class_name: {__name__}.Tutor\n    config: {{hint: 'check the units'}}\n"
                           f"  - name: second_tutor\n    class_name: {__name__}.Tutor\n    config: {{hint: h2}}\n")
    interactions = initialize_interactions_from_config(path)
    assert list(interactions) == ["gsm8k", "tutor", "second_tutor"]  # "Gsm8kInteraction" -> "gsm8k", "Tutor" -> "tutor"
    assert interactions["tutor"].config == {"hint": "check the units", "name": "tutor"}
    reply = asyncio.run(interactions["second_tutor"].generate_response("i", []))
    assert reply == (False, "h2", 0.0, {})


def test_get_interaction_class_imports_by_dotted_path():
    assert get_interaction_class(GSM8K) is Gsm8kInteraction
    with pytest.raises(ValueError, match="cannot import 'verl.interactions.nope.Nope'"):
        get_interaction_class("verl.interactions.nope.Nope")
    with pytest.raises(ValueError, match="is not a subclass of verl.interactions.base.BaseInteraction"):
        get_interaction_class("collections.OrderedDict")


def test_a_base_interaction_without_a_name_is_the_interaction_agent():
    assert Tutor({"hint": "h"}).name == "interaction_agent"


@pytest.mark.parametrize("text, message", [
    (f"interaction:\n  - class_name: {GSM8K}\n  - name: gsm8k\n    class_name: {GSM8K}\n",
     r"interaction\[1\]: a second interaction named 'gsm8k'"),
    ("interaction:\n  - name: x\n", r"interaction\[0\]: needs class_name"),
    ("tools: []\n", "no 'interaction:' list"),
])
def test_file_mistakes_name_the_entry(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        initialize_interactions_from_config(write(tmp_path, text))


def test_a_missing_file_names_the_config_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"multi_turn.interaction_config_path='.*nowhere.yaml': no such file"):
        initialize_interactions_from_config(str(tmp_path / "nowhere.yaml"))
