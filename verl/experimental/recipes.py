"""The original's asynchronous recipes mapped onto ``trainer.v1``: their command lines keep their keys, which become
the one trainer's settings before validation.

- ``python -m verl.experimental.one_step_off_policy.main_ppo`` (also ``.async_main_ppo``): the rollout on devices of
  its own (``rollout.nnodes`` x ``rollout.n_gpus_per_node``) generates the next batch while the trainer trains on
  this one: ``separate_async`` with one batch ahead, groups at most one version old (waited for, never dropped),
  the weights sent after every step.
- ``python -m verl.experimental.fully_async_policy.fully_async_main``: the trainer takes ``require_batches`` PPO
  mini-batches per local update and syncs the weights every ``trigger_parameter_sync_step`` updates; here one
  training step is those updates (``data.train_batch_size`` = trigger x require x ``ppo_mini_batch_size``), and
  ``staleness_threshold`` (a fraction of that batch, in the original) is how far the rollout may run ahead, rounded
  up to whole batches, and how many versions old a group may be.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.base_config import ConfigError

__all__ = ["fully_async", "one_step_off"]

V1 = "trainer.v1"
ROLLOUT = "actor_rollout_ref.rollout"


def _separate(config: DictConfig, *, ahead: int, threshold: int, sync_step: int) -> None:
    rollout = config.pop("rollout")
    OmegaConf.update(config, f"{ROLLOUT}.nnodes", rollout.nnodes)
    OmegaConf.update(config, f"{ROLLOUT}.n_gpus_per_node", rollout.n_gpus_per_node)
    OmegaConf.update(config, f"{V1}.trainer_mode", "separate_async")
    OmegaConf.update(config, f"{V1}.separate_async.num_warmup_batches", ahead)
    OmegaConf.update(config, f"{V1}.separate_async.parameter_sync_step", sync_step)
    OmegaConf.update(config, f"{V1}.sampler.max_off_policy_threshold", threshold)
    OmegaConf.update(config, f"{V1}.sampler.max_off_policy_strategy", "wait")
    # The recipes' scripts turn the hybrid engine off to give the rollout its own devices, which is what
    # separate_async does: the trainer's devices still hold the actor and the reference policy together.
    OmegaConf.update(config, "actor_rollout_ref.hybrid_engine", True)


def one_step_off(config: DictConfig) -> DictConfig:
    """``one_step_off_ppo_trainer.yaml`` -> a ``ppo_trainer`` config (see the module docstring)."""
    batch, mini = config.data.train_batch_size, config.actor_rollout_ref.actor.ppo_mini_batch_size
    with open_dict(config):
        _separate(config, ahead=1, threshold=1, sync_step=max(1, batch // mini) if mini else 1)
    return config


def fully_async(config: DictConfig) -> DictConfig:
    """``fully_async_ppo_trainer.yaml`` -> a ``ppo_trainer`` config (see the module docstring)."""
    settings = config.async_training
    problems = []
    staleness = settings.staleness_threshold
    if not isinstance(staleness, (int, float)) or isinstance(staleness, bool) or staleness < 0:
        problems.append(f"async_training.staleness_threshold: must be a number >= 0 (how far, in training batches, "
                        f"the rollout may run ahead), got {staleness!r}")
    for key in ("trigger_parameter_sync_step", "require_batches"):
        value = settings[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"async_training.{key}: must be an integer >= 1, got {value!r}")
    if not settings.partial_rollout:
        problems.append("async_training.partial_rollout: false is not supported here: groups in flight at a weight "
                        "sync always go on with the new weights (their earlier tokens keep their own log-probs). "
                        "Set it to true")
    if settings.use_dynamic_resource_scheduling:
        problems.append("async_training.use_dynamic_resource_scheduling: lending the trainer's devices to the "
                        "rollout is not supported here. Set it to false")
    if problems:
        raise ConfigError("The fully asynchronous recipe's settings cannot run:", problems)
    mini = config.actor_rollout_ref.actor.ppo_mini_batch_size
    updates = settings.trigger_parameter_sync_step * settings.require_batches
    with open_dict(config):
        total_prompts, test_freq = config.rollout.total_rollout_steps, config.rollout.test_freq
        OmegaConf.update(config, f"{ROLLOUT}.n", config.rollout.n)
        config.data.train_batch_size = updates * mini
        config.data.gen_batch_size = "${data.train_batch_size}"
        if total_prompts:
            config.trainer.total_training_steps = max(1, total_prompts // config.data.train_batch_size)
        if test_freq is not None:
            config.trainer.test_freq = test_freq
        bypass = bool(config.actor_rollout_ref.actor.pop("use_rollout_log_probs"))
        config.algorithm.rollout_correction.bypass_mode = config.algorithm.rollout_correction.bypass_mode or bypass
        ahead = math.ceil(staleness)
        _separate(config, ahead=ahead, threshold=ahead, sync_step=updates)
        config.pop("async_training")
    return config
