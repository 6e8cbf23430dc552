"""Every config key that the original verl's FSDP ``main_ppo`` example scripts pass is accepted here, and none
is silently ignored: it reaches the run spec (a typed field, or a free-form dict passed on as written) or a
config issue (warning or error) names it.

The list below holds each key of the original's ``examples/**/*.sh`` that run ``verl.trainer.main_ppo`` with
FSDP (not Megatron, not VeOmni) once, written as the scripts write it (``+`` where they add the key), with a value
of its type other than our default (the scripts' own where they give a literal).
"""

import functools
import logging
import pathlib
import re

import pytest
from omegaconf import OmegaConf

import verl
from verl.base_config import BaseConfig, at
from verl.trainer.config import PPO_CONFIG_NAME
from verl.trainer.config.checks import Run, check_types
from verl.trainer.config.compose import compose_ppo_config, default_config_values, dotted_keys
from verl.trainer.config.reward_section import reward_keys
from verl.trainer.config.reward_section_checks import name_reward_keys
from verl.trainer.config.spec import resolve_run
from verl.trainer.config_validation import CHECKS, ConfigError, validate_config

ORIGINAL_EXAMPLE_OVERRIDES = [
    "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.actor.clip_ratio_high=0.1",
    "actor_rollout_ref.actor.clip_ratio_low=0.1",
    "actor_rollout_ref.actor.entropy_checkpointing=true",
    "actor_rollout_ref.actor.entropy_coeff=0.001",
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing=true",
    "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking=true",
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bf16",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
    "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.actor.fsdp_config.use_orig_params=true",
    "actor_rollout_ref.actor.grad_clip=0.5",
    "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.kl_loss_type=mse",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "actor_rollout_ref.actor.optim.lr=5e-07",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
    "actor_rollout_ref.actor.optim.optimizer=AdamW8bit",
    "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
    "+actor_rollout_ref.actor.policy_loss.tau_neg=1.5",
    "+actor_rollout_ref.actor.policy_loss.tau_pos=1.25",
    "actor_rollout_ref.actor.ppo_epochs=2",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3000",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.profiler.all_ranks=true",
    "actor_rollout_ref.actor.profiler.enable=true",
    "actor_rollout_ref.actor.profiler.ranks=[x]",
    "actor_rollout_ref.actor.profiler.tool_config.npu.analysis=false",
    "actor_rollout_ref.actor.profiler.tool_config.npu.contents=[x]",
    "actor_rollout_ref.actor.profiler.tool_config.npu.discrete=true",
    "actor_rollout_ref.actor.profiler.tool_config.npu.level=level1",
    "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu,cuda]",
    "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true",
    "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=1",
    "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.repeat=1",
    "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.skip_first=1",
    "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.wait=1",
    "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.warmup=1",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.actor.use_dynamic_bsz=false",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.use_prefix_grouper=true",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "actor_rollout_ref.model.enable_activation_offload=true",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    "actor_rollout_ref.model.exclude_modules='.*visual.*'",
    "+actor_rollout_ref.model.lora.merge=true",
    "actor_rollout_ref.model.lora_adapter_path=adapters/lora",
    "actor_rollout_ref.model.lora_alpha=17",
    "actor_rollout_ref.model.lora_rank=2",
    "actor_rollout_ref.model.path=models/policy",
    "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
    "actor_rollout_ref.model.trust_remote_code=true",
    "actor_rollout_ref.model.use_fused_kernels=true",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.model.use_shm=true",
    "actor_rollout_ref.nccl_timeout=14400",
    "actor_rollout_ref.ref.entropy_checkpointing=true",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking=true",
    "actor_rollout_ref.ref.fsdp_config.entropy_from_logits_with_chunking=true",
    "actor_rollout_ref.ref.fsdp_config.forward_prefetch=true",
    "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16",
    "actor_rollout_ref.ref.fsdp_config.offload_policy=true",
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload=true",
    "actor_rollout_ref.ref.fsdp_config.param_offload=true",
    "actor_rollout_ref.ref.fsdp_config.reshard_after_forward=false",
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=8192",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",
    "actor_rollout_ref.ref.profiler.all_ranks=true",
    "actor_rollout_ref.ref.profiler.enable=true",
    "actor_rollout_ref.ref.profiler.ranks=[x]",
    "actor_rollout_ref.ref.profiler.tool_config.npu.analysis=false",
    "actor_rollout_ref.ref.profiler.tool_config.npu.contents=[x]",
    "actor_rollout_ref.ref.profiler.tool_config.npu.discrete=true",
    "actor_rollout_ref.ref.profiler.tool_config.npu.level=level1",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.ref.use_torch_compile=false",
    "actor_rollout_ref.rollout.calculate_log_probs=false",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096",
    "actor_rollout_ref.rollout.cudagraph_capture_sizes=[8,16,32,64,128,192,256]",
    "actor_rollout_ref.rollout.enable_chunked_prefill=false",
    "actor_rollout_ref.rollout.enable_prefix_caching=false",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=ascend",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes=[4,8,12,16,24,32,48,56,64]",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=FULL_DECODE_ONLY",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.mm_processor_cache_gb=0",
    "actor_rollout_ref.rollout.free_cache_engine=false",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.ignore_eos=true",
    "actor_rollout_ref.rollout.layered_summon=true",
    "actor_rollout_ref.rollout.load_format=auto",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
    "actor_rollout_ref.rollout.max_model_len=4096",
    "actor_rollout_ref.rollout.max_num_batched_tokens=32768",
    "actor_rollout_ref.rollout.max_num_seqs=64",
    "actor_rollout_ref.rollout.multi_stage_wake_up=true",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.name=sglang",
    "actor_rollout_ref.rollout.profiler.all_ranks=true",
    "actor_rollout_ref.rollout.profiler.enable=true",
    "actor_rollout_ref.rollout.profiler.ranks=[x]",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.contents=[cpu,cuda]",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=true",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end=64",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_start=1",
    "actor_rollout_ref.rollout.prompt_length=2048",
    "actor_rollout_ref.rollout.response_length=1024",
    "actor_rollout_ref.rollout.temperature=0.5",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.top_k=2",
    "actor_rollout_ref.rollout.top_p=0.5",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
    "actor_rollout_ref.rollout.val_kwargs.n=2",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.top_k=2",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "algorithm.adv_estimator=gdpo",
    "algorithm.gamma=0.5",
    "+algorithm.gdpo_reward_keys=[accuracy_reward,format_reward]",
    "algorithm.kl_ctrl.kl_coef=0.0",
    "algorithm.kl_penalty=mse",
    "algorithm.rollout_correction.bypass_mode=true",
    "algorithm.rollout_correction.loss_type=reinforce",
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_is_batch_normalize=true",
    "algorithm.rollout_correction.rollout_is_threshold=1.0",
    "algorithm.rollout_correction.rollout_rs=token_k1",
    "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
    "algorithm.use_kl_in_reward=true",
    "critic.fsdp.optimizer_offload=true",
    "critic.fsdp.param_offload=true",
    "critic.model.enable_gradient_checkpointing=true",
    "critic.model.path=models/critic",
    "critic.model.use_remove_padding=false",
    "critic.optim.lr=5e-06",
    "critic.ppo_max_token_len_per_gpu=32769",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "critic.ulysses_sequence_parallel_size=2",
    "critic.use_dynamic_bsz=true",
    "+data.apply_chat_template_kwargs.reasoning_effort=high",
    "data.custom_cls.name=MyDataset",
    "data.custom_cls.path=my_dataset.py",
    "data.filter_overlong_prompts=true",
    "data.filter_overlong_prompts_workers=8",
    "data.image_key=image",
    "data.image_patch_size=16",
    "data.max_prompt_length=1024",
    "data.max_response_length=1024",
    "data.prompt_key=question",
    "data.return_raw_chat=false",
    "data.shuffle=false",
    "data.train_batch_size=128",
    "data.train_files=data/train.parquet",
    "data.truncation=left",
    "data.trust_remote_code=true",
    "data.val_files=data/test.parquet",
    "distillation.distillation_loss.log_prob_min_clamp=-10.0",
    "distillation.distillation_loss.loss_max_clamp=10.0",
    "distillation.distillation_loss.loss_mode=forward_kl",
    "distillation.distillation_loss.topk=33",
    "distillation.distillation_loss.use_policy_gradient=true",
    "distillation.distillation_loss.use_task_rewards=false",
    "distillation.enabled=true",
    "distillation.n_gpus_per_node=9",
    "distillation.nnodes=2",
    "distillation.teacher_key=teacher",
    "+distillation.teacher_models.geo3k.inference.gpu_memory_utilization=0.3",
    "+distillation.teacher_models.geo3k.inference.max_model_len=4096",
    "+distillation.teacher_models.geo3k.inference.name=vllm",
    "+distillation.teacher_models.geo3k.inference.tensor_model_parallel_size=1",
    "+distillation.teacher_models.geo3k.key=hiyouga/geometry3k",
    "+distillation.teacher_models.geo3k.model_path=models/teacher",
    "+distillation.teacher_models.geo3k.num_replicas=1",
    "+distillation.teacher_models.gsm8k.inference.gpu_memory_utilization=0.3",
    "+distillation.teacher_models.gsm8k.inference.max_model_len=4096",
    "+distillation.teacher_models.gsm8k.inference.name=vllm",
    "+distillation.teacher_models.gsm8k.inference.tensor_model_parallel_size=1",
    "+distillation.teacher_models.gsm8k.key=openai/gsm8k",
    "+distillation.teacher_models.gsm8k.model_path=models/teacher",
    "+distillation.teacher_models.gsm8k.num_replicas=1",
    "distillation.teacher_models.teacher_model.inference.expert_parallel_size=2",
    "distillation.teacher_models.teacher_model.inference.gpu_memory_utilization=0.25",
    "distillation.teacher_models.teacher_model.inference.max_model_len=4096",
    "distillation.teacher_models.teacher_model.inference.name=vllm",
    "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=3",
    "distillation.teacher_models.teacher_model.model_path=models/teacher",
    "global_profiler.finish_hook_cmd=echo",
    "global_profiler.global_tool_config.torch_memory.stack_depth=33",
    "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=100001",
    "global_profiler.relocate_results=true",
    "global_profiler.save_path=outputs/traces",
    "global_profiler.steps=[1,2]",
    "global_profiler.tool=npu",
    "+ray_kwargs.ray_init.num_gpus=8",
    "+ray_kwargs.ray_init.runtime_env.env_vars.TRANSFER_QUEUE_ENABLE=1",
    "reward.custom_reward_function.name=compute_score",
    "reward.custom_reward_function.path=verl/utils/reward_score/openr1mm.py",
    "reward.num_workers=2",
    "reward.reward_manager.name=gdpo",
    "reward.reward_model.enable=true",
    "reward.reward_model.model_path=models/rm",
    "reward.reward_model.rollout.gpu_memory_utilization=0.3",
    "reward.reward_model.rollout.name=vllm",
    "reward.reward_model.rollout.prompt_length=1024",
    "reward.reward_model.rollout.response_length=1024",
    "reward.reward_model.rollout.tensor_model_parallel_size=1",
    "trainer.balance_batch=false",
    "trainer.critic_warmup=2",
    "trainer.default_local_dir=ckpt/run1",
    "trainer.device=npu",
    "trainer.experiment_name=ppo_clip_multi_rs",
    "trainer.logger=[console,wandb]",
    "trainer.max_actor_ckpt_to_keep=1",
    "trainer.max_critic_ckpt_to_keep=1",
    "trainer.n_gpus_per_node=16",
    "trainer.nnodes=4",
    "trainer.project_name=rollout_corr_multi_rs_example",
    "trainer.resume_from_path=checkpoints/",
    "trainer.resume_mode=disable",
    "trainer.save_freq=5",
    "trainer.test_freq=5",
    "trainer.total_epochs=1",
    "trainer.total_training_steps=15",
    "trainer.val_before_train=false",
]

