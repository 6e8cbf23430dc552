"""Which roles a run needs, and the worker groups that play them.

All roles share one resource pool: one worker process per device (``trainer.n_gpus_per_node`` x
``trainer.nnodes``) holds the actor, the rollout and the reference policy, and the critic and the
reward model when they are used, so they time-share the device (verl's "hybrid engine").
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.single_controller import ClassWithInitArgs


def need_critic(config) -> bool:
    """``critic.enable`` when set, otherwise a critic exactly when the estimator is GAE."""
    enable = config.critic.get("enable")
    return bool(enable) if enable is not None else config.algorithm.adv_estimator == "gae"


def need_reference_policy(config) -> bool:
    """A frozen reference policy is needed for KL, in the reward or as a loss."""
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


@dataclass
class WorkerGroups:
    actor_rollout: object
    critic: object | None = None
    rm: object | None = None

    @classmethod
    def create(cls, config, *, use_critic: bool, use_rm: bool, use_reference_policy: bool) -> "WorkerGroups":
        from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

        role = "actor_rollout_ref" if use_reference_policy else "actor_rollout"
        roles = {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config=config.actor_rollout_ref, role=role)}
        if use_critic:
            roles["critic"] = ClassWithInitArgs(CriticWorker, config=config.critic,
                                                rollout_n=config.actor_rollout_ref.rollout.n)
        if use_rm:
            roles["rm"] = ClassWithInitArgs(RewardModelWorker, config=config.reward_model)
        trainer = config.trainer
        if trainer.backend == "local":
            from verl.single_controller.local import create_colocated_worker_groups

            groups = create_colocated_worker_groups(None, roles, device=trainer.device)
        else:
            from verl.single_controller.ray import ResourcePool, create_colocated_worker_groups, init_ray

            init_ray(config.ray_kwargs, device=trainer.device)
            pool = ResourcePool([trainer.n_gpus_per_node] * trainer.nnodes, use_gpu=trainer.device == "cuda",
                                name="global_pool")
            groups = create_colocated_worker_groups(pool, roles, device=trainer.device)
        workers = cls(actor_rollout=groups["actor_rollout"], critic=groups.get("critic"), rm=groups.get("rm"))
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
        self.actor_rollout.shutdown()  # colocated roles share their processes: this stops all of them
