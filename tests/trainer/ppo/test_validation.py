"""verl.trainer.ppo.validation: one pass over the validation set, scored through the reward manager by
``compute_reward`` (which checks the reward's shape and extra info), reported per data source."""

import types

import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.validation import validate

CONFIG = types.SimpleNamespace(data=types.SimpleNamespace(reward_fn_key="data_source"),
                               trainer=types.SimpleNamespace(validation_data_dir=None))
DATASET = [{"input_ids": torch.tensor([i, i]), "data_source": source} for i, source in enumerate("aab")]
SCORES = [1.0, 0.0, 0.5]  # one per prompt, on its last response token


class Rollout:
    """Answers each prompt once with two response tokens, keeping its data source and uid."""

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        assert prompts.meta_info == {"validate": True, "global_steps": 7}
        return DataProto.from_single_dict({"responses": torch.zeros(len(prompts), 2, dtype=torch.long),
                                           "data_source": prompts.non_tensor_batch["data_source"],
                                           "uid": prompts.non_tensor_batch["uid"]})


def reward_tensor(data: DataProto) -> torch.Tensor:
    tensor = torch.zeros(len(data), 2)
    tensor[:, -1] = torch.tensor(SCORES)
    return tensor


def test_metrics_per_data_source_from_the_reward_managers_dict():
    def manager(data, return_dict=False):
        return {"reward_tensor": reward_tensor(data), "reward_extra_info": {"acc": [1.0, 0.0, 1.0]}}

    metrics = validate(CONFIG, Rollout(), DATASET, manager, tokenizer=None, global_step=7)
    # a: prompts 0 and 1 (acc 1 and 0, reward 1 and 0); b: prompt 2 (acc 1, reward 0.5); acc is the core variable
    assert metrics == {"val-core/a/acc/mean@1": 0.5, "val-aux/a/reward/mean@1": 0.5,
                       "val-core/b/acc/mean@1": 1.0, "val-aux/b/reward/mean@1": 0.5}


def test_a_reward_function_returning_a_tensor_scores_without_extra_info():
    metrics = validate(CONFIG, Rollout(), DATASET, reward_tensor, tokenizer=None, global_step=7)
    assert metrics == {"val-core/a/reward/mean@1": 0.5, "val-core/b/reward/mean@1": 0.5}


def test_a_reward_of_the_wrong_shape_is_an_error_naming_the_expected_one():
    with pytest.raises(ValueError, match=r"must match data.batch\['responses'\] \(3, 2\)"):
        validate(CONFIG, Rollout(), DATASET, lambda data: torch.zeros(len(data)), tokenizer=None, global_step=7)