# Keys other changes own (the reward loop, the asynchronous trainer, rollout correction): listed for
# completeness, checked by their own tests. The reward.* keys are checked here: each reaches the reward_model.* or
# custom_reward_function.* key it stands for (verl/trainer/config/reward_section.py), or an issue names it.
OWNED_ELSEWHERE = ("reward_model.use_reward_loop", "reward_model.num_workers",
                   "reward_model.rollout.", "trainer.v1.", "algorithm.rollout_correction.")


# Set to what runs here anyway, so nothing needs saying: the judge of a generative reward model is never split over
# devices (verl/trainer/config/reward_loop_checks.py warns only for a larger value).
AS_RUN_HERE = ("reward.reward_model.rollout.tensor_model_parallel_size=1",)


def _key(override: str) -> str:
    return override.lstrip("+").partition("=")[0]


CHECKED = [o for o in ORIGINAL_EXAMPLE_OVERRIDES
           if not _key(o).startswith(OWNED_ELSEWHERE)]
# The scripts' engines (vllm, sglang) are not shipped: rollout.name is checked on its own below, and the combined
# config keeps the native engine, whose warnings name the engine-only keys the scripts set.
ENGINE = "actor_rollout_ref.rollout.name"
COMBINED = [o for o in CHECKED if _key(o) != ENGINE]


