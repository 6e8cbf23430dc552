"""The run specification: everything the driver derives from a validated config, decided once.

    spec = resolve_run(config, steps_per_epoch=len(train_dataloader))

A `RunSpec` holds the typed sections (:mod:`verl.workers.config`, :mod:`verl.trainer.config`) and what follows
from them: which roles run, the resource pools and their devices, each role's per-rank batches, the length of
the run, and the gradient-checkpointing choice the memory estimate makes for a model that leaves it unset.
The sections the workers get carry those choices (a new frozen value, never a change of the config): the
config stays as the user wrote it. The config checks, the memory estimate, pre-flight and the Python API call
the same functions below, so a derived setting is decided in one place.
"""

from __future__ import annotations

import dataclasses
import os
import functools
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from verl.trainer.config.algorithm import AlgoConfig
from verl.trainer.config.config import CustomRewardFunctionConfig, DataConfig, TrainerConfig
from verl.utils.profiler.config import GlobalProfilerConfig
from verl.workers.config import ActorRolloutRefConfig, CriticConfig, RewardModelConfig, RolloutConfig
from verl.workers.config.batching import CriticBatching, PolicyBatching, critic_batching, policy_batching

__all__ = ["RunSpec", "need_critic", "need_reference_policy", "pool_layout", "resolve_run"]

# The typed top-level sections of ppo_trainer.yaml.
SECTIONS: dict[str, type] = {
    "data": DataConfig, "actor_rollout_ref": ActorRolloutRefConfig, "critic": CriticConfig,
    "reward_model": RewardModelConfig, "custom_reward_function": CustomRewardFunctionConfig,
    "algorithm": AlgoConfig, "trainer": TrainerConfig, "global_profiler": GlobalProfilerConfig,
}


def need_critic(enable: bool | None, adv_estimator: str) -> bool:
    """``critic.enable`` when set, otherwise a critic exactly when the estimator is GAE."""
    return bool(enable) if enable is not None else adv_estimator == "gae"


def need_reference_policy(use_kl_in_reward: bool, use_kl_loss: bool) -> bool:
    """A frozen reference policy is needed for KL, in the reward or as a loss."""
    return bool(use_kl_in_reward) or bool(use_kl_loss)


def joins_ray_cluster(get: Callable[[str], Any]) -> bool:
    """Whether the run joins a running Ray cluster (``ray_kwargs.ray_init.address``, or ``RAY_ADDRESS`` as
    ``ray job submit`` sets it) instead of starting its own; ``get``: the value of a dotted key."""
    return bool(get("ray_kwargs.ray_init.address")) or bool(os.environ.get("RAY_ADDRESS"))


def worker_backend(get: Callable[[str], Any]) -> str:
    """The backend a run's workers use: ``trainer.backend`` (``get``: the value of a dotted key), with ``auto``
    resolved. ``auto`` runs the workers in the driver's process (``local``) when the whole run is one worker:
    one node of one device (``trainer.nnodes=1``, ``trainer.n_gpus_per_node=1``), no role on devices of its own
    (``critic``/``reward_model.enable_resource_pool``, ``separate_async``'s rollout pool) and no Ray cluster to
    join (:func:`joins_ray_cluster`); otherwise Ray. One process has nothing to schedule, and skipping
    Ray's start and a worker process's imports takes about 13 s off the first step on a GPU
    (docs/benchmarks.md)."""
    backend = get("trainer.backend")
    if backend != "auto":
        return backend
    one_worker = (get("trainer.nnodes") == 1 and get("trainer.n_gpus_per_node") == 1
                  and not get("critic.enable_resource_pool") and not get("reward_model.enable_resource_pool")
                  and get("trainer.v1.trainer_mode") != "separate_async" and not joins_ray_cluster(get))
    return "local" if one_worker else "ray"


