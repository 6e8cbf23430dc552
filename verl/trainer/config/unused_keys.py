"""Config keys that nothing here reads: those only another backend reads, and features of the
original verl that this one does not implement. Each is reported when set, never silently ignored."""

from __future__ import annotations

from collections.abc import Iterator

from verl.trainer.config.checks import ACTOR, AR, ROLLOUT, Issue, Run, _format, error, warn
from verl.trainer.config.compose import dotted_keys
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
    f"{ROLLOUT}.mode", "trainer.log_val_generations", "trainer.del_local_ckpt_after_load",
    "trainer.esi_redundant_time", "trainer.ray_wait_register_center_timeout", "ray_kwargs.timeline_json_file",
    f"{AR}.model.use_liger",
    f"{AR}.model.enable_activation_offload", "critic.model.enable_activation_offload",
    f"{ACTOR}.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size",
    f"{ACTOR}.checkpoint.async_save", "critic.checkpoint.async_save",
    "reward_model.launch_reward_fn_async",
)


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
