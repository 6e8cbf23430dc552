"""Config keys that nothing here reads: those only another backend reads, features of the original verl
that this one does not implement, the original's keys that have no effect here, and keys added with ``+``
to a section that has no such setting. Each is reported when set, never silently ignored."""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterator, Mapping

from verl.base_config import BaseConfig
from verl.trainer.config.checks import ACTOR, AR, REF, ROLLOUT, Issue, Run, _format, declared_hint, error, warn
from verl.trainer.config.compose import closest_key, dotted_keys
from verl.workers.rollout.registry import ignored_config_keys

_IGNORED_KEY_REASONS = dict.fromkeys(("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                      "expert_parallel_size"),
                                     "it is data-parallel only: every device holds a full copy of the model")


def check_other_backend_keys(run: Run) -> Iterator[Issue]:
    """Keys that only vLLM/SGLang or Megatron read: a warning names each one set, since nothing reads it here."""
    engine = run.get(f"{ROLLOUT}.name")
    try:
        ignored = ignored_config_keys(engine)
    except ValueError:
        ignored = ()  # check_rollout_engine reports the unknown engine
    for name in ignored:
        key = f"{ROLLOUT}.{name}"
        value = run.get(key)
        if value != run.default(key):
            reason = _IGNORED_KEY_REASONS.get(name, "only external engines such as vLLM/SGLang read it")
            yield warn(key, f"is set to {_format(value)} but the {engine!r} rollout engine ignores it ({reason}). "
                            "Remove it to silence this warning")
    key = "trainer.use_legacy_worker_impl"
    if run.get(key) != run.default(key):
        yield warn(key, "is ignored: there is one worker implementation. Remove it to silence this warning")
    for key in dotted_keys(run.cfg):
        parts = key.split(".")
        if parts[-1] == "megatron" and "megatron" not in parts[:-1]:
            yield warn(key, "Megatron-backend settings are ignored: this verl trains with FSDP2 only. Remove them")


# Keys of the original verl whose feature this verl does not implement (yet), with what setting them
# would change: a feature that changes what is learned is an error, a speed/memory knob a warning.
# Remove a key from here in the change that implements it.
_NOT_IMPLEMENTED_ERRORS = {
    "algorithm.use_pf_ppo": "policy-filtration PPO",
    "data.custom_cls.path": "custom dataset classes",
    "data.sampler.class_path": "custom samplers",
    "data.datagen.path": "dynamic data generation",
    "trainer.default_hdfs_dir": "HDFS checkpoint copies",
}
_NOT_IMPLEMENTED_WARNINGS = (
    "data.use_shm", f"{AR}.model.use_shm", "critic.model.use_shm", "reward_model.model.use_shm",
    f"{AR}.model.hf_config_path", "data.tokenizer", "data.dataloader_num_workers",
    f"{ACTOR}.fsdp_config.wrap_policy.min_num_params", f"{ACTOR}.fsdp_config.forward_prefetch",
    "critic.model.fsdp_config.wrap_policy.min_num_params", "critic.model.fsdp_config.forward_prefetch",
    f"{REF}.fsdp_config.forward_prefetch", "data.filter_overlong_prompts_workers",
    "trainer.log_val_generations", "trainer.del_local_ckpt_after_load",
    "trainer.esi_redundant_time", "trainer.ray_wait_register_center_timeout", "ray_kwargs.timeline_json_file",
    f"{AR}.model.use_liger",
    f"{AR}.model.enable_activation_offload", "critic.model.enable_activation_offload",
    f"{ACTOR}.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size",
    f"{ACTOR}.checkpoint.async_save", "critic.checkpoint.async_save",
)

# Keys of the original verl (its example scripts pass them) that have no effect here, with why.
_CHUNKED_ENTROPY = "log-probs and entropy are always computed from the hidden states in chunks, never from full logits"
_NO_SEQUENCE_PARALLEL = "sequence parallelism (Ulysses) is not implemented: each device holds whole sequences"
_NO_EFFECT = {
    f"{ROLLOUT}.mode": "both modes run the same rollout here (the agent loop in the rollout worker)",
    f"{ACTOR}.calculate_sum_pi_squared": "it feeds the optimal-token-baseline estimator, which is not implemented",
    f"{ACTOR}.use_prefix_grouper": "shared-prefix attention for a prompt's samples is not implemented",
    **dict.fromkeys((f"{ACTOR}.entropy_from_logits_with_chunking", f"{ACTOR}.entropy_checkpointing",
                     f"{ACTOR}.fsdp_config.entropy_from_logits_with_chunking",
                     f"{ACTOR}.fsdp_config.entropy_checkpointing", f"{REF}.entropy_from_logits_with_chunking",
                     f"{REF}.entropy_checkpointing", f"{REF}.fsdp_config.entropy_from_logits_with_chunking"),
                    _CHUNKED_ENTROPY),
    f"{ACTOR}.fsdp_config.use_orig_params": "FSDP2 (fully_shard) always shards the original parameters",
    f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size": _NO_SEQUENCE_PARALLEL,
    f"{REF}.fsdp_config.ulysses_sequence_parallel_size": _NO_SEQUENCE_PARALLEL,
    f"{REF}.fsdp_config.optimizer_offload": "the reference policy has no optimizer",
    f"{ROLLOUT}.cudagraph_capture_sizes": "it sets vLLM's CUDA-graph batch sizes; the native engine picks its own",
    f"{ROLLOUT}.multi_stage_wake_up": "it stages vLLM/SGLang memory; the native engine generates with the actor's "
                                      "own weights",
    f"{ROLLOUT}.over_sample_rate": "over-sampling (cancelling the slowest requests) is not implemented; every "
                                   "request runs to its end",
    f"{ROLLOUT}.data_parallel_size": "it sets vLLM's data parallelism; each rank generates its own share of the rows",
    f"{ROLLOUT}.trace.backend": "rollout tracing (weave, mlflow) is not implemented",
    f"{ROLLOUT}.trace.token2text": "rollout tracing (weave, mlflow) is not implemented",
    "critic.fsdp.param_offload": "the critic reads critic.model.fsdp_config.param_offload (set that instead)",
    "critic.fsdp.optimizer_offload": "the critic reads critic.model.fsdp_config.optimizer_offload (set that "
                                     "instead)",
    "data.image_patch_size": "the model's own image processor sets the patch size",
}
# Keys the original's example scripts add with ``+`` where no setting of that name exists (in the original too,
# for some): (why, the key to set instead or None) for the warning that names them.
_ADDED_KEY_NOTES = {
    f"{ACTOR}.policy_loss.tau_pos": ("the sapo loss reads the actor's tau_pos, as in the original", f"{ACTOR}.tau_pos"),
    f"{ACTOR}.policy_loss.tau_neg": ("the sapo loss reads the actor's tau_neg, as in the original", f"{ACTOR}.tau_neg"),
    f"{AR}.model.lora.merge": ("the LoRA adapter is always merged into the weights the rollout generates with", None),
    "algorithm.gdpo_reward_keys": ("the GDPO advantage estimator is not implemented", None),
}
# Entries of ``fsdp_config.mixed_precision`` the FSDP2 engine reads (FSDP2 has no buffer_dtype).
_MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype")


def check_not_implemented(run: Run) -> Iterator[Issue]:
    """Keys whose feature is not implemented: never silently ignored."""
    def changed(keys):  # (key, value) of the keys set away from their default, not through ${...}
        return [(key, run.get(key)) for key in keys if run.get(key) != run.default(key) and not run.follows(key)]

    for key, value in changed(_NOT_IMPLEMENTED_ERRORS):
        yield error(key, f"is set to {_format(value)}, but {_NOT_IMPLEMENTED_ERRORS[key]} are not implemented in "
                         f"this verl. Remove {key} from the command line")
    for key, value in changed(_NOT_IMPLEMENTED_WARNINGS):
        yield warn(key, f"is set to {_format(value)}, but this verl does not implement it, so it has no "
                        "effect. Remove it to silence this warning")
    for key, value in changed(("reward_model.sandbox_fusion.url", "reward_model.sandbox_fusion.max_concurrent",
                               "reward_model.sandbox_fusion.memory_limit_mb")):
        yield warn(key, f"is set to {_format(value)}, but code rewards (data sources codecontests, apps, "
                        "codeforces, taco) run in the local sandbox (verl.sandbox.process: namespaces, no network, "
                        "CPU/memory/process limits); no SandboxFusion service is called. Remove it to silence "
                        "this warning")
    for key, value in changed(_NO_EFFECT):
        yield warn(key, f"is set to {_format(value)}, but {_NO_EFFECT[key]}, so this key has no effect. Remove it "
                        "to silence this warning")
    for role in (ACTOR, REF, "critic.model", "reward_model.model"):
        key = f"{role}.fsdp_config.mixed_precision"
        for name in sorted(set(run.get(key) or {}) - set(_MIXED_PRECISION_KEYS)):
            yield warn(f"{key}.{name}", f"is not read: FSDP2's mixed precision takes only "
                                        f"{' and '.join(_MIXED_PRECISION_KEYS)}. Remove it to silence this warning")
    yield from check_added_keys(run)
    yield from _check_distillation(run)


def _check_distillation(run: Run) -> Iterator[Issue]:
    """The original's on-policy distillation: enabling it is an error (it changes what is learned); any other
    of its keys set (or teacher added) is a warning."""
    if run.get("distillation.enabled"):
        yield error("distillation.enabled", "is true, but on-policy distillation from teacher models is not "
                                            "implemented in this verl. Remove the distillation.* keys")
    for key, value in _changed_leaves(run.get("distillation") or {}, run.default("distillation") or {},
                                      "distillation."):
        if key != "distillation.enabled" and not run.follows(key):
            yield warn(key, f"is set to {_format(value)}, but on-policy distillation is not implemented, so it has "
                            "no effect here. Remove it to silence this warning")


def _changed_leaves(values: Mapping, defaults: Mapping, prefix: str) -> Iterator[tuple[str, object]]:
    for name, value in values.items():
        default = defaults.get(name) if isinstance(defaults, Mapping) else None
        if isinstance(value, Mapping):
            yield from _changed_leaves(value, default if isinstance(default, Mapping) else {}, f"{prefix}{name}.")
        elif value != default:
            yield f"{prefix}{name}", value


def check_added_keys(run: Run) -> Iterator[Issue]:
    """Keys added with ``+`` to a typed section that has no setting of that name: nothing reads them. (A key
    added inside a free-form dict such as ``override_config`` or ``engine_kwargs`` is passed on as written.)"""
    known = list(dotted_keys(run.defaults))
    for added in _added_keys(run.cfg, run.defaults):
        group, _, name = added.rpartition(".")
        if not _is_typed_group(group) or name == "megatron":  # check_other_backend_keys names Megatron groups
            continue
        value = run.get(added)
        leaves = _changed_leaves(value, {}, f"{added}.") if isinstance(value, Mapping) else [(added, value)]
        for key, leaf in leaves:
            if key in _ADDED_KEY_NOTES:
                why, instead = _ADDED_KEY_NOTES[key]
                fix = f"{why}. Set {instead}={_format(leaf)} instead" if instead else f"{why}. Remove it"
            else:
                guess = closest_key(key, known)
                fix = f"did you mean {guess}?" if guess else "check the name against ppo_trainer.yaml"
            yield warn(key, f"is set to {_format(leaf)} (added with +), but {group} has no setting {name!r} here, "
                            f"so nothing reads it: {fix}")


def _added_keys(values: Mapping, defaults: Mapping, prefix: str = "") -> Iterator[str]:
    """The dotted keys of ``values`` that ``defaults`` lacks (the first missing level of each)."""
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in defaults:
            yield key
        elif isinstance(value, Mapping) and isinstance(defaults[name], Mapping):
            yield from _added_keys(value, defaults[name], f"{key}.")


@functools.cache
def _is_typed_group(key: str) -> bool:
    """Whether ``key`` is a typed config section (a `BaseConfig` of the run spec), not a free-form dict."""
    hint = declared_hint(key)
    options = typing.get_args(hint) or (hint,)
    return any(isinstance(t, type) and issubclass(t, BaseConfig) for t in options)