def pool_layout(trainer: TrainerConfig, critic: CriticConfig, reward_model: RewardModelConfig, *, use_critic: bool,
                use_rm: bool, rollout: RolloutConfig | None = None) -> tuple[dict[str, list[int]], dict[str, str]]:
    """The resource pools (name -> devices on each node) and the pool of each role: every role shares
    ``global_pool`` unless ``critic.enable_resource_pool`` or ``reward_model.enable_resource_pool`` gives it
    devices of its own; with ``trainer.v1.trainer_mode=separate_async`` the rollout has ``rollout_pool``
    (``rollout.n_gpus_per_node`` x ``rollout.nnodes``), and ``global_pool`` trains."""
    pools = {"global_pool": [trainer.n_gpus_per_node] * trainer.nnodes}
    mapping = {"actor_rollout": "global_pool"}
    if trainer.v1.trainer_mode == "separate_async" and rollout is not None:
        pools["rollout_pool"] = [rollout.n_gpus_per_node] * rollout.nnodes
        mapping["rollout"] = "rollout_pool"
    for role, section, used in (("critic", critic, use_critic), ("rm", reward_model, use_rm)):
        if not used:
            continue
        mapping[role] = "global_pool"
        if section.enable_resource_pool:
            mapping[role] = f"{role}_pool"
            pools[f"{role}_pool"] = [section.n_gpus_per_node] * section.nnodes
    return pools, mapping


@dataclass(frozen=True)
class RunSpec:
    """A validated config, resolved. The sections have the config's names; `actor_rollout_ref` and `critic`
    are what their workers get (total steps and gradient checkpointing filled in)."""

    data: DataConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgoConfig
    trainer: TrainerConfig
    global_profiler: GlobalProfilerConfig
    ray_kwargs: dict
    use_critic: bool
    use_reference_policy: bool
    use_rm: bool
    pools: dict[str, list[int]]  # pool name -> devices on each node
    role_pool: dict[str, str]  # role (actor_rollout, critic, rm) -> its pool
    total_training_steps: int | None  # None until the length of an epoch is known

    @functools.cached_property
    def policy_batching(self) -> PolicyBatching:
        """Per rank of the policy's pool (what its workers compute for themselves)."""
        return policy_batching(self.actor_rollout_ref, self.world_size("actor_rollout"),
                               reference=self.use_reference_policy)

    @functools.cached_property
    def critic_batching(self) -> CriticBatching | None:
        return critic_batching(self.critic, self.world_size("critic")) if self.use_critic else None

    def world_size(self, role: str) -> int:
        """Devices of the pool ``role`` runs on."""
        return sum(self.pools[self.role_pool[role]])

    @property
    def separate_rollout(self) -> bool:
        """Whether the rollout runs on devices of its own (``separate_async``)."""
        return "rollout" in self.role_pool

    @property
    def colocated_rollout_copy(self) -> bool:
        """Whether the colocated rollout decodes on a thread of its own from its own copy of the weights, refreshed
        after every update (``colocate_async.overlap_generation``)."""
        v1 = self.trainer.v1
        return v1.trainer_mode == "colocate_async" and v1.colocate_async.overlap_generation

    @property
    def rollout_thread(self) -> bool:
        """Whether generation goes on while the trainer trains (separate_async, or colocate_async overlapping)."""
        return self.separate_rollout or self.colocated_rollout_copy

    @property
    def n_devices(self) -> int:
        return sum(sum(layout) for layout in self.pools.values())

    @property
    def old_log_prob_in_update(self) -> bool:
        """An on-policy update (one epoch, one mini-batch of the whole batch) with nothing reading the old
        log-probs before it (no KL in the reward, no rollout correction): they are the update's first forward,
        so the separate pass is skipped."""
        actor = self.actor_rollout_ref.actor
        return (actor.ppo_epochs == 1 and not self.algorithm.use_kl_in_reward
                and not self.algorithm.rollout_correction.enabled
                and actor.ppo_mini_batch_size == self.data.train_batch_size)

    def unset_checkpointing(self) -> list[str]:
        """The model sections whose ``enable_gradient_checkpointing`` is unset (null)."""
        models = {"actor_rollout_ref.model": self.actor_rollout_ref.model}
        if self.use_critic:
            models["critic.model"] = self.critic.model
        return [key for key, model in models.items() if model.enable_gradient_checkpointing is None]

    def with_checkpointing(self, sections: list[str], value: bool) -> RunSpec:
        """This spec with ``enable_gradient_checkpointing`` = ``value`` for the model ``sections``."""
        policy, critic = self.actor_rollout_ref, self.critic
        checkpointed = functools.partial(dataclasses.replace, enable_gradient_checkpointing=value)
        if "actor_rollout_ref.model" in sections:
            policy = dataclasses.replace(policy, model=checkpointed(policy.model))
        if "critic.model" in sections:
            critic = dataclasses.replace(critic, model=checkpointed(critic.model))
        return dataclasses.replace(self, actor_rollout_ref=policy, critic=critic)


