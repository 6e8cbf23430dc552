"""The original's reward-manager surface: ``verl.workers.reward_manager``'s registry and a user's own manager,
registered with ``@register`` in the custom reward file and picked by ``reward_model.reward_manager``."""

import sys

import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.rewards import managers
from verl.trainer.config import checks
from verl.trainer.ppo.reward import compute_reward, load_reward_manager
from verl.workers.reward_manager import (
    REWARD_MANAGER_REGISTRY,
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    PrimeRewardManager,
    get_reward_manager_cls,
    register,
)
from verl.workers.reward_manager.abstract import AbstractRewardManager

USER_MANAGER = "exact_match_surface_test"

# A user's file, as the original's docs describe a manager: AbstractRewardManager's constructor and __call__,
# registered under a name; it lives next to the compute_score it is handed.
USER_FILE = f'''
import torch

from verl.workers.reward_manager import register
from verl.workers.reward_manager.abstract import AbstractRewardManager


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {{"score": float(solution_str.strip() == ground_truth), "length": len(solution_str)}}


@register("{USER_MANAGER}")
class ExactMatchRewardManager(AbstractRewardManager):
    def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", **kwargs):
        self.tokenizer, self.compute_score, self.reward_fn_key = tokenizer, compute_score, reward_fn_key
        self.bonus = kwargs.get("bonus", 0.0)

    def __call__(self, data, return_dict=False):
        prompt_len = data.batch["prompts"].shape[-1]
        reward = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        lengths = []
        for i in range(len(data)):
            valid = int(data.batch["attention_mask"][i, prompt_len:].sum())
            text = self.tokenizer.decode(data.batch["responses"][i, :valid].tolist(), skip_special_tokens=True)
            result = self.compute_score(data_source=data.non_tensor_batch[self.reward_fn_key][i], solution_str=text,
                                        ground_truth=data.non_tensor_batch["reward_model"][i]["ground_truth"])
            reward[i, valid - 1] = result["score"] + self.bonus
            lengths.append(result["length"])
        if return_dict:
            return {{"reward_tensor": reward, "reward_extra_info": {{"length": lengths}}}}
        return reward
'''


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user_reward") / "my_reward.py"
    path.write_text(USER_FILE)
    yield str(path)
    # The registry and the imported file are per process: leave neither behind for other test modules.
    REWARD_MANAGER_REGISTRY.pop(USER_MANAGER, None)
    for name in [n for n, m in sys.modules.items() if getattr(m, "__file__", None) == str(path)]:
        del sys.modules[name]


def make_config(user_file, manager=USER_MANAGER):
    return OmegaConf.create({"custom_reward_function": {"path": user_file, "name": "compute_score"},
                             "reward_model": {"reward_manager": manager},
                             "data": {"reward_fn_key": "data_source"}})


def make_batch(tokenizer, prompts, responses, ground_truths, prompt_len=12, response_len=8):
    """Left-padded prompts and right-padded responses, as the rollout gives them."""
    pad = tokenizer.pad_token_id
    rows_p, rows_r, masks = [], [], []
    for prompt, response in zip(prompts, responses):
        p, r = tokenizer.encode(prompt, add_special_tokens=False), tokenizer.encode(response, add_special_tokens=False)
        rows_p.append([pad] * (prompt_len - len(p)) + p)
        rows_r.append(r + [pad] * (response_len - len(r)))
        masks.append([0] * (prompt_len - len(p)) + [1] * (len(p) + len(r)) + [0] * (response_len - len(r)))
    return DataProto.from_dict(
        tensors={"prompts": torch.tensor(rows_p), "responses": torch.tensor(rows_r),
                 "attention_mask": torch.tensor(masks)},
        non_tensors={"data_source": ["toy"] * len(prompts),
                     "reward_model": [{"style": "rule", "ground_truth": gt} for gt in ground_truths]})


def test_the_registry_holds_our_managers_under_the_original_names():
    assert REWARD_MANAGER_REGISTRY is managers.REWARD_MANAGER_REGISTRY
    expected = {"naive": NaiveRewardManager, "batch": BatchRewardManager, "dapo": DAPORewardManager,
                "prime": PrimeRewardManager}
    for name, cls in expected.items():
        assert REWARD_MANAGER_REGISTRY[name] is cls and get_reward_manager_cls(name) is cls
        assert issubclass(cls, AbstractRewardManager)


