"""ppo_trainer.yaml, compose_ppo_config and validate_config: what a user typing a command line sees."""

import logging

import pytest

from verl.trainer.config import checks
from verl.trainer.config_validation import (
    SUCCESS_LINE,
    ConfigError,
    compose_ppo_config,
    main,
    validate_config,
)
from verl.workers.rollout import registry as rollout_base

# The single-GPU GSM8K PPO command of a published verl walkthrough, unchanged except n_gpus_per_node.
SEED = [
    "data.train_files=data/processed/gsm8k/train.parquet",
    "data.val_files=data/processed/gsm8k/test.parquet",
    "data.train_batch_size=256",
    "data.max_prompt_length=512",
    "data.max_response_length=256",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.optim.lr=1e-5",
    "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=['console']",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=15",
]


@pytest.fixture(autouse=True)
def ray_installed(monkeypatch):
    """Results must not depend on whether this machine has ray; tests that care patch further."""
    real = checks._module_available
    monkeypatch.setattr(checks, "_module_available", lambda name: name == "ray" or real(name))


def validate(*overrides, **kwargs):
    return validate_config(compose_ppo_config([*SEED, *overrides]), **kwargs)


def problems(*overrides, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        validate(*overrides, **kwargs)
    return str(info.value)


# --------------------------------------------------------------------------------------------------
# The seed command line
# --------------------------------------------------------------------------------------------------


def test_seed_command_composes_with_its_values():
    config = compose_ppo_config(SEED)
    assert config.data.train_batch_size == 256
    assert config.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert list(config.trainer.logger) == ["console"]
    assert config.trainer.val_before_train is False
    assert config.critic.model.path == "Qwen/Qwen2.5-0.5B-Instruct"


def test_seed_command_validates_and_prints_the_success_line_once(capsys):
    warnings = validate()
    # The article's micro-batch sizes give way to token budgets (packed forwards): said once, not an error.
    assert len(warnings) == 1 and "is not used" in warnings[0] and "use_dynamic_bsz=false" in warnings[0]
    assert validate("actor_rollout_ref.actor.use_dynamic_bsz=false", "critic.use_dynamic_bsz=false") == []
    assert capsys.readouterr().out.count(SUCCESS_LINE) == 2


def test_success_line_is_not_printed_on_failure(capsys):
    problems("data.train_batch_size=abc")
    assert SUCCESS_LINE not in capsys.readouterr().out


def test_our_defaults_that_the_trainer_relies_on():
    config = compose_ppo_config([])
    assert config.actor_rollout_ref.rollout.name == "native"
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert config.trainer.backend == "auto"
    assert config.trainer.device == "cuda"
    assert config.ray_kwargs.ray_init.num_cpus is None
    assert config.ray_kwargs.timeline_json_file is None
    assert config.reward_model.overlong_buffer.len == 0
    assert config.custom_reward_function.name == "compute_score"


# --------------------------------------------------------------------------------------------------
# Composition
# --------------------------------------------------------------------------------------------------


def test_interpolations_follow_overrides():
    config = compose_ppo_config(["data.max_prompt_length=1024", "data.max_response_length=64",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.model.path=m",
                                 "trainer.project_name=p", "trainer.experiment_name=e"])
    assert config.actor_rollout_ref.rollout.prompt_length == 1024
    assert config.actor_rollout_ref.rollout.response_length == 64
    assert config.critic.ppo_mini_batch_size == 32
    assert config.critic.model.path == "m"
    assert config.trainer.default_local_dir == "checkpoints/p/e"


def test_an_explicit_value_wins_over_the_interpolation():
    config = compose_ppo_config(["data.max_prompt_length=1024", "actor_rollout_ref.rollout.prompt_length=100"])
    assert config.actor_rollout_ref.rollout.prompt_length == 100


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError) as info:
        compose_ppo_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpus=4"])
    assert ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpus: unknown key; "
            "did you mean actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu?") in str(info.value)


def test_all_unknown_keys_are_reported_together():
    with pytest.raises(ConfigError) as info:
        compose_ppo_config([*SEED, "trainer.n_gpu_per_node=2", "ray_init.num_cpus=4", "foo.bar=1", "~trainer.bakend"])
    message = str(info.value)
    assert "- trainer.n_gpu_per_node: unknown key; did you mean trainer.n_gpus_per_node?" in message
    assert "- ray_init.num_cpus: unknown key; did you mean ray_kwargs.ray_init.num_cpus?" in message
    assert "- foo.bar: unknown key" in message and "+foo.bar=" in message
    assert "- trainer.bakend: unknown key; did you mean trainer.backend?" in message
    assert len(info.value.problems) == 4


