"""The original's ``reward:`` section: each key set away from its default sets the ``reward_model.*`` or
``custom_reward_function.*`` key the code reads, once, when the config is composed; both set to different values is
an error naming both; keys nothing reads here are named in a warning; issues name the keys as the user wrote them."""

import logging

import pytest
from omegaconf import OmegaConf

from verl.base_config import at
from verl.trainer.config.compose import compose_config, compose_ppo_config
from verl.trainer.config.reward_section import reward_keys
from verl.trainer.config.spec import resolve_run
from verl.trainer.config_validation import ConfigError, validate_config

SEED = ["data.train_files=data/train.parquet", "data.val_files=data/test.parquet",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.actor.use_dynamic_bsz=true"]

# (the original's override, the key read here, the value it must hold), each worked out from the two layouts.
BY_HAND = [
    ("reward.num_workers=2", "reward_model.num_workers", 2),
    ("reward.custom_reward_function.path=my_reward.py", "custom_reward_function.path", "my_reward.py"),
    ("reward.custom_reward_function.name=my_score", "custom_reward_function.name", "my_score"),
    ("+reward.custom_reward_function.reward_kwargs.normalize=true", "custom_reward_function.reward_kwargs",
     {"normalize": True}),
    ("reward.reward_manager.name=dapo", "reward_model.reward_manager", "dapo"),
    ("reward.reward_model.enable=true", "reward_model.enable", True),
    ("reward.reward_model.enable_resource_pool=true", "reward_model.enable_resource_pool", True),
    ("reward.reward_model.n_gpus_per_node=4", "reward_model.n_gpus_per_node", 4),
    ("reward.reward_model.nnodes=2", "reward_model.nnodes", 2),
    ("reward.reward_model.model_path=models/rm", "reward_model.model.path", "models/rm"),
    ("reward.reward_model.rollout.name=hf", "reward_model.rollout.name", "hf"),
    ("reward.reward_model.rollout.gpu_memory_utilization=0.3", "reward_model.rollout.gpu_memory_utilization", 0.3),
    ("reward.reward_model.rollout.tensor_model_parallel_size=1", "reward_model.rollout.tensor_model_parallel_size", 1),
    ("reward.reward_model.rollout.prompt_length=1024", "reward_model.rollout.prompt_length", 1024),
    ("reward.reward_model.rollout.response_length=512", "reward_model.rollout.response_length", 512),
    ("reward.reward_model.rollout.max_num_seqs=64", "reward_model.rollout.max_num_seqs", 64),
    ("reward.reward_model.rollout.max_model_len=4096", "reward_model.rollout.max_model_len", 4096),
    ("reward.reward_model.rollout.free_cache_engine=false", "reward_model.rollout.free_cache_engine", False),
    ("reward.reward_model.rollout.enforce_eager=false", "reward_model.rollout.enforce_eager", False),
    ("reward.reward_model.rollout.disable_log_stats=false", "reward_model.rollout.disable_log_stats", False),
    ("reward.sandbox_fusion.url=http://sandbox:8080", "reward_model.sandbox_fusion.url", "http://sandbox:8080"),
    ("reward.sandbox_fusion.max_concurrent=8", "reward_model.sandbox_fusion.max_concurrent", 8),
    ("reward.sandbox_fusion.memory_limit_mb=512", "reward_model.sandbox_fusion.memory_limit_mb", 512),
    ("+reward.reward_kwargs.overlong_buffer_cfg.enable=true", "reward_model.overlong_buffer.enable", True),
    ("+reward.reward_kwargs.overlong_buffer_cfg.len=128", "reward_model.overlong_buffer.len", 128),
    ("+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.5", "reward_model.overlong_buffer.penalty_factor",
     1.5),
    ("+reward.reward_kwargs.overlong_buffer_cfg.log=true", "reward_model.overlong_buffer.log", True),
]


def _key(override: str) -> str:
    return override.lstrip("+").partition("=")[0]


def _written(override: str) -> str:
    """The reward.* key an override sets (for a key inside a dict setting such as reward_kwargs, that setting)."""
    key = _key(override)
    return next(k for k in reward_keys() if key == k or key.startswith(f"{k}."))


def _issues(*overrides):
    """(warnings, None) of a valid config, or (None, the ConfigError's text)."""
    logging.getLogger("verl.config").disabled = True
    try:
        return validate_config(compose_ppo_config([*SEED, *overrides])), None
    except ConfigError as e:
        return None, str(e)
    finally:
        logging.getLogger("verl.config").disabled = False


@pytest.fixture(scope="module")
def mapped():
    return OmegaConf.to_container(compose_ppo_config([o for o, _, _ in BY_HAND]), resolve=True)


@pytest.mark.parametrize("override, ours, value", BY_HAND, ids=[_key(o) for o, _, _ in BY_HAND])
def test_each_key_sets_the_key_read_here(mapped, override, ours, value):
    assert reward_keys()[_written(override)] == ours
    assert at(mapped, ours) == value
    assert at(mapped, _written(override)) == value  # the reward.* key keeps what the user wrote


def test_every_mapped_key_is_checked_by_hand():
    by_hand = {_written(o) for o, _, _ in BY_HAND}
    for key, ours in reward_keys().items():
        if key not in by_hand:  # the judge's other keys have the same name in both layouts
            assert key.startswith("reward.reward_model.rollout.") and ours == key.removeprefix("reward."), key


def test_a_key_at_the_originals_default_sets_nothing():
    # The original's reward.num_workers default is 8; ours (reward_model.num_workers) is 1.
    config = compose_ppo_config(["reward.num_workers=8", "reward.reward_model.rollout.tensor_model_parallel_size=2"])
    assert config.reward_model.num_workers == 1 and config.reward_model.rollout.tensor_model_parallel_size == 2
    assert _issues("reward.num_workers=8") == ([], None)


def test_the_asynchronous_recipes_configs_are_mapped_too():
    config = compose_config(["reward.custom_reward_function.path=my_reward.py"], "fully_async_ppo_trainer")
    assert config.custom_reward_function.path == "my_reward.py"


def test_both_keys_set_to_different_values_is_an_error_naming_both():
    _, text = _issues("reward.num_workers=2", "reward_model.num_workers=3",
                      "reward.reward_manager.name=dapo", "reward_model.reward_manager=dapo")
    assert text.splitlines()[1:] == [
        "- reward.num_workers: is 2, but reward_model.num_workers, the setting it stands for here, is 3. Set only one "
        "of the two keys (or both to the same value)"]


def test_only_reward_keys_resolve_to_the_same_run_spec_as_the_legacy_keys(tmp_path):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    new = ["reward.num_workers=4", f"reward.custom_reward_function.path={reward_file}",
           "reward.custom_reward_function.name=my_score", "reward.reward_manager.name=dapo",
           "reward.reward_model.enable=true", "reward.reward_model.model_path=models/rm",
           "reward.reward_model.enable_resource_pool=true", "reward.reward_model.n_gpus_per_node=2",
           "reward.reward_model.nnodes=1", "reward.reward_model.rollout.name=hf",
           "reward.reward_model.rollout.prompt_length=1024", "reward.reward_model.rollout.response_length=256",
           "+reward.reward_kwargs.overlong_buffer_cfg.enable=true", "+reward.reward_kwargs.overlong_buffer_cfg.len=64"]
    legacy = ["reward_model.num_workers=4", f"custom_reward_function.path={reward_file}",
              "custom_reward_function.name=my_score", "reward_model.reward_manager=dapo", "reward_model.enable=true",
              "reward_model.model.path=models/rm", "reward_model.enable_resource_pool=true",
              "reward_model.n_gpus_per_node=2", "reward_model.nnodes=1", "reward_model.rollout.name=hf",
              "reward_model.rollout.prompt_length=1024", "reward_model.rollout.response_length=256",
              "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=64"]
    specs = [resolve_run(compose_ppo_config([*SEED, *overrides]), choose_checkpointing=False, choose_engine=False,
                         log=lambda *a: None) for overrides in (new, legacy)]
    assert specs[0].reward_model == specs[1].reward_model
    assert specs[0].custom_reward_function == specs[1].custom_reward_function
    assert (specs[0].use_rm, specs[0].pools, specs[0].role_pool) == (specs[1].use_rm, specs[1].pools,
                                                                      specs[1].role_pool)
    assert specs[0].reward_model.model.path == "models/rm" and specs[0].reward_model.overlong_buffer.len == 64


def test_an_issue_names_the_key_as_written(tmp_path):
    reward_file = tmp_path / "judge.py"
    reward_file.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                           "    return 0.0\n")
    generative = ["reward_model.enable=true", "reward_model.model.path=models/rm",
                  f"custom_reward_function.path={reward_file}"]
    _, ours = _issues(*generative, "reward_model.rollout.name=vllm")
    _, theirs = _issues(*generative, "reward.reward_model.rollout.name=vllm")
    assert "reward_model.rollout.name: rollout engine 'vllm'" in ours
    # The same error, about the key the user wrote.
    assert theirs == ours.replace("reward_model.rollout.name", "reward.reward_model.rollout.name")
    warnings, _ = _issues("reward.reward_model.rollout.gpu_memory_utilization=0.8", "reward.num_workers=2")
    assert [w.split(":")[0] for w in warnings] == ["reward.num_workers",
                                                   "reward.reward_model.rollout.gpu_memory_utilization"]
    assert "reward.reward_model.rollout.gpu_memory_utilization: is set to 0.8, but only a generative" in warnings[1]