@pytest.fixture(scope="module")
def combined():
    """One config with every checked key set at once, its issues, and its run spec."""
    config = compose_ppo_config(COMBINED)  # an unknown key would raise ConfigError here, naming every one
    values = OmegaConf.to_container(config, resolve=True)
    run = Run(cfg=values, defaults=default_config_values(PPO_CONFIG_NAME),
              raw=OmegaConf.to_container(config, resolve=False))
    issues = name_reward_keys(list(check_types(run)) + [issue for check in CHECKS for issue in check(run)], run)
    spec = resolve_run(config, choose_checkpointing=False, choose_engine=False, log=lambda *a: None)
    return values, issues, spec


def _spec_field(spec, key: str, value) -> str | None:
    """The name of the typed field ``key`` reaches in the spec holding ``value`` (for a key inside a dict field,
    that dict's field), or None."""
    node, field = spec, None
    for part in key.split("."):
        if isinstance(node, BaseConfig) or hasattr(node, "__dataclass_fields__"):
            if part not in node.__dataclass_fields__:
                return None  # a key a section received without a field: nothing reads it
            node, field = getattr(node, part), part
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return field if node == value else None


# Where the typed sections are declared and where config keys are checked: a field named only there is read by
# no code. (verl/workers/config/batching.py and verl/trainer/config/spec.py derive settings: they count.)
_DECLARING = ("workers/config/__init__.py", "workers/config/actor.py", "workers/config/critic.py",
              "workers/config/engine.py", "workers/config/model.py", "workers/config/optimizer.py",
              "workers/config/reward_model.py", "workers/config/rollout.py", "trainer/config/__init__.py",
              "trainer/config/algorithm.py", "trainer/config/config.py", "trainer/config/compose.py",
              "trainer/config/unused_keys.py", "trainer/config/reward_section.py", "utils/profiler/config.py",
              "workers/rollout/registry.py")  # the registry lists the keys each engine ignores