def test_unknown_megatron_key_says_megatron_is_not_shipped():
    with pytest.raises(ConfigError, match="Megatron") as info:
        compose_ppo_config(["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"])
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size" in str(info.value)


def test_plus_adds_new_keys_and_tilde_deletes():
    config = compose_ppo_config([*SEED, "+new_key=1", "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
                                 "~trainer.esi_redundant_time"])
    assert config.new_key == 1
    assert config.actor_rollout_ref.model.override_config.attention_dropout == 0.0
    assert "esi_redundant_time" not in config.trainer
    validate_config(config)


def test_malformed_overrides_are_reported_with_their_text():
    with pytest.raises(ConfigError) as info:
        compose_ppo_config(["trainer.logger=[console", "just_a_word"])
    message = str(info.value)
    assert "'trainer.logger=[console'" in message and "'just_a_word'" in message


def test_hydra_composition_errors_become_config_errors():
    with pytest.raises(ConfigError, match="trainer.backend"):
        compose_ppo_config(["+trainer.backend=ray"])


def test_unsupported_flags_and_megatron_config_name():
    with pytest.raises(ConfigError, match="--help"):
        compose_ppo_config(["--help"])
    with pytest.raises(ConfigError, match="Megatron"):
        compose_ppo_config(["--config-name=ppo_megatron_trainer"])


def test_user_config_dir_can_build_on_ppo_trainer(tmp_path):
    # The layout of verl's own example configs: a searchpath relative to a verl checkout, then defaults.
    (tmp_path / "my_run.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  max_prompt_length: 1024\n"
    )
    config = compose_ppo_config(["--config-path", str(tmp_path), "--config-name=my_run", "data.train_batch_size=8"])
    assert config.data.max_prompt_length == 1024
    assert config.actor_rollout_ref.rollout.prompt_length == 1024
    assert config.data.train_batch_size == 8


# --------------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("override, key, expected", [
    ("data.train_batch_size=abc", "data.train_batch_size", "expected an integer, got 'abc'"),
    ("trainer.total_epochs=1.5", "trainer.total_epochs", "expected an integer, got 1.5"),
    ("trainer.total_epochs=true", "trainer.total_epochs", "expected an integer, got True"),
    ("trainer.val_before_train=3", "trainer.val_before_train", "expected true or false"),
    ("actor_rollout_ref.actor.optim.lr=fast", "actor_rollout_ref.actor.optim.lr", "expected a number"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2.5",
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "expected an integer"),
    ("trainer.total_training_steps=ten", "trainer.total_training_steps", "expected an integer"),
    ("data.val_files=5", "data.val_files", "expected a string or a list"),
    ("actor_rollout_ref.actor.checkpoint.save_contents=model", "actor_rollout_ref.actor.checkpoint.save_contents",
     "expected a list"),
])
def test_wrong_types_name_the_key(override, key, expected):
    message = problems(override)
    assert f"- {key}: {expected}" in message


def test_type_error_is_reported_once_not_again_for_keys_that_follow_it():
    message = problems("data.train_batch_size=abc")
    assert "data.gen_batch_size" not in message


def test_accepted_type_variants():
    validate("actor_rollout_ref.actor.optim.lr=1", "trainer.experiment_name=2024", "trainer.logger=console",
             "data.train_files=[a.parquet,b.parquet]", "trainer.total_training_steps=100")


# --------------------------------------------------------------------------------------------------
# Allowed values
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("override, key, expected", [
    ("algorithm.adv_estimator=grpoo", "algorithm.adv_estimator", "did you mean grpo?"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=vanila", "actor_rollout_ref.actor.policy_loss.loss_mode",
     "did you mean vanilla?"),
    ("actor_rollout_ref.actor.loss_agg_mode=token_mean", "actor_rollout_ref.actor.loss_agg_mode",
     "did you mean token-mean?"),
    ("critic.loss_agg_mode=seq-mean", "critic.loss_agg_mode", "seq-mean-token-sum-norm"),
    ("actor_rollout_ref.actor.kl_loss_type=k4", "actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
    ("algorithm.kl_penalty=full", "algorithm.kl_penalty", "not a known KL estimator"),
    ("algorithm.kl_ctrl.type=adapt", "algorithm.kl_ctrl.type", "did you mean adaptive?"),
    ("data.truncation=cut", "data.truncation", "error, left, right, middle"),
    ("trainer.resume_mode=always", "trainer.resume_mode", "auto, disable, resume_path"),
    ("trainer.device=npu", "trainer.device", "cuda, cpu"),
    ("trainer.backend=slurm", "trainer.backend", "ray, local"),
    ("trainer.logger=[console,swanlab]", "trainer.logger", "'swanlab' is not a known logger"),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type=linear", "actor_rollout_ref.actor.optim.lr_scheduler_type",
     "constant, cosine"),
    ("reward_model.reward_manager=naiv", "reward_model.reward_manager", "did you mean naive?"),
    ("actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.strategy",
     "Megatron backend is not shipped"),
    ("critic.strategy=megatron", "critic.strategy", "Set critic.strategy=fsdp"),
    ("actor_rollout_ref.rollout.name=hff", "actor_rollout_ref.rollout.name", "did you mean hf?"),
])
def test_values_outside_the_allowed_set(override, key, expected):
    message = problems(override)
    assert f"- {key}: " in message
    assert expected in message


