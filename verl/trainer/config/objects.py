"""Config objects for the Python API: the sections of ppo_trainer.yaml as dataclasses.

    from verl.trainer import ActorRolloutRefConfig, ModelConfig, build_ppo_config
    config = build_ppo_config(
        actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(path="Qwen/Qwen2.5-0.5B-Instruct")),
        overrides=["trainer.n_gpus_per_node=1"],
    )

The yaml stays the one source of defaults. Every field starts as `NOT_SET`; only the fields you pass
become overrides of ppo_trainer.yaml (so ``None`` is a value you can set: it writes ``null``). Each
field name is the yaml key of the same name; `to_overrides(prefix)` lists the ``{dotted key: value}``
pairs an object sets. Keys without a field of their own go in ``extra`` (a dict of keys relative to
the section, dotted or nested) or in ``overrides``; a misspelt key there is reported with the closest
valid one. Nested groups without a class of their own (``val_kwargs``, ``checkpoint``, ...) take a dict
of the keys to change. Checking values is `verl.trainer.config_validation.validate_config`'s job.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from verl.trainer.config import ConfigError

__all__ = [
    "NOT_SET",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "CriticConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FSDPConfig",
    "KLControlConfig",
    "ModelConfig",
    "OptimConfig",
    "PPOAlgorithmConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "TrainerConfig",
]


class _NotSet:
    """The default of every field: "not given, keep the yaml default"."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_SET"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "NOT_SET"


NOT_SET: Any = _NotSet()


def _section(*accepts: type) -> Any:
    """A field holding a nested group: one of `accepts`, a dict of the group's keys to change, or None
    (same as not given)."""
    return field(default=NOT_SET, metadata={"accepts": accepts})


class _Section:
    """Base of the config objects: the walk from set fields to dotted overrides, and a short repr."""

    # Where the section lives in ppo_trainer.yaml; None for sections used in several places.
    PREFIX: ClassVar[str | None] = None
    # Fields that are another name for a deeper key (``kl_coef`` -> ``kl_ctrl.kl_coef``).
    ALIASES: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is NOT_SET:
                continue
            accepts = f.metadata.get("accepts", ())
            if accepts and value is None:  # a group cannot be null: None means "not given" here
                setattr(self, f.name, NOT_SET)
                continue
            if f.name == "extra" and not isinstance(value, Mapping):
                raise TypeError(f"{type(self).__name__}.extra must be a dict of keys relative to the section, "
                                f"got {type(value).__name__}")
            if accepts and not isinstance(value, (*accepts, Mapping)):
                names = " or ".join(c.__name__ for c in accepts)
                raise TypeError(f"{type(self).__name__}.{f.name} must be a {names} (or a dict of its keys), "
                                f"got {type(value).__name__}")
            if not accepts and isinstance(value, _Section):
                raise TypeError(f"{type(self).__name__}.{f.name} is a plain value, got a {type(value).__name__}")
        if self.PREFIX:  # report a key set twice with different values as soon as the object is built
            self.to_overrides()

    def to_overrides(self, prefix: str | None = None) -> dict[str, Any]:
        """``{dotted key: value}`` for every field that was set (nested objects and dicts flattened)."""
        prefix = prefix or self.PREFIX
        if not prefix:
            raise TypeError(f"{type(self).__name__} is used in several places of the config; pass the prefix, "
                            f"e.g. to_overrides('actor_rollout_ref.model')")
        out: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is NOT_SET:
                continue
            if f.name == "extra":
                items = [kv for key, v in value.items() for kv in flatten(f"{prefix}.{key}", v)]
            else:
                items = list(flatten(f"{prefix}.{self._place(f.name, value)}", value))
            for key, v in items:
                if key in out and out[key] != v:
                    raise ConfigError(f"Invalid {type(self).__name__}:",
                                      [self._conflict(key, origin[key], out[key], f.name, v)])
                out[key] = v
                origin.setdefault(key, f.name)
        return out

    def _place(self, name: str, value: Any) -> str:
        """The key, relative to the section, that field `name` holding `value` writes to."""
        return self.ALIASES.get(name, name)

    def _conflict(self, key: str, first: str, first_value: Any, second: str, second_value: Any) -> str:
        return (f"{key}: set twice with different values, by {first}= ({first_value!r}) and by {second}= "
                f"({second_value!r}). Set it once")

    def __repr__(self) -> str:
        set_fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                               if getattr(self, f.name) is not NOT_SET)
        return f"{type(self).__name__}({set_fields})"