_CHECKS = "trainer/config/"  # the *_checks.py and checks.py modules: they validate, they do not use


def _declaring(relative: str) -> bool:
    return relative.startswith(_DECLARING) or (relative.startswith(_CHECKS) and relative.endswith("checks.py"))


@pytest.fixture(scope="module")
def code_text():
    root = pathlib.Path(verl.__file__).parent
    return "\n".join(p.read_text() for p in root.rglob("*.py") if not _declaring(str(p.relative_to(root))))


def _read_by_code(field: str, code_text: str) -> bool:
    # verl/workers/config/batching.py reads the micro-batch sizes as getattr(section, f"{name}_per_gpu")
    field = field.removesuffix("_per_gpu") if field.endswith("micro_batch_size_per_gpu") else field
    return re.search(rf"\.{field}\b|[\"']{field}[\"']", code_text) is not None


@functools.cache
def _references() -> dict[str, list[str]]:
    """key -> the keys whose default is ``${key}`` or ``${oc.select:key,...}``."""
    raw = OmegaConf.to_container(compose_ppo_config([]), resolve=False)
    references: dict[str, list[str]] = {}
    for key in dotted_keys(raw):
        match = re.fullmatch(r"\$\{(?:oc\.select:)?([\w.]+)(?:,[^}]*)?\}", str(at(raw, key)))
        if match:
            references.setdefault(match.group(1), []).append(key)
    return references


def _followers(key: str) -> list[str]:
    """The keys that follow ``key``: it reaches the code through them (each role's
    profiler.tool_config.torch_memory follows global_profiler.global_tool_config.torch_memory)."""
    return _references().get(key, [])


