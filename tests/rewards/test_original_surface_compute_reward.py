"""``verl.trainer.ppo.reward.compute_reward`` (and its Ray task, ``compute_reward_async``) on a DataProto."""

import sys

import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo.reward import compute_reward, compute_reward_async, load_reward_manager
from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY


def two_rows(response_len=3):
    """Two samples of ``response_len`` response tokens; the manager-like functions below read only the mask."""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])[:, :response_len]
    return DataProto.from_dict(tensors={"responses": torch.zeros(2, response_len, dtype=torch.long),
                                        "response_mask": mask},
                               non_tensors={"data_source": ["a", "b"]})


class LengthReward:
    """A reward manager: 0.5 per valid response token, on the last valid token; the length as extra info."""

    def __init__(self):
        self.calls = []

    def __call__(self, data, return_dict=False):
        self.calls.append(return_dict)
        mask = data.batch["response_mask"]
        lengths = mask.sum(-1)
        reward = torch.zeros(mask.shape)
        reward[torch.arange(len(data)), lengths - 1] = 0.5 * lengths.float()
        if return_dict:
            return {"reward_tensor": reward, "reward_extra_info": {"length": lengths.tolist()}}
        return reward


def test_the_tensor_and_extra_info_of_a_manager():
    manager = LengthReward()
    reward, extra = compute_reward(two_rows(), manager)
    # Row 0: 2 valid tokens -> 1.0 on token 1; row 1: 3 valid tokens -> 1.5 on token 2.
    assert torch.equal(reward, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.5]]))
    assert extra == {"length": [2, 3]}
    assert manager.calls == [True]  # called once, with return_dict=True


def test_a_dict_without_extra_info_and_a_function_without_return_dict():
    reward = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]])
    assert compute_reward(two_rows(), lambda data, return_dict=False: {"reward_tensor": reward})[1] == {}

    def plain(data):  # no return_dict: called with the batch alone, its tensor given back with no extra info
        return reward

    out, extra = compute_reward(two_rows(), plain)
    assert out is reward and extra == {}


def test_a_reward_function_that_raises_stops_with_its_own_error_after_one_call():
    calls = []

    def failing(data, return_dict=False):
        calls.append(return_dict)
        raise ZeroDivisionError("the scorer divided by zero")

    with pytest.raises(ZeroDivisionError, match="the scorer divided by zero"):
        compute_reward(two_rows(), failing)
    assert calls == [True]  # not scored a second time (the original retries without return_dict)


@pytest.mark.parametrize("returned, expected", [
    ({"scores": torch.zeros(2, 3)}, r"returned \['scores'\]; a reward manager returns a tensor"),
    ([0.0, 1.0], r"returned list; a reward manager returns a tensor"),
    ({"reward_tensor": torch.zeros(2, 4)}, r"shape \(2, 4\); it must match data.batch\['responses'\] \(2, 3\)"),
    ({"reward_tensor": torch.zeros(2, 3), "reward_extra_info": {"acc": [1.0]}},
     r"reward_extra_info\['acc'\] .* must hold one value per sample \(2\), got \[1.0\]"),
])
def test_a_malformed_result_names_what_is_wrong(returned, expected):
    with pytest.raises((TypeError, ValueError), match=expected):
        compute_reward(two_rows(), lambda data, return_dict=False: returned)


USER_FILE = """
import torch

from verl.workers.reward_manager import register


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0


@register("surface_async_test")
class CountReward:
    def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", **kwargs):
        self.per_token = kwargs["per_token"]

    def __call__(self, data, return_dict=False):
        mask = data.batch["response_mask"]
        return (mask * self.per_token).float()
"""


@pytest.fixture
def user_manager(tmp_path):
    path = tmp_path / "count_reward.py"
    path.write_text(USER_FILE)
    config = OmegaConf.create({"custom_reward_function": {"path": str(path)},
                               "reward_model": {"reward_manager": "surface_async_test"}})
    yield load_reward_manager(config, None, num_examine=0, per_token=2.0)
    REWARD_MANAGER_REGISTRY.pop("surface_async_test", None)
    for name in [n for n, m in sys.modules.items() if getattr(m, "__file__", None) == str(path)]:
        del sys.modules[name]


def test_compute_reward_async_runs_in_a_ray_task(ray_session, user_manager):
    reward, extra = ray_session.get(compute_reward_async.remote(two_rows(), reward_fn=LengthReward()))
    assert torch.equal(reward, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.5]]))
    assert extra == {"length": [2, 3]}
    # A manager class from a custom reward file reaches the task's process, which cannot import that file.
    reward, extra = ray_session.get(compute_reward_async.remote(two_rows(), reward_fn=user_manager))
    assert torch.equal(reward, torch.tensor([[2.0, 2.0, 0.0], [2.0, 2.0, 2.0]])) and extra == {}
    with pytest.raises(Exception, match="needs reward_fn"):
        ray_session.get(compute_reward_async.remote(two_rows()))