def test_a_wrong_type_is_reported_once_under_the_key_written():
    _, text = _issues("reward.num_workers=many")
    assert text.splitlines()[1:] == [
        "- reward.num_workers: expected an integer, got 'many' (a string). Set a value of that type, e.g. "
        "reward.num_workers=1"]


def test_importlib_managers_are_refused_with_how_to_register():
    _, text = _issues("reward.reward_manager.source=importlib", "reward.reward_manager.module.path=my_manager.py",
                      "reward.reward_manager.name=MyManager")
    lines = text.splitlines()[1:]
    assert len(lines) == 1 and lines[0].startswith("- reward.reward_manager.source: is importlib, but loading a reward "
                                                   "manager class from reward.reward_manager.module.path")
    assert "@register(\"my_manager\")" in lines[0] and "reward.reward_manager.name=my_manager" in lines[0]
    _, text = _issues("reward.reward_manager.source=pip")
    assert "- reward.reward_manager.source: must be one of register, importlib, got pip" in text


def test_keys_nothing_reads_here_draw_one_warning_each():
    warnings, _ = _issues("reward.reward_model.rollout.seed=3", "reward.reward_manager.module.path=my_manager.py",
                          "+reward.reward_kwargs.max_resp_len=100", "+reward.reward_kwargs.other=1")
    assert warnings == [
        "reward.reward_manager.module.path: is set to my_manager.py, but only reward.reward_manager.source=importlib "
        "reads it (as in the original), so it has no effect. Remove it to silence this warning",
        "reward.reward_model.rollout.seed: is set to 3, but reward_model.rollout (the judge's engine here) has no "
        "setting 'seed', so it has no effect. Remove it to silence this warning",
        "reward.reward_kwargs.max_resp_len: is 100, but the dapo reward manager here measures the overlong penalty "
        "against data.max_response_length=512. Remove it, or set data.max_response_length",
        "reward.reward_kwargs.other: is set to 1, but no reward setting here stands for it, so it has no effect. "
        "Remove it to silence this warning (ppo_trainer.yaml lists the reward.* keys read)",
    ]
    # max_resp_len equal to the length the dapo manager reads: the same setting, nothing to say.
    assert _issues("+reward.reward_kwargs.max_resp_len=512") == ([], None)


def test_a_config_built_in_python_is_mapped_by_the_trainer():
    """A config the user composed or edited in Python (not through compose_config) gets the same mapping when a
    PPOTrainer is built from it: setting reward.* there is no conflict with the key it stands for."""
    from verl.trainer import PPOTrainer

    config = compose_ppo_config(SEED)
    OmegaConf.update(config, "reward.reward_model.model_path", "models/rm")
    OmegaConf.update(config, "reward.num_workers", 3)
    trainer = PPOTrainer(config=config)
    assert trainer.config.reward_model.model.path == "models/rm" and trainer.config.reward_model.num_workers == 3
