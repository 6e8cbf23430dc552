"""The original verl's import paths still work after the move, and give the very same modules."""

import importlib

import pytest

import verl

OLD_AND_NEW = [
    ("verl.trainer.ppo.core_algos", "verl.algorithms"),
    ("verl.trainer.ppo.core_algos.advantage", "verl.algorithms.advantage"),
    ("verl.trainer.ppo.reward", "verl.rewards.loading"),
    ("verl.trainer.ppo.rollout_corr_helper", "verl.algorithms.rollout_correction"),
    ("verl.utils.reward_score", "verl.rewards.scorers"),
    ("verl.utils.reward_score.gsm8k", "verl.rewards.scorers.gsm8k"),
    ("verl.utils.reward_score.prime_math.grader", "verl.rewards.scorers.prime_math.grader"),
    ("verl.utils.dataset", "verl.data"),
    ("verl.utils.dataset.rl_dataset", "verl.data.rl_dataset"),
    ("verl.workers.reward_manager", "verl.rewards.managers"),
    ("verl.workers.reward_manager.naive", "verl.rewards.managers.naive"),
    ("verl.single_controller.base", "verl.single_controller"),
    ("verl.single_controller.base.decorator", "verl.single_controller.decorator"),
    ("verl.single_controller.base.worker_group", "verl.single_controller.worker_group"),
    ("verl.single_controller.ray.base", "verl.single_controller.ray"),
]


@pytest.mark.parametrize("old,new", OLD_AND_NEW)
def test_an_old_path_is_the_same_module_as_its_new_one(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_a_module_imported_through_an_old_path_keeps_its_own_spec():
    import importlib.resources

    importlib.import_module("verl.utils.reward_score.math_reward")
    module = importlib.import_module("verl.rewards.scorers.math_reward")
    assert module.__spec__.name == "verl.rewards.scorers.math_reward" and module.__spec__.origin.endswith(".py")
    assert importlib.reload(module) is module
    assert any(p.name == "gsm8k.py" for p in importlib.resources.files("verl.utils.reward_score").iterdir())


def test_every_moved_package_is_listed():
    assert {old for old, _ in OLD_AND_NEW if old in verl.MOVED} == set(verl.MOVED)


def test_a_registration_through_an_old_path_reaches_the_new_registry():
    from verl.trainer.ppo.core_algos import register_adv_est

    from verl.algorithms import ADV_ESTIMATOR_REGISTRY

    @register_adv_est("test_moved_paths_estimator")
    def estimator(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    try:
        assert ADV_ESTIMATOR_REGISTRY["test_moved_paths_estimator"] is estimator
    finally:
        del ADV_ESTIMATOR_REGISTRY["test_moved_paths_estimator"]


def test_a_missing_module_under_an_old_path_is_a_normal_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("verl.utils.reward_score.no_such_scorer")