def test_shared_choice_is_reported_at_its_source_only():
    message = problems("actor_rollout_ref.actor.strategy=megatron")
    assert "actor_rollout_ref.ref.strategy" not in message  # ref follows the actor's strategy


def test_allowed_values_pass():
    validate("actor_rollout_ref.actor.kl_loss_type=k3+", "algorithm.kl_penalty=low_var_kl",
             "actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2", "trainer.logger=[console,file]",
             "algorithm.kl_ctrl.type=adaptive", "data.truncation=left", "trainer.device=cpu",
             "trainer.backend=local", "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine")


def test_registered_estimators_are_accepted_without_editing_the_validator(monkeypatch):
    from verl import algorithms as core_algos

    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "my_estimator", lambda **kwargs: None)
    validate("algorithm.adv_estimator=my_estimator", "critic.enable=false")


def test_deprecated_warmup_style_warns():
    warnings = validate("actor_rollout_ref.actor.optim.warmup_style=cosine")
    assert any(w.startswith("actor_rollout_ref.actor.optim.warmup_style: is deprecated") for w in warnings)


# --------------------------------------------------------------------------------------------------
# Rollout engines, backends, keys other backends read
# --------------------------------------------------------------------------------------------------


def test_vllm_not_installed(monkeypatch):
    monkeypatch.setattr(rollout_base, "_installed", lambda name: False)
    message = problems("actor_rollout_ref.rollout.name=vllm")
    assert ("actor_rollout_ref.rollout.name: rollout engine 'vllm' is not installed; the built-in engines are: "
            "hf, native. Set actor_rollout_ref.rollout.name=hf") in message


def test_vllm_installed_still_has_no_adapter(monkeypatch):
    monkeypatch.setattr(rollout_base, "_installed", lambda name: True)
    message = problems("actor_rollout_ref.rollout.name=vllm")
    assert "'vllm' is installed, but this verl ships no adapter for it" in message
    assert "Set actor_rollout_ref.rollout.name=hf" in message


def test_ray_backend_without_ray(monkeypatch):
    monkeypatch.setattr(checks, "_module_available", lambda name: False)
    assert "trainer.backend=local" in problems("trainer.backend=ray", "trainer.n_gpus_per_node=1")
    assert "auto picks Ray for more than one worker" in problems("trainer.n_gpus_per_node=2")
    validate("trainer.backend=local")
    validate("trainer.n_gpus_per_node=1")  # auto: one worker runs in this process, no Ray needed


def test_local_backend_is_single_node():
    assert "- trainer.nnodes: the local backend runs in one process" in problems(
        "trainer.backend=local", "trainer.nnodes=2")


