"""Which roles a run needs, and the worker groups that play them.

By default all roles share one resource pool: one worker process per device
(``trainer.n_gpus_per_node`` x ``trainer.nnodes``) holds the actor, the rollout and the reference
policy, and the critic and the reward model when they are used, so they time-share the device
(verl's "hybrid engine"). The critic or the reward model can get a pool of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.single_controller import ClassWithInitArgs


def need_critic(config) -> bool:
    """``critic.enable`` when set, otherwise a critic exactly when the estimator is GAE."""
    enable = config.critic.get("enable")
    return bool(enable) if enable is not None else config.algorithm.adv_estimator == "gae"


def need_reference_policy(config) -> bool:
    """A frozen reference policy is needed for KL, in the reward or as a loss."""
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def pool_layout(config, *, use_critic: bool, use_rm: bool) -> tuple[dict[str, list[int]], dict[str, str]]:
    """The resource pools (name -> devices on each node) and the pool of each role.

    Every role shares ``global_pool`` unless ``critic.enable_resource_pool`` or
    ``reward_model.enable_resource_pool`` gives it devices of its own.
    """
    trainer = config.trainer
    pools = {"global_pool": [trainer.n_gpus_per_node] * trainer.nnodes}
    mapping = {"actor_rollout": "global_pool"}
    for role, section, used in (("critic", config.critic, use_critic), ("rm", config.reward_model, use_rm)):
        if not used:
            continue
        mapping[role] = "global_pool"
        if section.get("enable_resource_pool"):
            mapping[role] = f"{role}_pool"
            pools[f"{role}_pool"] = [section.n_gpus_per_node] * section.nnodes
    return pools, mapping


def total_devices(config, *, use_critic: bool, use_rm: bool) -> int:
    pools, _ = pool_layout(config, use_critic=use_critic, use_rm=use_rm)
    return sum(sum(layout) for layout in pools.values())


@dataclass
class WorkerGroups:
    actor_rollout: object
    critic: object | None = None
    rm: object | None = None
    hosts: list = field(default_factory=list)  # one group per pool: stopping it stops the pool's processes

    @classmethod
    def create(cls, config, *, use_critic: bool, use_rm: bool, use_reference_policy: bool) -> "WorkerGroups":
        from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

        role = "actor_rollout_ref" if use_reference_policy else "actor_rollout"
        timeout = config.actor_rollout_ref.nccl_timeout  # every role: whichever joins first sets the group's
        roles = {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config=config.actor_rollout_ref, role=role,
                                                    nccl_timeout_s=timeout)}
        if use_critic:
            roles["critic"] = ClassWithInitArgs(CriticWorker, config=config.critic, nccl_timeout_s=timeout,
                                                rollout_n=config.actor_rollout_ref.rollout.n)
        if use_rm:
            roles["rm"] = ClassWithInitArgs(RewardModelWorker, config=config.reward_model, nccl_timeout_s=timeout)
        pools, mapping = pool_layout(config, use_critic=use_critic, use_rm=use_rm)
        trainer = config.trainer
        if trainer.backend == "local":
            from verl.single_controller.local import create_colocated_worker_groups

            def make_pool(name, layout):
                return None  # the local backend has one process: every pool is this process
        else:
            from verl.single_controller.ray import ResourcePool, create_colocated_worker_groups, init_ray

            init_ray(config.ray_kwargs, device=trainer.device)

            def make_pool(name, layout):
                return ResourcePool(layout, use_gpu=trainer.device == "cuda", name=name)

        groups, hosts = {}, []
        for pool_name, layout in pools.items():
            pool_roles = {r: c for r, c in roles.items() if mapping[r] == pool_name}
            made = create_colocated_worker_groups(make_pool(pool_name, layout), pool_roles, device=trainer.device)
            groups.update(made)
            hosts.append(next(iter(made.values())))
        workers = cls(actor_rollout=groups["actor_rollout"], critic=groups.get("critic"), rm=groups.get("rm"),
                      hosts=hosts)
        try:
            # The critic and the reward model load first, the actor last (it needs the most memory).
            for group in (workers.critic, workers.rm, workers.actor_rollout):
                if group is not None:
                    group.init_model()
        except BaseException:
            workers.shutdown()
            raise
        return workers

    def shutdown(self) -> None:
        for host in self.hosts:
            host.shutdown()