def plain_value(value: Any) -> Any:
    """A value OmegaConf stores as the user meant it: paths as strings, tuples as lists."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain_value(v) for k, v in value.items()}
    return value


def flatten(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """Leaf ``(dotted key, value)`` pairs: a nested object or non-empty dict sets only the keys it names."""
    if isinstance(value, _Section):
        yield from value.to_overrides(key).items()
    elif isinstance(value, Mapping) and value:
        for sub, v in value.items():
            if v is not NOT_SET:
                yield from flatten(f"{key}.{sub}" if key else str(sub), v)
    else:
        yield key, plain_value(value)


# --------------------------------------------------------------------------------------------------
# Building blocks used in several sections
# --------------------------------------------------------------------------------------------------


@dataclass(repr=False)
class OptimConfig(_Section):
    """``actor_rollout_ref.actor.optim`` / ``critic.optim``: AdamW and the learning-rate schedule."""

    lr: float = NOT_SET
    weight_decay: float = NOT_SET
    betas: Sequence[float] = NOT_SET
    lr_warmup_steps: int = NOT_SET
    lr_warmup_steps_ratio: float = NOT_SET
    lr_scheduler_type: str = NOT_SET
    warmup_style: str = NOT_SET
    min_lr_ratio: float = NOT_SET
    num_cycles: float = NOT_SET
    total_training_steps: int = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class FSDPConfig(_Section):
    """``fsdp_config`` of the actor, the reference, the critic model or the reward model (FSDP2).

    The reference's group has only wrap_policy, param_offload, reshard_after_forward and
    forward_prefetch; another field set there is reported as an unknown key.
    """

    param_offload: bool = NOT_SET
    optimizer_offload: bool = NOT_SET
    offload_policy: bool = NOT_SET
    reshard_after_forward: bool = NOT_SET
    fsdp_size: int = NOT_SET
    forward_prefetch: bool = NOT_SET
    model_dtype: str = NOT_SET
    dtype: str = NOT_SET
    wrap_policy: dict = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class ModelConfig(_Section):
    """A model group: ``actor_rollout_ref.model``, ``critic.model`` or ``reward_model.model``.

    The three groups share most keys; `input_tokenizer` exists only for the reward model and
    `fsdp_config` only for the critic and reward models (the actor's is `ActorConfig.fsdp_config`).
    A field the group lacks is reported as an unknown key when the config is built.
    """

    path: str = NOT_SET
    tokenizer_path: str = NOT_SET
    hf_config_path: str = NOT_SET
    trust_remote_code: bool = NOT_SET
    enable_gradient_checkpointing: bool = NOT_SET
    enable_activation_offload: bool = NOT_SET
    use_remove_padding: bool = NOT_SET
    use_shm: bool = NOT_SET
    use_liger: bool = NOT_SET
    use_fused_kernels: bool = NOT_SET
    fused_kernel_options: dict = NOT_SET
    external_lib: str = NOT_SET
    override_config: dict = NOT_SET  # free-form: any field of the model's Hugging Face config
    custom_chat_template: str = NOT_SET
    lora_rank: int = NOT_SET
    lora_alpha: int = NOT_SET
    target_modules: Any = NOT_SET
    exclude_modules: Any = NOT_SET
    lora_adapter_path: str = NOT_SET
    input_tokenizer: str = NOT_SET
    fsdp_config: FSDPConfig = _section(FSDPConfig)
    extra: dict = NOT_SET


# --------------------------------------------------------------------------------------------------
# actor_rollout_ref
# --------------------------------------------------------------------------------------------------


@dataclass(repr=False)
class PolicyLossConfig(_Section):
    """``actor_rollout_ref.actor.policy_loss``: which policy loss, and its parameters."""

    PREFIX: ClassVar[str] = "actor_rollout_ref.actor.policy_loss"

    loss_mode: str = NOT_SET
    clip_cov_ratio: float = NOT_SET
    clip_cov_lb: float = NOT_SET
    clip_cov_ub: float = NOT_SET
    kl_cov_ratio: float = NOT_SET
    ppo_kl_coef: float = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class ActorConfig(_Section):
    """``actor_rollout_ref.actor``: the policy update. Batch sizes count prompts."""

    PREFIX: ClassVar[str] = "actor_rollout_ref.actor"

    strategy: str = NOT_SET
    ppo_mini_batch_size: int = NOT_SET
    ppo_micro_batch_size: int = NOT_SET
    ppo_micro_batch_size_per_gpu: int = NOT_SET
    use_dynamic_bsz: bool = NOT_SET
    ppo_max_token_len_per_gpu: int = NOT_SET
    ppo_epochs: int = NOT_SET
    shuffle: bool = NOT_SET
    data_loader_seed: int = NOT_SET
    grad_clip: float = NOT_SET
    clip_ratio: float = NOT_SET
    clip_ratio_low: float = NOT_SET
    clip_ratio_high: float = NOT_SET
    clip_ratio_c: float = NOT_SET
    loss_agg_mode: str = NOT_SET
    loss_scale_factor: float = NOT_SET
    entropy_coeff: float = NOT_SET
    calculate_entropy: bool = NOT_SET
    use_kl_loss: bool = NOT_SET
    kl_loss_coef: float = NOT_SET
    kl_loss_type: str = NOT_SET
    ulysses_sequence_parallel_size: int = NOT_SET
    entropy_from_logits_with_chunking: bool = NOT_SET
    entropy_checkpointing: bool = NOT_SET
    use_torch_compile: bool = NOT_SET
    policy_loss: PolicyLossConfig = _section(PolicyLossConfig)
    checkpoint: dict = NOT_SET
    optim: OptimConfig = _section(OptimConfig)
    fsdp_config: FSDPConfig = _section(FSDPConfig)
    extra: dict = NOT_SET


@dataclass(repr=False)
class RefConfig(_Section):
    """``actor_rollout_ref.ref``: the frozen reference policy (its weights are the actor's initial ones)."""

    PREFIX: ClassVar[str] = "actor_rollout_ref.ref"

    strategy: str = NOT_SET
    log_prob_micro_batch_size: int = NOT_SET
    log_prob_micro_batch_size_per_gpu: int = NOT_SET
    log_prob_use_dynamic_bsz: bool = NOT_SET
    log_prob_max_token_len_per_gpu: int = NOT_SET
    ulysses_sequence_parallel_size: int = NOT_SET
    entropy_from_logits_with_chunking: bool = NOT_SET
    entropy_checkpointing: bool = NOT_SET
    use_torch_compile: bool = NOT_SET
    fsdp_config: FSDPConfig = _section(FSDPConfig)
    extra: dict = NOT_SET


@dataclass(repr=False)
class RolloutConfig(_Section):
    """``actor_rollout_ref.rollout``: the generation engine and sampling."""

    PREFIX: ClassVar[str] = "actor_rollout_ref.rollout"

    name: str = NOT_SET
    mode: str = NOT_SET
    n: int = NOT_SET
    temperature: float = NOT_SET
    top_k: int = NOT_SET
    top_p: float = NOT_SET
    do_sample: bool = NOT_SET
    ignore_eos: bool = NOT_SET
    prompt_length: int = NOT_SET
    response_length: int = NOT_SET
    dtype: str = NOT_SET
    gpu_memory_utilization: float = NOT_SET
    free_cache_engine: bool = NOT_SET
    enforce_eager: bool = NOT_SET
    max_num_batched_tokens: int = NOT_SET
    max_model_len: int = NOT_SET
    max_num_seqs: int = NOT_SET
    calculate_log_probs: bool = NOT_SET
    log_prob_micro_batch_size: int = NOT_SET
    log_prob_micro_batch_size_per_gpu: int = NOT_SET
    log_prob_use_dynamic_bsz: bool = NOT_SET
    log_prob_max_token_len_per_gpu: int = NOT_SET
    tensor_model_parallel_size: int = NOT_SET
    pipeline_model_parallel_size: int = NOT_SET
    expert_parallel_size: int = NOT_SET
    enable_chunked_prefill: bool = NOT_SET
    enable_prefix_caching: bool = NOT_SET
    load_format: str = NOT_SET
    layered_summon: bool = NOT_SET
    disable_log_stats: bool = NOT_SET
    val_kwargs: dict = NOT_SET  # sampling during validation: top_k, top_p, temperature, n, do_sample
    multi_turn: dict = NOT_SET
    engine_kwargs: dict = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class ActorRolloutRefConfig(_Section):
    """``actor_rollout_ref``: the policy model and its three roles, which share the same devices.

    `model` is the policy's model. As in published verl examples, `actor` and `ref` may also be given a
    `ModelConfig`: both then mean this same model group (the reference policy is the actor's initial
    weights), so they must agree with `model` and with each other on every field they set.
    """

    PREFIX: ClassVar[str] = "actor_rollout_ref"

    model: ModelConfig = _section(ModelConfig)
    actor: ActorConfig | ModelConfig = _section(ActorConfig, ModelConfig)
    rollout: RolloutConfig = _section(RolloutConfig)
    ref: RefConfig | ModelConfig = _section(RefConfig, ModelConfig)
    hybrid_engine: bool = NOT_SET
    nccl_timeout: int = NOT_SET
    extra: dict = NOT_SET

    def _place(self, name: str, value: Any) -> str:
        return "model" if isinstance(value, ModelConfig) else name

    def _conflict(self, key: str, first: str, first_value: Any, second: str, second_value: Any) -> str:
        if not {first, second} <= {"model", "actor", "ref"}:
            return super()._conflict(key, first, first_value, second, second_value)
        if "ref" not in (first, second):
            return (f"{key}: the policy model is given twice with different values, by {first}=ModelConfig(...) "
                    f"({first_value!r}) and by {second}=ModelConfig(...) ({second_value!r}). Give it once")
        actor_value, ref_value = (first_value, second_value) if second == "ref" else (second_value, first_value)
        return (f"{key}: ref=ModelConfig(...) sets {ref_value!r} but the actor's model has {actor_value!r}. "
                "The reference policy is the actor's initial weights (loaded from actor_rollout_ref.model); "
                "a separate reference model is not supported. Pass the actor's ModelConfig as ref, or leave "
                "ref out (a RefConfig sets the reference's batch sizes and offload)")


# --------------------------------------------------------------------------------------------------
# The other top-level sections
# --------------------------------------------------------------------------------------------------


@dataclass(repr=False)
class CriticConfig(_Section):
    """``critic``: the value model (GAE/PPO). Used when `enable` is true, or unset with adv_estimator=gae."""

    PREFIX: ClassVar[str] = "critic"

    model: ModelConfig = _section(ModelConfig)
    optim: OptimConfig = _section(OptimConfig)
    enable: bool = NOT_SET
    strategy: str = NOT_SET
    rollout_n: int = NOT_SET
    ppo_mini_batch_size: int = NOT_SET
    ppo_micro_batch_size: int = NOT_SET
    ppo_micro_batch_size_per_gpu: int = NOT_SET
    forward_micro_batch_size: int = NOT_SET
    forward_micro_batch_size_per_gpu: int = NOT_SET
    use_dynamic_bsz: bool = NOT_SET
    ppo_max_token_len_per_gpu: int = NOT_SET
    forward_max_token_len_per_gpu: int = NOT_SET
    ppo_epochs: int = NOT_SET
    shuffle: bool = NOT_SET
    data_loader_seed: int = NOT_SET
    grad_clip: float = NOT_SET
    cliprange_value: float = NOT_SET
    loss_agg_mode: str = NOT_SET
    ulysses_sequence_parallel_size: int = NOT_SET
    use_torch_compile: bool = NOT_SET
    checkpoint: dict = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class RewardModelConfig(_Section):
    """``reward_model``: an optional model-based reward, and the reward manager used for every reward.

    Giving ``model=ModelConfig(path=...)`` without `enable` turns the reward model on (enable=true).
    """

    PREFIX: ClassVar[str] = "reward_model"

    enable: bool = NOT_SET
    model: ModelConfig = _section(ModelConfig)
    reward_manager: str = NOT_SET
    strategy: str = NOT_SET
    enable_resource_pool: bool = NOT_SET
    n_gpus_per_node: int = NOT_SET
    nnodes: int = NOT_SET
    micro_batch_size: int = NOT_SET
    micro_batch_size_per_gpu: int = NOT_SET
    max_length: int = NOT_SET
    ulysses_sequence_parallel_size: int = NOT_SET
    use_dynamic_bsz: bool = NOT_SET
    forward_max_token_len_per_gpu: int = NOT_SET
    launch_reward_fn_async: bool = NOT_SET
    sandbox_fusion: dict = NOT_SET
    overlong_buffer: dict = NOT_SET
    extra: dict = NOT_SET

    def to_overrides(self, prefix: str | None = None) -> dict[str, Any]:
        prefix = prefix or self.PREFIX
        out = super().to_overrides(prefix)
        if self.enable is NOT_SET and out.get(f"{prefix}.model.path") is not None:
            out[f"{prefix}.enable"] = True
        return out


@dataclass(repr=False)
class DataConfig(_Section):
    """``data``: the prompt datasets (parquet) and how prompts are batched and cut to length."""

    PREFIX: ClassVar[str] = "data"

    train_files: str | Sequence[str] = NOT_SET
    val_files: str | Sequence[str] = NOT_SET
    train_batch_size: int = NOT_SET
    max_prompt_length: int = NOT_SET
    max_response_length: int = NOT_SET
    tokenizer: str = NOT_SET
    prompt_key: str = NOT_SET
    reward_fn_key: str = NOT_SET
    train_max_samples: int = NOT_SET
    val_max_samples: int = NOT_SET
    gen_batch_size: int = NOT_SET
    val_batch_size: int = NOT_SET
    return_raw_input_ids: bool = NOT_SET
    return_raw_chat: bool = NOT_SET
    return_full_prompt: bool = NOT_SET
    shuffle: bool = NOT_SET
    seed: int = NOT_SET
    dataloader_num_workers: int = NOT_SET
    validation_shuffle: bool = NOT_SET
    filter_overlong_prompts: bool = NOT_SET
    filter_overlong_prompts_workers: int = NOT_SET
    truncation: str = NOT_SET
    image_key: str = NOT_SET
    video_key: str = NOT_SET
    trust_remote_code: bool = NOT_SET
    return_multi_modal_inputs: bool = NOT_SET
    use_shm: bool = NOT_SET
    apply_chat_template_kwargs: dict = NOT_SET
    custom_cls: dict = NOT_SET
    sampler: dict = NOT_SET
    datagen: dict = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class CustomRewardFunctionConfig(_Section):
    """``custom_reward_function``: ``compute_score(data_source, solution_str, ground_truth, extra_info)``
    defined in the Python file `path` (under the name `name`)."""

    PREFIX: ClassVar[str] = "custom_reward_function"

    path: str = NOT_SET
    name: str = NOT_SET
    reward_kwargs: dict = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class KLControlConfig(_Section):
    """``algorithm.kl_ctrl``: the coefficient of the KL penalty in the reward (fixed or adaptive)."""

    PREFIX: ClassVar[str] = "algorithm.kl_ctrl"

    type: str = NOT_SET
    kl_coef: float = NOT_SET
    horizon: int = NOT_SET
    target_kl: float = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class PPOAlgorithmConfig(_Section):
    """``algorithm``: advantage estimation and KL regularisation.

    `kl_coef` is a shorthand for ``kl_ctrl.kl_coef`` (the in-reward KL coefficient, applied when
    `use_kl_in_reward` is true); giving both with different values is an error.
    """

    PREFIX: ClassVar[str] = "algorithm"
    ALIASES: ClassVar[dict[str, str]] = {"kl_coef": "kl_ctrl.kl_coef"}

    adv_estimator: str = NOT_SET
    gamma: float = NOT_SET
    lam: float = NOT_SET
    norm_adv_by_std_in_grpo: bool = NOT_SET
    use_kl_in_reward: bool = NOT_SET
    kl_penalty: str = NOT_SET
    kl_ctrl: KLControlConfig = _section(KLControlConfig)
    kl_coef: float = NOT_SET
    use_pf_ppo: bool = NOT_SET
    pf_ppo: dict = NOT_SET
    filter_groups: dict = NOT_SET
    extra: dict = NOT_SET


@dataclass(repr=False)
class TrainerConfig(_Section):
    """``trainer``: devices, length of the run, logging, validation and checkpoints."""

    PREFIX: ClassVar[str] = "trainer"

    total_epochs: int = NOT_SET
    total_training_steps: int = NOT_SET
    n_gpus_per_node: int = NOT_SET
    nnodes: int = NOT_SET
    device: str = NOT_SET
    backend: str = NOT_SET
    logger: str | Sequence[str] = NOT_SET
    project_name: str = NOT_SET
    experiment_name: str = NOT_SET
    save_freq: int = NOT_SET
    test_freq: int = NOT_SET
    val_before_train: bool = NOT_SET
    val_only: bool = NOT_SET
    default_local_dir: str = NOT_SET
    default_hdfs_dir: str = NOT_SET
    resume_mode: str = NOT_SET
    resume_from_path: str = NOT_SET
    del_local_ckpt_after_load: bool = NOT_SET
    max_actor_ckpt_to_keep: int = NOT_SET
    max_critic_ckpt_to_keep: int = NOT_SET
    balance_batch: bool = NOT_SET
    critic_warmup: int = NOT_SET
    log_val_generations: int = NOT_SET
    rollout_data_dir: str = NOT_SET
    validation_data_dir: str = NOT_SET
    esi_redundant_time: float = NOT_SET
    ray_wait_register_center_timeout: int = NOT_SET
    use_legacy_worker_impl: str = NOT_SET
    extra: dict = NOT_SET