def test_keys_only_other_engines_read_warn_with_their_name(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        warnings = validate("actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                            "actor_rollout_ref.rollout.enable_chunked_prefill=false")
    assert any(w.startswith("actor_rollout_ref.rollout.tensor_model_parallel_size: ") and "ignores it" in w
               and "data-parallel" in w for w in warnings)
    assert any(w.startswith("actor_rollout_ref.rollout.enable_chunked_prefill: ") for w in warnings)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" in caplog.text


def test_each_engine_warns_about_the_keys_it_does_not_read():
    # hf generates with transformers: the native engine's cache and graph settings mean nothing to it.
    hf = validate("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.max_num_seqs=64")
    assert any(w.startswith("actor_rollout_ref.rollout.max_num_seqs: ") for w in hf)
    assert not any(w.startswith("actor_rollout_ref.rollout.max_num_seqs") for w in validate(
        "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.max_num_seqs=64"))


def test_megatron_settings_added_with_plus_warn():
    warnings = validate("+actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2")
    assert any(w.startswith("actor_rollout_ref.actor.megatron: ") and "ignored" in w for w in warnings)


def test_a_logger_whose_package_is_missing_is_an_early_error(monkeypatch):
    monkeypatch.setattr(checks, "_module_available", lambda name: name == "ray")
    assert ("- trainer.logger: 'wandb' is listed but the wandb package is not installed. pip install wandb"
            in problems("trainer.logger=[console,wandb]"))
    validate("trainer.logger=[console,file]")


# --------------------------------------------------------------------------------------------------
# Required keys, ranges, sampling
# --------------------------------------------------------------------------------------------------


def test_required_keys():
    message = problems("data.train_files=null", "actor_rollout_ref.model.path=null", "critic.model.path=null")
    assert "- data.train_files: is required" in message
    assert "- actor_rollout_ref.model.path: is required" in message
    assert "- critic.model.path: is required because a critic is used" in message


def test_critic_model_path_defaults_to_the_policy():
    config = compose_ppo_config([o for o in SEED if not o.startswith("critic.model.path")])
    assert config.critic.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    validate_config(config)


def test_reward_model_path_required_when_enabled():
    message = problems("reward_model.enable=true", "reward_model.micro_batch_size_per_gpu=4")
    assert "- reward_model.model.path: is required because reward_model.enable=true" in message


def test_custom_reward_file_must_exist(tmp_path):
    assert "- custom_reward_function.path: file" in problems(f"custom_reward_function.path={tmp_path}/missing.py")
    reward_file = tmp_path / "reward.py"
    reward_file.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n")
    validate(f"custom_reward_function.path={reward_file}")


def test_ranges_and_sampling():
    message = problems("data.max_response_length=0", "actor_rollout_ref.actor.optim.lr=-1",
                       "actor_rollout_ref.actor.clip_ratio_c=1.0", "actor_rollout_ref.rollout.temperature=0",
                       "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                       "actor_rollout_ref.rollout.gpu_memory_utilization=1.5")
    assert "- data.max_response_length: must be > 0, got 0" in message
    assert "- actor_rollout_ref.actor.optim.lr: must be > 0" in message
    assert "- actor_rollout_ref.actor.clip_ratio_c: must be > 1" in message
    assert ("- actor_rollout_ref.rollout.temperature: must be > 0 when "
            "actor_rollout_ref.rollout.do_sample=true") in message
    assert "- actor_rollout_ref.rollout.val_kwargs.temperature: must be > 0 when" in message
    assert "- actor_rollout_ref.rollout.gpu_memory_utilization: must be in (0, 1]" in message


def test_sapo_temperatures_must_be_positive():
    message = problems("actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_pos=0",
                       "actor_rollout_ref.actor.tau_neg=-0.5")
    assert "- actor_rollout_ref.actor.tau_pos: must be > 0, got 0" in message
    assert "- actor_rollout_ref.actor.tau_neg: must be > 0, got -0.5" in message
    validate("actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_pos=0.5",
             "actor_rollout_ref.actor.tau_neg=2.0")


def test_greedy_rollout_may_use_temperature_zero():
    validate("actor_rollout_ref.rollout.do_sample=false", "actor_rollout_ref.rollout.temperature=0")


def test_group_estimator_with_one_sample_warns_not_fails():
    warnings = validate("algorithm.adv_estimator=grpo")
    assert any(w.startswith("actor_rollout_ref.rollout.n: is 1, but adv_estimator=grpo") for w in warnings)
    warnings = validate("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4")
    assert not [w for w in warnings if "rollout.n" in w]


def test_resume_path_needs_a_global_step_folder():
    assert "- trainer.resume_from_path: must name a checkpoint folder" in problems("trainer.resume_mode=resume_path")
    validate("trainer.resume_mode=resume_path", "trainer.resume_from_path=checkpoints/p/e/global_step_20")


# --------------------------------------------------------------------------------------------------
# Batch sizes
# --------------------------------------------------------------------------------------------------


def test_train_batch_not_divisible_by_devices():
    message = problems("data.train_batch_size=6", "actor_rollout_ref.rollout.n=1", "trainer.n_gpus_per_node=4",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    assert "- data.train_batch_size: data.train_batch_size (6) x actor_rollout_ref.rollout.n (1) = 6" in message
    assert "over 4 devices (trainer.n_gpus_per_node=4 x trainer.nnodes=1)" in message


def test_n_devices_argument_overrides_the_trainer_keys():
    assert "over 3 devices (as passed to validate_config)" in problems(n_devices=3)
    validate(n_devices=4)


def test_mini_batch_larger_than_or_not_dividing_the_train_batch():
    message = problems("actor_rollout_ref.actor.ppo_mini_batch_size=512")
    assert "- actor_rollout_ref.actor.ppo_mini_batch_size: (512) is larger than data.train_batch_size (256)" in message
    assert "- actor_rollout_ref.actor.ppo_mini_batch_size: (96) must divide data.train_batch_size (256)" in problems(
        "actor_rollout_ref.actor.ppo_mini_batch_size=96", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "critic.ppo_micro_batch_size_per_gpu=8")


def test_micro_batch_must_divide_the_per_device_mini_batch():
    message = problems("trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
                       "critic.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_dynamic_bsz=false")
    assert ("- actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: (3) must divide "
            "the per-device mini batch") in message
    assert "64 x n 1 / 8 ranks = 8" in message
    assert "- critic.ppo_micro_batch_size_per_gpu: (16) is larger than the per-device mini batch" in message
    # token-budget micro batches have no fixed size to check: asked for, or by default with packed forwards
    validate("trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
             "critic.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_dynamic_bsz=true")
    validate("trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
             "critic.ppo_micro_batch_size_per_gpu=16")
    # without packed forwards the default sizes micro batches by rows, which must be set
    message = problems("actor_rollout_ref.model.use_remove_padding=false",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null")
    assert "- actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: is not set" in message


def test_rollout_n_counts_in_the_split():
    # 4 prompts x n=2 = 8 sequences over 8 devices works although 4 prompts alone would not.
    validate("trainer.n_gpus_per_node=8", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
             "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
             "critic.ppo_micro_batch_size_per_gpu=1")


def test_critic_sequence_parallel_split_is_reported_on_its_own_key():
    # The critic's mini batch follows the actor's; only its different sequence-parallel size breaks the split.
    message = problems("trainer.n_gpus_per_node=2", "data.train_batch_size=2",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                       "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                       "critic.ppo_micro_batch_size_per_gpu=1")
    assert "- critic.ulysses_sequence_parallel_size: (1) leaves 2 data-parallel ranks" in message
    assert "- actor_rollout_ref" not in message


def test_micro_batch_pairs_both_set():
    message = problems("actor_rollout_ref.actor.ppo_micro_batch_size=8",
                       "actor_rollout_ref.actor.use_dynamic_bsz=false")
    assert ("- actor_rollout_ref.actor.ppo_micro_batch_size: is set together with "
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu; set only one") in message
    # Sized by tokens, the row keys are unused: asked for explicitly, silently (as verl does); by default,
    # with a warning naming every unused key.
    validate("actor_rollout_ref.actor.ppo_micro_batch_size=8", "actor_rollout_ref.actor.use_dynamic_bsz=true")
    warnings = validate("actor_rollout_ref.actor.ppo_micro_batch_size=8")
    unused = [w for w in warnings if "is not used" in w]
    assert len(unused) == 1 and unused[0].startswith("actor_rollout_ref.actor.ppo_micro_batch_size: is not used (nor ")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in unused[0] and "use_dynamic_bsz=false" in unused[0]


def test_micro_batch_pairs_neither_set():
    message = problems("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                       "critic.ppo_micro_batch_size_per_gpu=null", "actor_rollout_ref.actor.use_dynamic_bsz=false")
    assert "- actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: is not set" in message
    assert "- critic.ppo_micro_batch_size_per_gpu: is not set" in message


def test_deprecated_global_micro_batch_warns_with_the_per_gpu_value():
    warnings = validate("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                        "actor_rollout_ref.actor.ppo_micro_batch_size=8", "trainer.n_gpus_per_node=2",
                        "critic.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_dynamic_bsz=false")
    assert any(w.startswith("actor_rollout_ref.actor.ppo_micro_batch_size: is deprecated. "
                            "Use actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4") for w in warnings)


def test_micro_batch_pairs_only_for_roles_in_use():
    # GRPO without KL: no critic and no reference, so their micro batch sizes may stay unset.
    validate("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
             "critic.ppo_micro_batch_size_per_gpu=null", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null")
    message = problems("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
                       "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.use_dynamic_bsz=false",
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null")
    assert "- actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu: is not set" in message
    assert "critic." not in message


# --------------------------------------------------------------------------------------------------
# Reporting and the command line
# --------------------------------------------------------------------------------------------------


def test_every_problem_is_reported_on_its_own_line():
    with pytest.raises(ConfigError) as info:
        validate("data.train_batch_size=abc", "trainer.device=tpu", "actor_rollout_ref.model.path=null")
    assert isinstance(info.value, ValueError)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("Invalid configuration (3 problems)")
    assert [line.split(":")[0] for line in lines[1:]] == [
        "- data.train_batch_size", "- actor_rollout_ref.model.path", "- trainer.device"]


def test_unresolvable_interpolation_names_the_key():
    message = problems("critic.model.path=${nope.key}")
    assert "- critic.model.path: cannot be resolved" in message


def test_cli_prints_the_success_line_or_the_problems(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the CLI also runs the pre-flight check: the seed's data files must exist
    (tmp_path / "data/processed/gsm8k").mkdir(parents=True)
    for name in ("train", "test"):
        (tmp_path / f"data/processed/gsm8k/{name}.parquet").write_bytes(b"")
    from verl.trainer import preflight

    monkeypatch.setattr(preflight, "_hub_reachable", lambda timeout=3.0: False)  # this machine: no network
    assert main([*SEED, "trainer.device=cpu"]) == 1
    assert "- actor_rollout_ref.model.path: 'Qwen/Qwen2.5-0.5B-Instruct' is no folder here" in capsys.readouterr().err
    monkeypatch.setattr(preflight, "_hub_reachable", lambda timeout=3.0: True)  # a machine that can download it
    assert main([*SEED, "trainer.device=cpu"]) == 0
    assert capsys.readouterr().out.strip() == SUCCESS_LINE
    assert main([*SEED, "trainer.n_gpu_per_node=2"]) == 1
    assert "did you mean trainer.n_gpus_per_node?" in capsys.readouterr().err
    (tmp_path / "data/processed/gsm8k/test.parquet").unlink()
    assert main([*SEED, "trainer.device=cpu"]) == 1
    assert "- data.val_files: 'data/processed/gsm8k/test.parquet' does not exist" in capsys.readouterr().err


def test_dynamic_sampling_settings():
    dapo = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc", "algorithm.adv_estimator=grpo")
    validate(*dapo, "actor_rollout_ref.rollout.n=4", "data.gen_batch_size=96")
    message = problems(*dapo[:1], "actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=grpo")
    assert "- algorithm.filter_groups.metric: is None; with filter_groups enabled choose one of acc" in message
    assert "- actor_rollout_ref.rollout.n: is 1, but algorithm.filter_groups keeps groups" in message
    message = problems("data.gen_batch_size=96")  # read by nothing unless filter_groups is on
    assert "- data.gen_batch_size: is 96, but only DAPO dynamic sampling reads it" in message


def test_features_not_implemented_are_never_silently_ignored(caplog):
    # a feature that changes what is learned is an error ...
    message = problems("algorithm.use_pf_ppo=true")
    assert "- algorithm.use_pf_ppo: is set to true, but policy-filtration PPO" in message
    # ... a speed or memory knob is a warning that names the key
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        warnings = validate("actor_rollout_ref.model.use_liger=true")
    assert any(w.startswith("actor_rollout_ref.model.use_liger: ") and "no effect" in w for w in warnings)
    # keys that only follow another key are reported once, at the source
    warnings = validate("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "trainer.n_gpus_per_node=2")
    assert not any(w.startswith("actor_rollout_ref.ref.ulysses") for w in warnings)


def test_lora_mistakes_stop_before_any_worker(tiny_qwen2_dir, tmp_path, monkeypatch):
    pytest.importorskip("peft")
    model = [f"actor_rollout_ref.model.path={tiny_qwen2_dir}", f"critic.model.path={tiny_qwen2_dir}"]
    assert validate(*model, "actor_rollout_ref.model.lora_rank=8", "critic.model.lora_rank=8") is not None
    message = problems(*model, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=[qkv]")
    assert "- actor_rollout_ref.model.target_modules: actor_rollout_ref.model.target_modules=['qkv'] cannot wrap " \
           "Qwen2ForCausalLM" in message and "Use 'all-linear' or names of its nn.Linear modules" in message
    message = problems(*model, "critic.model.lora_rank=8", f"critic.model.lora_adapter_path={tmp_path}/none")
    assert f"- critic.model.lora_adapter_path: critic.model.lora_adapter_path='{tmp_path}/none': no such folder" \
        in message
    message = problems(*model, "actor_rollout_ref.model.lora_rank=-2")
    assert "- actor_rollout_ref.model.lora_rank: actor_rollout_ref.model.lora_rank=-2: must be 0" in message
    monkeypatch.setattr(checks, "_module_available", lambda name: name != "peft")
    message = problems(*model, "actor_rollout_ref.model.lora_rank=8")
    assert "- actor_rollout_ref.model.lora_rank: needs the peft package, which is not installed" in message


def test_sandbox_fusion_keys_say_code_runs_in_the_local_sandbox(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        warnings = validate("reward_model.sandbox_fusion.url=http://localhost:8080/run_code")
    assert any(w.startswith("reward_model.sandbox_fusion.url: ") and "run in the local sandbox" in w for w in warnings)


def test_multi_turn_mistakes_stop_before_any_worker(tmp_path):
    mt = "actor_rollout_ref.rollout.multi_turn"
    message = problems(f"{mt}.enable=true", "data.return_raw_chat=false",
                       f"{mt}.tool_config_path={tmp_path}/tools.yaml",
                       f"{mt}.interaction_config_path=x.yaml", f"{mt}.max_assistant_turns=0")
    assert "- data.return_raw_chat: must be True with actor_rollout_ref.rollout.multi_turn.enable=true" in message
    assert f"- {mt}.tool_config_path: {mt}.tool_config_path='{tmp_path}/tools.yaml': no such file" in message
    assert f"- {mt}.interaction_config_path: {mt}.interaction_config_path='x.yaml': no such file" in message
    assert f"- {mt}.max_assistant_turns: must be a positive integer" in message
    (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: verl.tools.code_interpreter.NoSuchTool\n"
                                         "    tool_schema: {function: {name: x}}\n")
    message = problems(f"{mt}.enable=true", "data.return_raw_chat=true", f"{mt}.tool_config_path={tmp_path}/tools.yaml")
    assert "tools[0]: cannot import 'verl.tools.code_interpreter.NoSuchTool'" in message
    (tmp_path / "users.yaml").write_text("interaction:\n  - name: helper\n    class_name: verl.tools.base.BaseTool\n")
    users = f"{mt}.interaction_config_path={tmp_path}/users.yaml"
    message = problems(f"{mt}.enable=true", "data.return_raw_chat=true", users)
    assert ("interaction[0]: verl.tools.base.BaseTool is not a subclass of "
            "verl.interactions.base.BaseInteraction") in message
    (tmp_path / "users.yaml").write_text("interaction:\n  - name: gsm8k\n"
                                         "    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n")
    validate(f"{mt}.enable=true", "data.return_raw_chat=true", users)


def test_broken_model_folders_are_named_before_anything_starts(tiny_qwen2_dir, tmp_path):
    import shutil

    key = "actor_rollout_ref.model.path"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"- {key}: '{empty}' holds no config.json: it is not a Hugging Face model folder" in problems(
        f"{key}={empty}")
    assert f"- {key}: '{tmp_path}/missing': no such folder" in problems(f"{key}={tmp_path}/missing")
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_qwen2_dir, no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        (no_tokenizer / name).unlink(missing_ok=True)
    assert f"- {key}: '{no_tokenizer}' holds no tokenizer files" in problems(f"{key}={no_tokenizer}")
    # ... fine when the tokenizer comes from elsewhere; a folder without weights is named too
    validate(f"{key}={no_tokenizer}", f"actor_rollout_ref.model.tokenizer_path={tiny_qwen2_dir}",
             f"critic.model.path={tiny_qwen2_dir}")
    for weights in no_tokenizer.glob("*.safetensors"):
        weights.unlink()
    message = problems(f"{key}={no_tokenizer}", f"actor_rollout_ref.model.tokenizer_path={tiny_qwen2_dir}")
    assert f"- {key}: '{no_tokenizer}' holds no weights" in message


def test_local_backend_has_one_worker_and_no_pools():
    message = problems("trainer.backend=local", "trainer.n_gpus_per_node=2", "critic.enable_resource_pool=true")
    assert "- trainer.n_gpus_per_node: is 2, but the local backend runs one worker in this process" in message
    assert "- critic.enable_resource_pool: the local backend has one process" in message


RC = "algorithm.rollout_correction"


@pytest.mark.parametrize("overrides, key, expected", [
    ([f"{RC}.rollout_is=token", "actor_rollout_ref.rollout.calculate_log_probs=false"],
     "actor_rollout_ref.rollout.calculate_log_probs", "rollout_is needs the rollout's own log-probs"),
    ([f"{RC}.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=false"],
     "actor_rollout_ref.rollout.calculate_log_probs", "bypass_mode needs"),
    ([f"{RC}.rollout_is=tokens", "actor_rollout_ref.rollout.calculate_log_probs=true"], f"{RC}.rollout_is", "token"),
    ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0", "actor_rollout_ref.rollout.calculate_log_probs=true"],
     f"{RC}.rollout_is_threshold", "must be a number > 0"),
    ([f"{RC}.rollout_rs=token_k4", "actor_rollout_ref.rollout.calculate_log_probs=true"], f"{RC}.rollout_rs",
     "unknown criterion ['token_k4']"),
    ([f"{RC}.rollout_rs=token_k1", "actor_rollout_ref.rollout.calculate_log_probs=true"], f"{RC}.rollout_rs_threshold",
     "give one threshold per criterion"),
    ([f"{RC}.loss_type=ppo"], f"{RC}.loss_type", "ppo_clip"),
])
def test_rollout_correction_mistakes_name_the_key(overrides, key, expected):
    text = problems(*overrides)
    assert f"- {key}: " in text and expected in text, text


def test_rollout_correction_settings_pass_and_reach_the_actor():
    overrides = [f"{RC}.rollout_rs='token_k1,seq_max_k2'", f"{RC}.rollout_rs_threshold='0.5_2.0,1.5'",
                 f"{RC}.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=true"]
    validate(*overrides)
    from verl.trainer.config.spec import resolve_run

    spec = resolve_run(compose_ppo_config([*SEED, *overrides]), choose_checkpointing=False)
    assert spec.actor_rollout_ref.actor.policy_loss.rollout_correction == spec.algorithm.rollout_correction
    assert spec.algorithm.rollout_correction.bypass_mode and not spec.old_log_prob_in_update


V1 = "trainer.v1"
SEPARATE = [f"{V1}.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            f"{V1}.separate_async.parameter_sync_step=4"]  # the seed's 256 prompts / mini-batches of 64


@pytest.mark.parametrize("overrides, key, expected", [
    ([f"{V1}.trainer_mode=async"], f"{V1}.trainer_mode", "colocate_async"),
    ([f"{V1}.trainer_mode=colocate_async", f"{V1}.sampler.max_off_policy_threshold=-1"],
     f"{V1}.sampler.max_off_policy_threshold", "must be an integer >= 0"),
    ([f"{V1}.trainer_mode=colocate_async", f"{V1}.sampler.max_off_policy_strategy=block"],
     f"{V1}.sampler.max_off_policy_strategy", "drop, wait"),
    ([f"{V1}.trainer_mode=colocate_async", "actor_rollout_ref.rollout.name=hf"], "actor_rollout_ref.rollout.name",
     "needs the native rollout engine"),
    ([f"{V1}.trainer_mode=colocate_async", "actor_rollout_ref.rollout.multi_turn.enable=true"],
     "actor_rollout_ref.rollout.multi_turn.enable", "trainer_mode=sync only"),
    ([f"{V1}.trainer_mode=colocate_async", "algorithm.adv_estimator=remax"], "algorithm.adv_estimator",
     "greedy baseline"),
    ([f"{V1}.trainer_mode=colocate_async", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "Set it to naive"),
    ([f"{V1}.trainer_mode=colocate_async", f"{V1}.colocate_async.overlap_generation=true",
      "actor_rollout_ref.model.lora_rank=8"], f"{V1}.colocate_async.overlap_generation", "Set it to false"),
    ([f"{V1}.trainer_mode=separate_async"], "actor_rollout_ref.rollout.nnodes", "gives it none"),
    ([*SEPARATE, "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "Set it to nccl"),
    ([*SEPARATE, "actor_rollout_ref.rollout.checkpoint_engine.backend=nixl"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "naive, nccl"),
    ([*SEPARATE, "trainer.backend=local"], "trainer.backend", "needs two pools"),
    ([*SEPARATE, "actor_rollout_ref.model.lora_rank=8"], "actor_rollout_ref.model.lora_rank", "colocate_async"),
    ([*SEPARATE, f"{V1}.separate_async.parameter_sync_step=2"], f"{V1}.separate_async.parameter_sync_step",
     "Set it to 4"),
    ([*SEPARATE, f"{V1}.separate_async.hybrid_rollout.enable_switch=true"],
     f"{V1}.separate_async.hybrid_rollout.enable_switch", "not supported here"),
    ([f"{V1}.sampler.custom_sampler.path=my_sampler.py"], f"{V1}.sampler.custom_sampler.path", "not supported"),
])
def test_trainer_mode_mistakes_stop_before_workers_start_naming_the_key(overrides, key, expected):
    text = problems(*overrides)
    assert f"- {key}: " in text and expected in text, text


def test_the_trainer_modes_validate_and_reach_the_spec():
    from verl.trainer.config.spec import resolve_run

    colocated = [f"{V1}.trainer_mode=colocate_async", f"{V1}.sampler.max_off_policy_threshold=0"]
    overlapping = [*colocated, f"{V1}.colocate_async.overlap_generation=true"]
    for overrides, thread in ((colocated, False), (overlapping, True), (SEPARATE, True)):
        validate(*overrides)
        spec = resolve_run(compose_ppo_config([*SEED, *overrides]), choose_checkpointing=False)
        assert spec.trainer.v1.asynchronous and spec.trainer.v1.num_warmup_batches == 1
        assert spec.rollout_thread == thread and spec.colocated_rollout_copy == (overrides is overlapping)
    spec = resolve_run(compose_ppo_config(SEED), choose_checkpointing=False)
    assert spec.trainer.v1.num_warmup_batches == 0 and not spec.rollout_thread


def test_asynchronous_settings_in_sync_mode_warn(caplog):
    with caplog.at_level(logging.WARNING):
        validate(f"{V1}.sampler.max_off_policy_threshold=2", f"{V1}.colocate_async.overlap_generation=true")
    assert f"{V1}.sampler.max_off_policy_threshold: is read only by the asynchronous modes" in caplog.text
    assert f"{V1}.colocate_async.overlap_generation: is read only by the asynchronous modes" in caplog.text