def prompts_per_round(data: DataConfig, algorithm: AlgoConfig) -> tuple[str, int]:
    """``(key, prompts)``: the prompts the trainer draws per generation round, ``data.train_batch_size``, or
    ``data.gen_batch_size`` with DAPO's dynamic sampling (``algorithm.filter_groups``)."""
    key = "gen_batch_size" if algorithm.filter_groups.enable else "train_batch_size"
    return key, getattr(data, key)


def resolve_run(config: Any, *, train_size: int | None = None, choose_checkpointing: bool = True,
                choose_engine: bool = True, device_bytes: int | None = None, log=print) -> RunSpec:
    """The `RunSpec` of a validated config (an OmegaConf node or a dict of the whole trainer config).

    ``train_size`` (prompts in the training set) gives the run's length when ``trainer.total_training_steps``
    is unset: full batches per pass times ``trainer.total_epochs``; the LR schedules of the actor and critic
    get it (a set smaller than one batch is a ValueError naming the key). With
    ``choose_checkpointing``, a model whose ``enable_gradient_checkpointing`` is unset gets the memory
    estimate's choice (:func:`verl.trainer.plan.resolve_gradient_checkpointing`; ``device_bytes``: the GPU's
    size, default the one this process sees), reported through ``log``. With ``choose_engine``, a model the native
    rollout engine cannot run generates with ``hf`` (:func:`verl.trainer.rollout_engine.choose_rollout_engine`).
    """
    section = {name: cls.from_config(config.get(name)) for name, cls in SECTIONS.items()}
    policy, critic, trainer = section["actor_rollout_ref"], section["critic"], section["trainer"]
    critic = dataclasses.replace(critic, rollout_n=policy.rollout.n)  # the critic sees the actor's samples
    use_critic = need_critic(critic.enable, section["algorithm"].adv_estimator)
    use_reference_policy = need_reference_policy(section["algorithm"].use_kl_in_reward, policy.actor.use_kl_loss)
    use_rm = section["reward_model"].enable
    pools, role_pool = pool_layout(trainer, critic, section["reward_model"], use_critic=use_critic, use_rm=use_rm,
                                   rollout=policy.rollout)

    total = trainer.total_training_steps
    if train_size is not None:
        key, prompts = prompts_per_round(section["data"], section["algorithm"])
        if train_size < prompts:
            raise ValueError(f"the training set has {train_size} prompts, fewer than data.{key}={prompts}; "
                             f"lower data.{key}")
        total = total or train_size // prompts * trainer.total_epochs
    if total:
        policy = dataclasses.replace(policy, actor=dataclasses.replace(
            policy.actor, optim=dataclasses.replace(policy.actor.optim, total_training_steps=int(total))))
        critic = dataclasses.replace(critic, optim=dataclasses.replace(critic.optim, total_training_steps=int(total)))

    ray_kwargs = config.get("ray_kwargs") or {}
    if type(ray_kwargs).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        ray_kwargs = OmegaConf.to_container(ray_kwargs, resolve=True)
    resolved = {"trainer.backend": trainer.backend, "trainer.nnodes": trainer.nnodes,
                "trainer.n_gpus_per_node": trainer.n_gpus_per_node, "trainer.v1.trainer_mode": trainer.v1.trainer_mode,
                "critic.enable_resource_pool": critic.enable_resource_pool,
                "reward_model.enable_resource_pool": section["reward_model"].enable_resource_pool,
                "ray_kwargs.ray_init.address": (ray_kwargs.get("ray_init") or {}).get("address")}
    section["trainer"] = dataclasses.replace(trainer, backend=worker_backend(resolved.__getitem__))
    spec = RunSpec(
        **{**section, "actor_rollout_ref": policy, "critic": critic}, ray_kwargs=dict(ray_kwargs),
        use_critic=use_critic, use_reference_policy=use_reference_policy, use_rm=use_rm, pools=pools,
        role_pool=role_pool, total_training_steps=int(total) if total else None)
    if choose_engine:
        from verl.trainer.rollout_engine import choose_rollout_engine

        spec = choose_rollout_engine(spec, log=log)
    if choose_checkpointing and spec.unset_checkpointing():
        from verl.trainer.plan import resolve_gradient_checkpointing

        spec = resolve_gradient_checkpointing(spec, log=log, device_bytes=device_bytes)
    return spec
