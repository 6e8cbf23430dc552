"""The worker groups that play a run's roles (which roles, on which pools: the run's `RunSpec`).

By default all roles share one resource pool: one worker process per device
(``trainer.n_gpus_per_node`` x ``trainer.nnodes``) holds the actor, the rollout and the reference
policy, and the critic and the reward model when they are used, so they time-share the device
(verl's "hybrid engine"). The critic or the reward model can get a pool of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.single_controller import ClassWithInitArgs
from verl.trainer.config.spec import RunSpec


@dataclass
class WorkerGroups:
    actor_rollout: object
    critic: object | None = None
    rm: object | None = None
    hosts: list = field(default_factory=list)  # one group per pool: stopping it stops the pool's processes

    @classmethod
    def create(cls, spec: RunSpec) -> "WorkerGroups":
        """Start the worker groups of ``spec``'s roles on its pools and load every model."""
        from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

        role = "actor_rollout_ref" if spec.use_reference_policy else "actor_rollout"
        timeout = spec.actor_rollout_ref.nccl_timeout  # every role: whichever joins first sets the group's
        roles = {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config=spec.actor_rollout_ref, role=role,
                                                    nccl_timeout_s=timeout)}
        if spec.use_critic:
            roles["critic"] = ClassWithInitArgs(CriticWorker, config=spec.critic, nccl_timeout_s=timeout)
        if spec.use_rm:
            roles["rm"] = ClassWithInitArgs(RewardModelWorker, config=spec.reward_model, nccl_timeout_s=timeout)
        groups, hosts, _ = start_groups(spec.trainer, spec.ray_kwargs, {
            name: (layout, {r: c for r, c in roles.items() if spec.role_pool[r] == name})
            for name, layout in spec.pools.items()})
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


def start_groups(trainer, ray_kwargs, pools: dict) -> tuple[dict, list, list]:
    """``pools`` is ``{pool name: (devices on each node, {role: ClassWithInitArgs})}``; starts each pool's roles
    colocated (Ray actors, or this process with ``trainer.backend=local``). Returns the role groups, one host group
    per pool (stopping it stops the pool's processes) and the Ray resource pools (none with the local backend)."""
    if trainer.backend == "local":
        from verl.single_controller.local import create_colocated_worker_groups
    else:
        from verl.single_controller.ray import ResourcePool, create_colocated_worker_groups, init_ray

        init_ray(ray_kwargs, device=trainer.device)
    groups, hosts, resource_pools = {}, [], []
    for name, (layout, roles) in pools.items():
        pool = None
        if trainer.backend != "local":  # the local backend has one process: every pool is this process
            pool = ResourcePool(layout, use_gpu=trainer.device == "cuda", name=name)
            resource_pools.append(pool)
        made = create_colocated_worker_groups(pool, roles, device=trainer.device)
        groups.update(made)
        hosts.append(next(iter(made.values())))
    return groups, hosts, resource_pools