def test_unknown_and_case_mismatched_names_are_the_original_value_error():
    with pytest.raises(ValueError, match=r"^Unknown reward manager: unknown_manager\. Registered: batch, dapo, "
                                         r"naive, prime.*reward_model\.reward_manager"):
        get_reward_manager_cls("unknown_manager")
    with pytest.raises(ValueError, match=r"Unknown reward manager: Naive\..*Did you mean 'naive'\?"):
        get_reward_manager_cls("Naive")


def test_a_name_takes_one_class():
    class First:
        pass

    class Second:
        pass

    try:
        assert register("surface_dup_test")(First) is First  # the decorator hands the class back
        assert register("surface_dup_test")(First) is First  # the same class again (a reload) is fine
        with pytest.raises(ValueError, match=r"Reward manager surface_dup_test has already been registered: "
                                             r".*First vs .*Second"):
            register("surface_dup_test")(Second)
        assert REWARD_MANAGER_REGISTRY["surface_dup_test"] is First  # the first one stays
    finally:
        REWARD_MANAGER_REGISTRY.pop("surface_dup_test", None)


def test_a_user_manager_registered_in_the_custom_file_is_picked_by_config(user_file, tiny_tokenizer):
    data = make_batch(tiny_tokenizer, ["What is 8*9?", "What is 8*9?"], ["72", "seventy"], ["72", "72"])
    manager = load_reward_manager(make_config(user_file), tiny_tokenizer, num_examine=0, bonus=0.5)
    assert type(manager).__name__ == "ExactMatchRewardManager"
    assert get_reward_manager_cls(USER_MANAGER) is type(manager)

    reward, extra = compute_reward(data, manager)
    # "72" matches (1 + bonus 0.5), "seventy" does not (0 + 0.5); each on the row's last response token.
    last = [len(tiny_tokenizer.encode(r, add_special_tokens=False)) - 1 for r in ("72", "seventy")]
    expected = torch.zeros(2, 8)
    expected[0, last[0]], expected[1, last[1]] = 1.5, 0.5
    assert torch.equal(reward, expected)
    assert extra == {"length": [2, 7]}

    # Loading it again (the trainer builds a training and a validation manager) imports the file once.
    again = load_reward_manager(make_config(user_file), tiny_tokenizer, num_examine=1)
    assert type(again) is type(manager)


def test_config_validation_finds_a_manager_the_custom_file_registers(user_file):
    def issues(manager, path):
        run = checks.Run(cfg={"reward_model": {"reward_manager": manager},
                              "custom_reward_function": {"path": path}}, defaults={})
        return [str(issue) for issue in checks.check_registered_names(run)]

    assert issues(USER_MANAGER, user_file) == []
    assert issues("naive", None) == []
    [message] = issues("not_in_the_file", user_file)
    assert "reward_model.reward_manager" in message and "'not_in_the_file' is not a known reward manager" in message


def test_an_edited_custom_file_registers_its_new_version(tmp_path):
    """A long-lived session: the custom reward file registers a manager, is edited, and is loaded again. The new
    version is imported anew and replaces its own earlier definition (same class, same file) instead of failing
    as a duplicate; another class under a taken name still fails."""
    from verl.rewards.loading import find_reward_manager_cls

    path = tmp_path / "my_reward.py"
    source = ("from verl.workers.reward_manager import register\n"
              "from verl.rewards.managers.naive import NaiveRewardManager\n\n"
              "@register('edited_surface_manager')\nclass Mine(NaiveRewardManager):\n    VERSION = {}\n")
    try:
        path.write_text(source.format(1))
        assert find_reward_manager_cls("edited_surface_manager", str(path)).VERSION == 1
        path.write_text(source.format(2))
        from verl.rewards.loading import _load_module

        _load_module(str(path))
        assert find_reward_manager_cls("edited_surface_manager", str(path)).VERSION == 2
        path.write_text(source.replace("class Mine", "class Other").format(3))
        with pytest.raises(ImportError, match="edited_surface_manager has already been registered"):
            _load_module(str(path))
    finally:
        from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY

        REWARD_MANAGER_REGISTRY.pop("edited_surface_manager", None)
