import functools
import os

import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.rewards.loading import get_custom_reward_fn, load_reward_manager
from verl.rewards.managers import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
)
from verl.rewards.scorers import default_compute_score

GOOD = '''
from math import sqrt


def helper(x):
    return x


def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str == ground_truth) + bonus


def my_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
    return -1.0


def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
    return [1.0] * len(solution_strs)


def wrong_args(solution, answer):
    return 0.0
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(GOOD)
    return str(path)


def make_config(**overrides):
    base = {"custom_reward_function": {"path": None, "name": "compute_score"},
            "reward_model": {"reward_manager": "naive"},
            "data": {"reward_fn_key": "data_source", "max_response_length": 8}}
    config = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides))
    OmegaConf.set_struct(config, True)
    return config


def test_no_path_means_no_custom_function():
    assert get_custom_reward_fn(make_config()) is None
    assert get_custom_reward_fn(OmegaConf.create({})) is None


def test_loads_the_named_function(reward_file):
    fn = get_custom_reward_fn(make_config(custom_reward_function={"path": reward_file}))
    assert fn.__name__ == "compute_score"
    assert fn(data_source="d", solution_str="a", ground_truth="a", extra_info=None) == 1.0
    config = make_config(custom_reward_function={"path": reward_file, "name": "my_score"})
    other = get_custom_reward_fn(config)
    assert other("d", "a", "b", None) == -1.0


def test_reward_kwargs_are_bound(reward_file):
    config = make_config(custom_reward_function={"path": reward_file, "reward_kwargs": {"bonus": 0.5}})
    fn = get_custom_reward_fn(config)
    assert isinstance(fn, functools.partial) and fn.keywords == {"bonus": 0.5}
    assert fn(data_source="d", solution_str="a", ground_truth="a", extra_info=None) == 1.5


def test_reward_kwargs_without_a_file_go_to_the_rule_rewards():
    config = make_config(custom_reward_function={"reward_kwargs": {"normalize": True}})
    fn = get_custom_reward_fn(config)
    # "72.00" scores 0 with the original's exact comparison, 1 normalised.
    assert default_compute_score("openai/gsm8k", "#### 72.00", "72") == 0.0
    assert fn(data_source="openai/gsm8k", solution_str="#### 72.00", ground_truth="72", extra_info=None) == 1.0
    assert fn(data_source="lighteval/MATH", solution_str=r"\boxed{0.25}", ground_truth=r"\frac{1}{4}",
              extra_info=None) == 1.0
    config = make_config(custom_reward_function={"reward_kwargs": {"normalize": True}},
                         reward_model={"reward_manager": "batch"})
    with pytest.raises(ValueError, match="reward_kwargs without custom_reward_function.path go to the rule rewards"):
        get_custom_reward_fn(config)


def test_missing_file_names_the_key_and_absolute_path(tmp_path):
    missing = tmp_path / "nowhere.py"
    with pytest.raises(FileNotFoundError) as info:
        get_custom_reward_fn(make_config(custom_reward_function={"path": str(missing)}))
    assert "custom_reward_function.path" in str(info.value) and os.path.abspath(missing) in str(info.value)


def test_import_failure_keeps_the_cause(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('bad import')\n")
    with pytest.raises(ImportError, match="broken.py") as info:
        get_custom_reward_fn(make_config(custom_reward_function={"path": str(broken)}))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_missing_function_lists_the_ones_defined(reward_file):
    with pytest.raises(AttributeError) as info:
        get_custom_reward_fn(make_config(custom_reward_function={"path": reward_file, "name": "score_it"}))
    message = str(info.value)
    assert "'score_it'" in message
    assert "['batch_score', 'compute_score', 'helper', 'my_score', 'wrong_args']" in message
    assert "sqrt" not in message  # imported names are not listed


def test_bad_signature_shows_actual_and_expected(reward_file):
    with pytest.raises(TypeError) as info:
        get_custom_reward_fn(make_config(custom_reward_function={"path": reward_file,
                                                                 "name": "wrong_args"}))
    message = str(info.value)
    assert "wrong_args(solution, answer)" in message
    assert "data_source, solution_str, ground_truth, extra_info" in message


def test_reward_kwargs_the_function_does_not_take_are_a_signature_error(reward_file):
    config = make_config(custom_reward_function={"path": reward_file, "reward_kwargs": {"temperature": 1}})
    with pytest.raises(TypeError, match="temperature"):
        get_custom_reward_fn(config)


def test_batch_manager_expects_the_list_signature(reward_file):
    config = make_config(custom_reward_function={"path": reward_file, "name": "batch_score"},
                         reward_model={"reward_manager": "batch"})
    assert get_custom_reward_fn(config).__name__ == "batch_score"
    with pytest.raises(TypeError, match="data_sources, solution_strs"):
        get_custom_reward_fn(make_config(custom_reward_function={"path": reward_file},
                                         reward_model={"reward_manager": "batch"}))


def test_load_reward_manager_defaults_to_naive_with_rule_rewards(tiny_tokenizer):
    manager = load_reward_manager(OmegaConf.create({}), tiny_tokenizer, num_examine=1)
    assert type(manager) is NaiveRewardManager
    assert manager.compute_score is default_compute_score
    assert manager.reward_fn_key == "data_source" and manager.num_examine == 1


def test_load_reward_manager_uses_custom_function_and_reward_fn_key(reward_file, tiny_tokenizer):
    config = make_config(custom_reward_function={"path": reward_file}, data={"reward_fn_key": "task"})
    manager = load_reward_manager(config, tiny_tokenizer, 0)
    assert manager.compute_score.__name__ == "compute_score" and manager.reward_fn_key == "task"

    token = tiny_tokenizer.encode("x", add_special_tokens=False)
    data = DataProto.from_dict(
        tensors={"prompts": torch.tensor([token]), "responses": torch.tensor([token + token]),
                 "attention_mask": torch.tensor([[1, 1, 1]])},
        non_tensors={"task": ["toy"], "reward_model": [{"ground_truth": "xx"}]})
    assert manager(data).tolist() == [[0.0, 1.0]]


def test_load_dapo_manager_reads_overlong_buffer(tiny_tokenizer):
    config = make_config(reward_model={"reward_manager": "dapo",
                                       "overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 0.5,
                                                           "log": False}})
    manager = load_reward_manager(config, tiny_tokenizer, 0)
    assert isinstance(manager, DAPORewardManager)
    assert (manager.max_resp_len, manager.buffer_len, manager.penalty_factor) == (8, 4, 0.5)


def test_load_batch_manager_and_unknown_manager(reward_file, tiny_tokenizer):
    config = make_config(custom_reward_function={"path": reward_file, "name": "batch_score"},
                         reward_model={"reward_manager": "batch"})
    assert isinstance(load_reward_manager(config, tiny_tokenizer, 0), BatchRewardManager)
    with pytest.raises(ValueError, match=r"Unknown reward manager: remote\. Registered: "):
        load_reward_manager(make_config(reward_model={"reward_manager": "remote"}), tiny_tokenizer, 0)