def test_the_scripts_engines_stop_with_the_fix():
    engines = {o.partition("=")[2] for o in CHECKED if _key(o) == ENGINE}
    assert engines
    for engine in engines:
        with pytest.raises(ConfigError, match=rf"{ENGINE}: .*'{engine}'.*Set {ENGINE}="):
            warnings_of(f"{ENGINE}={engine}")


def test_the_list_is_the_originals_whole_set():
    keys = [_key(o) for o in ORIGINAL_EXAMPLE_OVERRIDES]
    assert len(keys) == len(set(keys)) == 243
    assert len(CHECKED) > 180


def test_every_key_composes_as_the_scripts_write_it(combined):
    values, _, _ = combined
    for override in COMBINED:
        assert at(values, _key(override)) is not None, override


def test_no_key_is_silently_ignored(combined, code_text):
    values, issues, spec = combined
    named = {issue.key for issue in issues}
    silent = []
    for override in COMBINED:
        key = _key(override)
        if override in AS_RUN_HERE:
            continue
        if any(n == key or key.startswith(f"{n}.") or n.startswith(f"{key}.") for n in named):
            continue  # a warning or an error names it
        key = reward_keys().get(key, key)  # a reward.* key: the key it stands for here
        fields = [_spec_field(spec, k, at(values, k)) for k in (key, *_followers(key))]
        if not any(field is not None and _read_by_code(field, code_text) for field in fields):
            silent.append(override)
    assert silent == [], "\n".join(silent)


# ---- the notes for keys that have no effect here --------------------------------------------------------------

SEED = ["data.train_files=data/train.parquet", "data.val_files=data/test.parquet",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.actor.use_dynamic_bsz=true"]


def warnings_of(*overrides):
    logging.getLogger("verl.config").disabled = True
    try:
        return validate_config(compose_ppo_config([*SEED, *overrides]))
    finally:
        logging.getLogger("verl.config").disabled = False


def test_the_defaults_draw_no_note():
    assert warnings_of() == []


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.fsdp_config.use_orig_params=true",
     "is set to true, but FSDP2 (fully_shard) always shards the original parameters, so this key has no effect"),
    ("actor_rollout_ref.rollout.mode=sync", "both modes run the same rollout here"),
    ("actor_rollout_ref.ref.fsdp_config.optimizer_offload=true", "the reference policy has no optimizer"),
    ("critic.fsdp.param_offload=true", "the critic reads critic.model.fsdp_config.param_offload (set that instead)"),
    ("actor_rollout_ref.actor.entropy_checkpointing=true", "always computed from the hidden states in chunks"),
    ("+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
     "is not read: FSDP2's mixed precision takes only param_dtype and reduce_dtype"),
])
def test_a_key_without_effect_here_is_named_with_the_reason(override, message):
    named = [w for w in warnings_of(override) if w.startswith(f"{_key(override)}: ")]
    assert len(named) == 1 and message in named[0], named


def test_a_key_added_to_a_typed_section_is_named_with_the_closest_setting():
    warnings = warnings_of("+actor_rollout_ref.actor.optim.betaz=[0.9,0.95]",
                           "+actor_rollout_ref.model.lora.merge=true")
    assert ("actor_rollout_ref.actor.optim.betaz: is set to [0.9,0.95] (added with +), but "
            "actor_rollout_ref.actor.optim has no setting 'betaz' here, so nothing reads it: did you mean "
            "actor_rollout_ref.actor.optim.betas?") in warnings
    assert any(w.startswith("actor_rollout_ref.model.lora.merge: is set to true (added with +)")
               and "always merged" in w for w in warnings)


def test_keys_added_to_free_form_dicts_are_passed_on_without_a_note():
    assert warnings_of("+data.apply_chat_template_kwargs.enable_thinking=false",
                       "+actor_rollout_ref.model.override_config.attn_implementation=eager",
                       "+ray_kwargs.ray_init.num_gpus=8") == []


def test_distillation_is_refused_when_enabled_and_its_other_keys_are_noted():
    assert warnings_of("distillation.teacher_models.teacher_model.model_path=models/teacher") == [
        "distillation.teacher_models.teacher_model.model_path: is set to models/teacher, but on-policy distillation "
        "is not implemented, so it has no effect here. Remove it to silence this warning"]
    with pytest.raises(ConfigError, match=r"distillation.enabled: is true, but on-policy distillation"):
        warnings_of("distillation.enabled=true")
