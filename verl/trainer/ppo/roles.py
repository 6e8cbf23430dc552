"""The worker groups that play a run's roles (which roles, on which pools: the run's `RunSpec`).

By default all roles share one resource pool: one worker process per device
(``trainer.n_gpus_per_node`` x ``trainer.nnodes``) holds the actor, the rollout and the reference
policy, and the critic and the reward model when they are used, so they time-share the device
(verl's "hybrid engine"). The critic or the reward model can get a pool of their own, and so can the rollout
with ``trainer.v1.trainer_mode=separate_async`` (its workers then hold a copy of the model each and receive the
actor's weights); each pool's processes load their models at the same time as the others'.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from verl.workers.config.reward_model import uses_generative_reward
from verl.single_controller import ClassWithInitArgs
from verl.trainer.config.spec import RunSpec
from verl.utils import startup

logger = logging.getLogger(__name__)


@dataclass
class WorkerGroups:
    actor_rollout: object  # the actor (and the reference policy; and the rollout, unless it has its own pool)
    critic: object | None = None
    rm: object | None = None
    rollout: object | None = None  # the group that generates: actor_rollout, or the separate_async rollout's own
    hosts: list = field(default_factory=list)  # one group per pool: stopping it stops the pool's processes
    pools: list = field(default_factory=list)  # the Ray resource pools, given back at shutdown

    def __post_init__(self):
        if self.rollout is None:
            self.rollout = self.actor_rollout

    @classmethod
    def create(cls, spec: RunSpec) -> "WorkerGroups":
        """Start the worker groups of ``spec``'s roles on its pools and load every model."""
        from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

        role = "actor_rollout_ref" if spec.use_reference_policy else "actor_rollout"
        if spec.separate_rollout:
            role = role.replace("_rollout", "")
        timeout = spec.actor_rollout_ref.nccl_timeout  # every role: whichever joins first sets the group's
        roles = {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config=spec.actor_rollout_ref, role=role,
                                                    nccl_timeout_s=timeout, rollout_copy=spec.colocated_rollout_copy)}
        if spec.separate_rollout:
            roles["rollout"] = ClassWithInitArgs(ActorRolloutRefWorker, config=spec.actor_rollout_ref, role="rollout",
                                                 nccl_timeout_s=timeout)
        if spec.use_critic:
            roles["critic"] = ClassWithInitArgs(CriticWorker, config=spec.critic, nccl_timeout_s=timeout)
        if spec.use_rm:
            generative = uses_generative_reward(spec.reward_model.enable, spec.reward_model.use_reward_loop,
                                                spec.custom_reward_function.path)
            roles["rm"] = ClassWithInitArgs(RewardModelWorker, config=spec.reward_model, nccl_timeout_s=timeout,
                                            generative=generative)
        with startup.DRIVER.phase("workers"):
            groups, hosts, pools = start_groups(spec.trainer, spec.ray_kwargs, {
                name: (layout, {r: c for r, c in roles.items() if spec.role_pool[r] == name})
                for name, layout in spec.pools.items()})
        workers = cls(actor_rollout=groups["actor_rollout"], critic=groups.get("critic"), rm=groups.get("rm"),
                      rollout=groups.get("rollout"), hosts=hosts, pools=pools)
        try:
            # All started at once: roles with pools of their own load at the same time. Colocated roles share
            # a process, which runs the calls in this order: the critic and the reward model first, the actor
            # last (it needs the most memory).
            with startup.DRIVER.phase("init_model"):
                separate = workers.rollout if workers.rollout is not workers.actor_rollout else None
                order = (workers.critic, workers.rm, separate, workers.actor_rollout)
                loading = [group.execute_all_async("init_model") for group in order if group is not None]
                for future in loading:
                    future.get()
        except BaseException:
            workers.shutdown()
            raise
        return workers

    def log_startup(self, step_metrics: dict) -> None:
        """Call after each training step: after the process's first, logs at INFO where the time from the
        process start went (:func:`verl.utils.startup.format_report`), with each pool's worker phases."""
        if startup.DRIVER.reported or not logger.isEnabledFor(logging.INFO):
            return
        startup.DRIVER.reported = True
        try:
            workers = {host.name: startup.slowest(host.startup_phases()) for host in self.hosts}
        except Exception as e:  # a report, never a reason to stop training
            logger.warning("start-up report skipped: could not read the workers' phases (%s)", e)
            return
        stages = {key.split("/", 1)[1]: value for key, value in step_metrics.items() if key.startswith("timing_s/")}
        logger.info("%s", startup.format_report(startup.DRIVER, workers, stages))

    def shutdown(self) -> None:
        """Stop every worker and give the pools' reserved resources back (a Ray cluster that outlives the run,
        e.g. several runs from one Python session, would otherwise keep them reserved)."""
        for host in self.hosts:
            host.shutdown()
        for pool in self.pools:
            pool.remove()


def start_groups(trainer, ray_kwargs, pools: dict) -> tuple[dict, list, list]:
    """``pools`` is ``{pool name: (devices on each node, {role: ClassWithInitArgs})}``; starts each pool's roles
    colocated (Ray actors, or this process with ``trainer.backend=local``). Returns the role groups, one host group
    per pool (stopping it stops the pool's processes) and the Ray resource pools (none with the local backend)."""
    if trainer.backend == "local":
        from verl.single_controller.local import create_colocated_worker_groups
    else:
        from verl.single_controller.ray import RayResourcePool, create_colocated_worker_groups, init_ray

        init_ray(ray_kwargs, device=trainer.device)
    groups, hosts, resource_pools = {}, [], []
    try:
        for name, (layout, roles) in pools.items():
            pool = None
            if trainer.backend != "local":  # the local backend has one process: every pool is this process
                pool = RayResourcePool(layout, use_gpu=trainer.device == "cuda", name_prefix=name)
                resource_pools.append(pool)
            made = create_colocated_worker_groups(pool, roles, device=trainer.device)
            groups.update(made)
            hosts.append(next(iter(made.values())))
    except BaseException:  # a pool that cannot start: the ones already started give their resources back
        for host in hosts:
            host.shutdown()
        for pool in resource_pools:
            pool.remove()
        raise
    return groups, hosts, resource_pools
