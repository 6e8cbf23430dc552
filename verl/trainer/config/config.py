"""Config sections of the trainer's own: ``data``, ``trainer``, ``custom_reward_function``, and the
checkpoint group every trained role has."""

from __future__ import annotations

from verl.base_config import BaseConfig, section

__all__ = ["CheckpointConfig", "ColocateAsyncConfig", "CustomRewardFunctionConfig", "DataConfig", "HybridRolloutSwitchConfig",
           "SFTDataConfig", "SamplerConfig", "SeparateAsyncConfig", "TrainerConfig", "V1TrainerConfig"]


@section("actor_rollout_ref.actor.checkpoint", shared=True)
class CheckpointConfig(BaseConfig):
    """What a role writes to and reads from ``global_step_N/<role>/``: model, optimizer, extra, hf_model."""

    save_contents: list[str]
    load_contents: list[str]
    async_save: bool


@section("data")
class DataConfig(BaseConfig):
    """The prompt datasets (parquet) and how prompts are batched and cut to length."""

    tokenizer: str | None
    use_shm: bool
    train_files: str | list[str] | None
    val_files: str | list[str] | None
    train_max_samples: int
    val_max_samples: int
    prompt_key: str
    reward_fn_key: str
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    gen_batch_size: int
    val_batch_size: int | None
    return_raw_input_ids: bool
    return_raw_chat: bool
    return_full_prompt: bool
    shuffle: bool
    seed: int
    dataloader_num_workers: int
    validation_shuffle: bool
    filter_overlong_prompts: bool
    filter_overlong_prompts_workers: int
    truncation: str
    image_key: str
    video_key: str
    image_patch_size: int  # not read: the model's image processor sets it
    trust_remote_code: bool
    return_multi_modal_inputs: bool
    apply_chat_template_kwargs: dict
    custom_cls: dict
    sampler: dict
    datagen: dict


@section("custom_reward_function")
class CustomRewardFunctionConfig(BaseConfig):
    """``compute_score(data_source, solution_str, ground_truth, extra_info)`` defined in the Python file
    `path` (under the name `name`)."""

    path: str | None
    name: str
    reward_kwargs: dict


@section("trainer.v1.colocate_async")
class ColocateAsyncConfig(BaseConfig):
    """``colocate_async``: how many prompt batches are generated ahead of the one being trained, and whether the
    rollout decodes while the trainer trains (on a thread of its own, from its own copy of the weights)."""

    num_warmup_batches: int
    overlap_generation: bool


@section("trainer.v1.separate_async.hybrid_rollout")
class HybridRolloutSwitchConfig(BaseConfig):
    """The original's lending of idle trainer devices to a separate rollout (accepted; ``enable_switch`` must be
    false here)."""

    enable_switch: bool
    switch_threshold_ratio: float
    adaptive_switch_threshold: bool
    switch_threshold_step_up: float
    switch_threshold_step_down: float
    switch_threshold_release_steps: int
    switch_cost_window_size: int


@section("trainer.v1.separate_async")
class SeparateAsyncConfig(BaseConfig):
    """``separate_async``: batches generated ahead, and PPO mini-batches per weight sync (``parameter_sync_step``
    x ``ppo_mini_batch_size`` = ``data.train_batch_size``)."""

    num_warmup_batches: int
    parameter_sync_step: int
    hybrid_rollout: HybridRolloutSwitchConfig


@section("trainer.v1.sampler")
class SamplerConfig(BaseConfig):
    """How the asynchronous modes bound staleness: a prompt group may be at most ``max_off_policy_threshold``
    policy versions older than the policy that trains on it; ``drop`` replaces older groups, ``wait`` waits for
    them."""

    max_off_policy_threshold: int
    max_off_policy_strategy: str
    sync_refill_failed_groups: bool
    custom_sampler: dict
    sampler_kwargs: dict


@section("trainer.v1")
class V1TrainerConfig(BaseConfig):
    """``trainer.v1``: the trainer's mode (``sync``, ``colocate_async``, ``separate_async``) and its settings."""

    trainer_mode: str
    sync: dict
    colocate_async: ColocateAsyncConfig
    separate_async: SeparateAsyncConfig
    sampler: SamplerConfig

    @property
    def asynchronous(self) -> bool:
        return self.trainer_mode != "sync"

    @property
    def num_warmup_batches(self) -> int:
        """The active asynchronous mode's batches generated ahead (0 in sync mode)."""
        mode = {"colocate_async": self.colocate_async, "separate_async": self.separate_async}.get(self.trainer_mode)
        return 0 if mode is None else mode.num_warmup_batches


@section("trainer")
class TrainerConfig(BaseConfig):
    """Devices, length of the run, logging, validation and checkpoints."""

    backend: str
    device: str
    nnodes: int
    n_gpus_per_node: int
    total_epochs: int
    total_training_steps: int | None
    balance_batch: bool
    critic_warmup: int
    project_name: str
    experiment_name: str
    logger: str | list[str]
    log_val_generations: int
    rollout_data_dir: str | None
    validation_data_dir: str | None
    val_before_train: bool
    val_only: bool
    test_freq: int
    save_freq: int
    esi_redundant_time: float
    resume_mode: str
    resume_from_path: str | None
    default_local_dir: str
    default_hdfs_dir: str | None
    del_local_ckpt_after_load: bool
    max_actor_ckpt_to_keep: int | None
    max_critic_ckpt_to_keep: int | None
    ray_wait_register_center_timeout: int
    use_legacy_worker_impl: str
    use_v1: bool
    v1: V1TrainerConfig


@section("data.multiturn", config_name="sft_trainer")
class SFTMultiturnConfig(BaseConfig):
    """Train on every assistant turn of a chat column (``messages_key``) instead of a prompt/response pair."""

    enable: bool
    messages_key: str


@section("data", config_name="sft_trainer")
class SFTDataConfig(BaseConfig):
    """``data`` of ``python -m verl.trainer.fsdp_sft_trainer`` (sft_trainer.yaml)."""

    train_batch_size: int
    micro_batch_size_per_gpu: int
    train_files: str | list[str] | None
    val_files: str | list[str] | None
    prompt_key: str
    response_key: str
    prompt_dict_keys: list[str] | None
    response_dict_keys: list[str] | None
    multiturn: SFTMultiturnConfig
    max_length: int
    truncation: str
    balance_dp_token: bool
    chat_template: str | None
    apply_chat_template_kwargs: dict
    custom_cls: dict
