"""The original's asynchronous recipes' command lines, turned into the one trainer's settings: each recipe key lands
where its meaning does, the result validates, and what cannot run is refused naming the key."""

import pytest

from verl.base_config import ConfigError
from verl.experimental.recipes import fully_async, one_step_off
from verl.trainer.config.compose import compose_config
from verl.trainer.config.spec import resolve_run
from verl.trainer.config_validation import validate_config

# The keys of the original's grpo_0.6b_gsm8k_fsdp2_2_6.sh that matter here (engine and paths scaled to ours).
ONE_STEP = ["algorithm.adv_estimator=grpo", "data.train_files=train.parquet", "data.train_batch_size=1152",
            "data.max_prompt_length=512", "data.max_response_length=1024", "actor_rollout_ref.model.path=Qwen/Qwen3-0.6B",
            "actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.actor.ppo_mini_batch_size=192",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32", "actor_rollout_ref.rollout.n=5",
            "trainer.n_gpus_per_node=6", "trainer.nnodes=1", "rollout.nnodes=1", "rollout.n_gpus_per_node=2"]


def spec_of(config):
    validate_config(config)
    return resolve_run(config, choose_checkpointing=False)


def test_one_step_off_is_separate_async_one_batch_ahead_never_dropping():
    spec = spec_of(one_step_off(compose_config(ONE_STEP, "one_step_off_ppo_trainer")))
    v1 = spec.trainer.v1
    assert v1.trainer_mode == "separate_async" and v1.separate_async.num_warmup_batches == 1
    assert v1.sampler.max_off_policy_threshold == 1 and v1.sampler.max_off_policy_strategy == "wait"
    assert v1.separate_async.parameter_sync_step == 1152 // 192
    assert spec.pools == {"global_pool": [6], "rollout_pool": [2]}
    assert spec.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"
    assert spec.algorithm.rollout_correction.bypass_mode and spec.actor_rollout_ref.rollout.calculate_log_probs


FULLY = ["data.train_files=train.parquet", "actor_rollout_ref.model.path=Qwen/Qwen3-0.6B",
         "actor_rollout_ref.actor.ppo_mini_batch_size=32", "async_training.trigger_parameter_sync_step=4",
         "async_training.require_batches=2", "async_training.staleness_threshold=0.5", "rollout.n=8",
         "rollout.total_rollout_steps=2560", "rollout.test_freq=10", "trainer.n_gpus_per_node=4",
         "rollout.n_gpus_per_node=4"]


def test_fully_async_syncs_after_trigger_times_require_mini_batches():
    spec = spec_of(fully_async(compose_config(FULLY, "fully_async_ppo_trainer")))
    v1 = spec.trainer.v1
    # 4 local updates of 2 mini-batches of 32 prompts: 256 prompts, 8 optimizer steps, then the weights go out.
    assert spec.data.train_batch_size == 256 and v1.separate_async.parameter_sync_step == 8
    assert spec.total_training_steps == 2560 // 256 and spec.trainer.test_freq == 10
    assert spec.actor_rollout_ref.rollout.n == 8 and spec.pools["rollout_pool"] == [4]
    # staleness 0.5 of a batch: up to one batch ahead (rounded up), groups at most one version old, never dropped
    assert v1.separate_async.num_warmup_batches == 1 and v1.sampler.max_off_policy_threshold == 1
    assert v1.sampler.max_off_policy_strategy == "wait" and spec.algorithm.rollout_correction.bypass_mode


def test_fully_async_with_no_staleness_is_on_policy():
    spec = spec_of(fully_async(compose_config([*FULLY, "async_training.staleness_threshold=0"],
                                              "fully_async_ppo_trainer")))
    assert spec.trainer.v1.sampler.max_off_policy_threshold == 0 and spec.trainer.v1.num_warmup_batches == 0


@pytest.mark.parametrize("override, expected", [
    ("async_training.staleness_threshold=-1", "async_training.staleness_threshold: must be a number >= 0"),
    ("async_training.require_batches=0", "async_training.require_batches: must be an integer >= 1"),
    ("async_training.partial_rollout=false", "async_training.partial_rollout: false is not supported here"),
    ("async_training.use_dynamic_resource_scheduling=true", "use_dynamic_resource_scheduling: lending"),
])
def test_fully_async_settings_that_cannot_run_name_the_key(override, expected):
    with pytest.raises(ConfigError, match=expected):
        fully_async(compose_config([*FULLY, override], "fully_async_ppo_trainer"))


def test_a_recipe_key_misspelled_names_the_closest_one():
    with pytest.raises(ConfigError, match="async_training.staleness_threshold"):
        compose_config([*FULLY, "async_training.stalenes_threshold=1"], "fully_async_ppo_trainer")
