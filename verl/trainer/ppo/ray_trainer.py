"""The PPO/GRPO driver: the algorithm's control flow, stage after stage, on one process.

Each training step, as the driver sees it (the stage names are the ``timing_s/<stage>`` metrics):

    prompts --gen--> n responses per prompt --reward--> token_level_scores
      --old_log_prob--> actor log-probs (+ entropy) --ref--> reference log-probs (when KL is used)
      (no old_log_prob stage when the update is on-policy: the update's first forward gives them)
      --values--> critic values (when a critic is used) --adv--> KL in reward, advantages, returns
      --update_critic--> --update_actor--> (the rollout reads the actor's weights: nothing to sync)
      --testing--> every trainer.test_freq steps --save_checkpoint--> every trainer.save_freq steps

Generation, log-probs and updates run in the worker groups (Ray actors, or this process with
``trainer.backend=local``); rewards, advantages and metrics are computed here.
"""

from __future__ import annotations

import copy
import logging
import os
import time
import uuid

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict

from verl.algorithms import agg_loss, apply_kl_penalty, compute_advantage, get_kl_controller, rollout_correction
from verl.data import create_rl_sampler, make_dataloader
from verl.protocol import DataProto
from verl.rewards.generative import GenerativeReward
from verl.rewards.loading import compute_reward
from verl.trainer.config.spec import prompts_per_round, resolve_run
from verl.trainer.ppo import checkpointing
from verl.trainer.ppo.async_rollout import AsyncRollout
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics, compute_rollout_probs_diff, compute_throughout_metrics, compute_timing_metrics, reduce_metrics
)
from verl.trainer.ppo.roles import WorkerGroups
from verl.trainer.ppo.scoring import StepScoring
from verl.trainer.ppo.validation import dump_generations, validate
from verl.utils.profiler import marked_timer
from verl.utils.flops_counter import FlopsCounter
from verl.utils.seqlen_balancing import balance_batch_partitions, log_seqlen_unbalance
from verl.utils.tracking import Tracking

logger = logging.getLogger(__name__)


class DynamicSamplingError(RuntimeError):
    """Dynamic sampling (``algorithm.filter_groups``) ran out of generation rounds for a step."""


class RayPPOTrainer:
    """Runs ``fit()``: the PPO loop over the training set, with validation and checkpoints.

    Args:
        config: the whole validated config (``compose_ppo_config`` + ``validate_config``).
        tokenizer: the policy's tokenizer (used for nothing heavier than metadata here).
        train_dataset / val_dataset: ``RLHFDataset``s; no validation when ``val_dataset`` is None.
        reward_fn / val_reward_fn: reward managers (``load_reward_manager``).
    """

    def __init__(self, config, tokenizer, train_dataset, val_dataset=None, reward_fn=None, val_reward_fn=None):
        self.config, self.tokenizer = config, tokenizer
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        # Everything derived from the config, once (the config itself is never changed): roles, pools,
        # batches, the run's length (the workers' LR schedules need it), gradient checkpointing.
        self.spec = resolve_run(config, train_size=len(train_dataset))
        # DAPO dynamic sampling: prompts come in rounds of data.gen_batch_size until the step has
        # data.train_batch_size prompts whose responses differ in algorithm.filter_groups.metric.
        self.filter_groups = self.spec.algorithm.filter_groups.enable
        _, prompts = prompts_per_round(self.spec.data, self.spec.algorithm)
        self.train_sampler = create_rl_sampler(self.spec.data, train_dataset)
        self.train_dataloader = make_dataloader(train_dataset, batch_size=prompts, sampler=self.train_sampler)
        self.use_critic, self.use_reference_policy, self.use_rm = (
            self.spec.use_critic, self.spec.use_reference_policy, self.spec.use_rm)
        self.kl_ctrl = get_kl_controller(self.spec.algorithm.kl_ctrl) if self.spec.algorithm.use_kl_in_reward else None
        self.total_training_steps = self.spec.total_training_steps
        self.n_devices = self.spec.n_devices
        self.checkpoint_root = os.path.abspath(self.spec.trainer.default_local_dir)
        self.global_steps = 0
        self.policy_version = 0  # actor updates so far: the version that tags what the rollout generates
        self.rollouts: AsyncRollout | None = None  # the asynchronous modes' groups in flight (see fit)
        self._reward_s = 0.0
        self.scoring = StepScoring(self.spec, self.filter_groups)
        self._async_state: dict | None = None  # the groups in flight a resumed checkpoint holds
        self._sync_address: str | None = None  # where the weight-sync group meets (separate_async)
        self.workers: WorkerGroups | None = None
        self.flops_counters: dict[str, FlopsCounter] = {}  # role -> counter of its model

    def init_workers(self) -> None:
        """Start the worker groups (Ray actors or in-process) and load every model."""
        self.workers = WorkerGroups.create(self.spec)
        self.scoring.rm = self.workers.rm
        for reward_fn in (self.reward_fn, self.val_reward_fn):
            if isinstance(reward_fn, GenerativeReward):  # the judge's requests go to the reward-model workers
                reward_fn.router.attach(self.workers.rm.generate_sequences)
        from verl.models.loader import load_hf_config

        models = {"actor": self.spec.actor_rollout_ref.model}
        if self.use_critic:
            models["critic"] = self.spec.critic.model
        device_name = self._device_name()
        for role, model in models.items():
            try:  # the critic is counted from its config as it stands, lm_head included, as the original does
                self.flops_counters[role] = FlopsCounter(
                    load_hf_config(model.path, trust_remote_code=model.trust_remote_code), device_name=device_name)
            except Exception as e:  # MFU is a report, never a reason to stop training
                logger.warning("perf/mfu/%s will read 0: could not read the model config (%s)", role, e)

    def _device_name(self) -> str | None:
        """The device whose peak FLOP/s ``perf/mfu/*`` divides by: the workers' (``trainer.device``). A driver that
        sees no GPU while the workers train on GPUs cannot name theirs: MFU then reads 0, with a warning."""
        if self.spec.trainer.device == "cpu":
            return "CPU"
        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
        logger.warning("perf/mfu/* will read 0: the driver sees no GPU, so it cannot tell the workers' peak FLOP/s")
        return "unknown device"

    def shutdown(self) -> None:
        self.scoring.close()
        for reward_fn in (self.reward_fn, self.val_reward_fn):
            if isinstance(reward_fn, GenerativeReward):
                reward_fn.close()
        if self.workers is not None:
            self.workers.shutdown()
            self.workers = None

    def _save_checkpoint(self) -> None:
        path = checkpointing.step_dir(self.checkpoint_root, self.global_steps)
        self.workers.actor_rollout.save_checkpoint(os.path.join(path, "actor"), self.global_steps)
        if self.use_critic:
            self.workers.critic.save_checkpoint(os.path.join(path, "critic"), self.global_steps)
        checkpointing.save_driver_state(path, {
            "global_step": self.global_steps,
            "dataloader": self.train_dataloader.state_dict(),
            "kl_coef": self.kl_ctrl.value if self.kl_ctrl is not None else None,
            "policy_version": self.policy_version,
            "async_rollout": self.rollouts.state_dict() if self.rollouts is not None else None,
        })
        checkpointing.mark_complete(self.checkpoint_root, self.global_steps)
        trainer = self.spec.trainer
        checkpointing.rotate(self.checkpoint_root, "actor", trainer.max_actor_ckpt_to_keep)
        checkpointing.rotate(self.checkpoint_root, "critic", trainer.max_critic_ckpt_to_keep)

    def _load_checkpoint(self) -> None:
        path = checkpointing.resume_checkpoint(self.spec.trainer)
        if path is None:
            return
        path = os.path.abspath(path)
        if self.spec.trainer.resume_mode != "auto":
            self._load_checkpoint_from(path)
            return
        # Auto-resume: a newest checkpoint that cannot be read (a truncated shard after a crash or a full
        # disk) must not block the run: fall back to the newest earlier one that loads, and say so.
        candidates = [path] + checkpointing.earlier_checkpoints(os.path.dirname(path), checkpointing.step_of(path))
        for i, candidate in enumerate(candidates):
            try:
                self._load_checkpoint_from(candidate)
                return
            except Exception as err:  # noqa: BLE001 -- reported, then the next candidate
                reason = str(err).strip().splitlines()
                logger.warning("cannot resume from %s (%s)%s", candidate, reason[-1] if reason else type(err).__name__,
                               "; trying the previous checkpoint" if i + 1 < len(candidates) else "")
                if i + 1 == len(candidates):
                    raise RuntimeError(
                        f"none of the checkpoints under {os.path.dirname(path)} can be loaded (the newest, {path}: "
                        f"{reason[-1] if reason else type(err).__name__}). Remove the broken step folders, or set "
                        "trainer.resume_mode=disable to start fresh") from err

    def _load_checkpoint_from(self, path: str) -> None:
        logger.warning("resuming from %s", path)
        self.workers.actor_rollout.load_checkpoint(os.path.join(path, "actor"))
        if self.use_critic:
            self.workers.critic.load_checkpoint(os.path.join(path, "critic"))
        state = checkpointing.load_driver_state(path)
        self.train_dataloader.load_state_dict(state["dataloader"])
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = state["kl_coef"]
        self.global_steps = checkpointing.step_of(path)
        self.policy_version = int(state.get("policy_version", self.global_steps))
        self._async_state = state.get("async_rollout")
        if self._async_state is not None and not self.spec.trainer.v1.asynchronous:
            held = len(self._async_state["groups"]) + len(self._async_state["queue"])
            logger.warning("%s was saved by an asynchronous run holding %d prompt(s) not trained yet; this synchronous "
                           "run goes on from the dataloader's position and will not train them", path, held)

    def _balance_batch(self, batch: DataProto, metrics: dict) -> torch.Tensor | None:
        """Reorder the batch so that each data-parallel rank gets a similar number of tokens; returns the order
        (row i is now old row ``order[i]``), None when the rows stay where they are."""
        seqlens = batch.batch["attention_mask"].sum(-1).tolist()
        world = self.workers.actor_rollout.world_size
        if len(seqlens) % world:
            return None
        partitions = balance_batch_partitions(seqlens, world)
        order = torch.tensor([i for part in partitions for i in part])
        batch.reorder(order)
        metrics.update(log_seqlen_unbalance(seqlens, partitions))
        return order

    def _generate(self, batch_dict: dict, timing_raw: dict) -> DataProto:
        """Responses for a batch of prompts (with ReMax, the greedy responses' rewards as ``reward_baselines``)."""
        groups, rollout = self.workers, self.spec.actor_rollout_ref.rollout
        prompts = DataProto.from_single_dict(batch_dict, meta_info={"global_steps": self.global_steps})
        prompts.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
        with marked_timer("gen", timing_raw):
            batch = groups.actor_rollout.generate_sequences(prompts)
        if self.spec.algorithm.adv_estimator == "remax":
            with marked_timer("gen_max", timing_raw):
                batch.batch["reward_baselines"] = self._reward_baselines(prompts, rollout.n)
        return batch

    def _generate_and_score(self, batch_dict: dict, timing_raw: dict) -> DataProto:
        """Responses for a batch of prompts, with ``token_level_scores`` (and the reward's extra info)."""
        batch = self._generate(batch_dict, timing_raw)
        with marked_timer("reward", timing_raw):
            return self.scoring.score(batch, self.reward_fn)

    def _keep_varied_groups(self, batch: DataProto, next_batch, timing_raw: dict, metrics: dict) -> DataProto:
        """DAPO's dynamic sampling: drop the prompt groups whose samples all have the same
        ``filter_groups.metric`` (they carry no GRPO signal) and generate further rounds of
        ``data.gen_batch_size`` prompts until ``data.train_batch_size`` groups remain (the surplus is
        cut) or ``max_num_gen_batches`` rounds were spent (<= 0: no limit)."""
        config = self.spec
        settings, n = config.algorithm.filter_groups, config.actor_rollout_ref.rollout.n
        metric, limit = settings.metric, settings.max_num_gen_batches
        target = config.data.train_batch_size * n
        kept, rounds, generated = [], 0, 0
        while True:
            rounds += 1
            values = self._group_metric(batch, metric)
            uids = batch.non_tensor_batch["uid"]
            spread: dict[str, list[float]] = {}
            for uid, value in zip(uids, values):
                spread.setdefault(uid, []).append(value)
            varied = {uid for uid, vals in spread.items() if len(vals) == 1 or max(vals) > min(vals)}
            generated += len(spread)
            kept.append(batch.select_idxs([uid in varied for uid in uids]))
            have = sum(len(part) for part in kept)
            if have >= target:
                break
            if 0 < limit <= rounds:
                raise DynamicSamplingError(
                    f"algorithm.filter_groups: after {rounds} generation round(s) of data.gen_batch_size="
                    f"{config.data.gen_batch_size} prompts, only {have // n} of the {target // n} prompt groups "
                    f"needed (data.train_batch_size) had samples that differ in {metric!r}. Raise "
                    "algorithm.filter_groups.max_num_gen_batches (0 = no limit) or data.gen_batch_size, or check "
                    "that the reward can tell this policy's responses apart")
            batch = self._generate_and_score(next_batch(), timing_raw)
        batch = DataProto.concat([part for part in kept if len(part)]).slice(0, target)
        metrics.update({"train/num_gen_batches": rounds, "train/num_generated_groups": generated,
                        "train/num_kept_groups": have // n})
        return batch

    @staticmethod
    def _group_metric(batch: DataProto, metric: str) -> list[float]:
        """Per-sample value of ``filter_groups.metric``, as the original reads it: ``acc`` and ``score``
        from the reward's extra info (the ``dapo`` manager records a plain score as ``acc``; ``score``
        falls back to the summed token scores), ``seq_reward`` the summed token scores, and
        ``seq_final_reward`` the same (no KL penalty is applied before filtering)."""
        if metric in ("acc", "score") and metric in batch.non_tensor_batch:
            return [float(v) for v in batch.non_tensor_batch[metric]]
        if metric == "acc":
            raise DynamicSamplingError(
                "algorithm.filter_groups.metric=acc needs an 'acc' per sample from the reward: use "
                "reward_model.reward_manager=dapo (it records the score as acc) or a reward function returning "
                f"{{'score': ..., 'acc': ...}}; the reward gave {sorted(batch.non_tensor_batch)}. Or use metric=score")
        return batch.batch["token_level_scores"].sum(-1).tolist()

    def _reward_baselines(self, batch: DataProto, n: int) -> torch.Tensor:
        """ReMax: the reward of one greedy response per prompt, repeated for its n samples."""
        greedy = batch.select(deepcopy=True)
        greedy.meta_info.update({"do_sample": False, "n": 1})
        greedy = self.workers.actor_rollout.generate_sequences(greedy)
        scores, _ = compute_reward(greedy, self.reward_fn)
        return scores.sum(-1).repeat_interleave(n)

    def _compute_advantage(self, batch: DataProto, scores: torch.Tensor, metrics: dict) -> None:
        algorithm = self.spec.algorithm
        batch.batch["token_level_scores"] = scores
        if self.kl_ctrl is not None:
            rewards, kl_metrics = apply_kl_penalty(scores, batch.batch["old_log_probs"], batch.batch["ref_log_prob"],
                                                   batch.batch["response_mask"], self.kl_ctrl, algorithm.kl_penalty)
            metrics.update(kl_metrics)
        else:
            rewards = scores
        batch.batch["token_level_rewards"] = rewards
        advantages, returns = compute_advantage(
            algorithm.adv_estimator, token_level_rewards=rewards, response_mask=batch.batch["response_mask"],
            index=batch.non_tensor_batch["uid"], values=batch.batch.get("values"),
            reward_baselines=batch.batch.get("reward_baselines"), gamma=algorithm.gamma, lam=algorithm.lam,
            norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm)
        batch.batch["advantages"], batch.batch["returns"] = advantages, returns

    def _add_old_log_probs(self, batch: DataProto, old: DataProto, metrics: dict) -> DataProto:
        """Join the actor's ``old_log_probs`` to the batch; log ``actor/entropy`` from its ``entropys``."""
        entropys = old.batch.pop("entropys")
        metrics["actor/entropy"] = agg_loss(entropys, batch.batch["response_mask"],
                                            self.spec.actor_rollout_ref.actor.loss_agg_mode).item()
        batch = batch.union(old.select(batch_keys=["old_log_probs"], non_tensor_batch_keys=[]))
        if "rollout_log_probs" in batch.batch:
            metrics.update(compute_rollout_probs_diff(batch.batch["rollout_log_probs"], batch.batch["old_log_probs"],
                                                      batch.batch["response_mask"]))
        return batch

    @staticmethod
    def _correct_for_rollout(batch: DataProto, correction, metrics: dict) -> None:
        """Decoupled rollout correction (``algorithm.rollout_correction``) against pi_old: rejected tokens leave
        ``response_mask``, IS weights go to the update as ``rollout_is_weights``, ``rollout_corr/*`` is logged."""
        weights, mask, corr_metrics = rollout_correction(
            batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["response_mask"],
            rollout_is=correction.rollout_is, rollout_is_threshold=correction.rollout_is_threshold,
            rollout_is_batch_normalize=correction.rollout_is_batch_normalize, rollout_rs=correction.rollout_rs,
            rollout_rs_threshold=correction.rollout_rs_threshold)
        batch.batch["response_mask"] = mask
        if weights is not None:
            batch.batch["rollout_is_weights"] = weights
        metrics.update(corr_metrics)

    def _mfu(self, batch: DataProto, timing_raw: dict) -> dict:
        """``perf/mfu/actor`` and (with a critic) ``perf/mfu/critic``: model FLOPs of each update over its time."""
        metrics = {}
        seqlens = None
        for role, section, group in (("actor", self.spec.actor_rollout_ref.actor, "actor_rollout"),
                                     ("critic", self.spec.critic, "critic")):
            if role == "critic" and not self.use_critic:
                continue
            counter, seconds = self.flops_counters.get(role), timing_raw.get(f"update_{role}", 0)
            if counter is None or seconds <= 0:
                metrics[f"perf/mfu/{role}"] = 0.0
                continue
            if seqlens is None:
                seqlens = batch.batch["attention_mask"].sum(-1).tolist()
            achieved, promised = counter.estimate_flops(seqlens, seconds,
                                                        images_seqlens=batch.meta_info.get("images_seqlens"))
            world_size = getattr(self.workers, group).world_size
            metrics[f"perf/mfu/{role}"] = achieved * section.ppo_epochs / promised / world_size
        return metrics

    def train_step(self, batch_dict: dict | None, next_batch=None) -> dict:
        """One PPO step on one batch of prompts; returns the step's metrics. ``next_batch()`` gives
        further batches when dynamic sampling (``algorithm.filter_groups``) needs more prompts. In the
        asynchronous modes the batch comes from the groups in flight (``batch_dict`` is None)."""
        config, groups = self.spec, self.workers
        metrics: dict = {}
        timing_raw: dict = {}
        with marked_timer("start_profile", timing_raw):
            self._profile("start_profile", config.global_profiler.starts_at(self.global_steps))
        with marked_timer("step", timing_raw):
            pending_scores, order = None, None
            if self.rollouts is not None:
                self._reward_s = 0.0
                batch, async_metrics, timing_raw["gen"] = self.rollouts.next_batch(self.policy_version)
                self.rollouts.submit_ahead()  # a rollout that decodes during the update gets the next groups now
                batch.meta_info["global_steps"] = self.global_steps
                timing_raw["reward"] = self._reward_s
                metrics.update(async_metrics)
            elif self.scoring.thread is not None:  # launch_reward_fn_async: scored while the workers compute
                batch, pending_scores = self.scoring.start(self._generate(batch_dict, timing_raw), self.reward_fn,
                                                            timing_raw)
            else:
                batch = self._generate_and_score(batch_dict, timing_raw)
            if self.filter_groups and self.rollouts is None:
                batch = self._keep_varied_groups(batch, next_batch, timing_raw, metrics)
            if config.trainer.balance_batch:
                order = self._balance_batch(batch, metrics)
            batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
            batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
            update_actor = config.trainer.critic_warmup <= self.global_steps
            fused_old_log_prob = config.old_log_prob_in_update and update_actor
            correction = config.algorithm.rollout_correction
            if correction.bypass_mode:  # the rollout's log-probs are the old policy's: no pass to compute them
                batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
            elif not fused_old_log_prob:
                with marked_timer("old_log_prob", timing_raw):
                    batch = self._add_old_log_probs(batch, groups.actor_rollout.compute_log_prob(batch), metrics)
                if "rollout_log_probs" in batch.batch:
                    self._correct_for_rollout(batch, correction, metrics)
            if self.use_reference_policy:
                with marked_timer("ref", timing_raw):
                    batch = batch.union(groups.actor_rollout.compute_ref_log_prob(batch))
            if self.use_critic:
                with marked_timer("values", timing_raw):
                    batch = batch.union(groups.critic.compute_values(batch))
            with marked_timer("adv", timing_raw):  # a wait for the reward thread counts here, as in the original
                if pending_scores is not None:
                    batch = self.scoring.join(batch, pending_scores, order, timing_raw)
                scores = batch.batch["token_level_scores"]
                self._compute_advantage(batch, scores, metrics)

            if self.use_critic:
                with marked_timer("update_critic", timing_raw):
                    metrics.update(reduce_metrics(groups.critic.update_critic(batch).meta_info["metrics"]))
            if update_actor:
                with marked_timer("update_actor", timing_raw):
                    output = groups.actor_rollout.update_actor(batch)
                self.policy_version += 1
                if config.rollout_thread:
                    with marked_timer("update_weights", timing_raw):
                        metrics.update(self._send_weights())
                if fused_old_log_prob:
                    batch = self._add_old_log_probs(batch, output, metrics)
                metrics.update(reduce_metrics(output.meta_info["metrics"]))

            if config.trainer.rollout_data_dir:
                dump_generations(self.tokenizer, batch, scores.sum(-1), self.global_steps,
                                 config.trainer.rollout_data_dir)
        # Validation and checkpoints are timed on their own (timing_s/testing, timing_s/save_checkpoint),
        # outside the step: timing_s/step and perf/throughput measure training, as the original's do.
        is_last_step = self.global_steps >= self.total_training_steps
        test_freq = config.trainer.test_freq
        if self.val_dataset is not None and test_freq > 0 and (is_last_step or self.global_steps % test_freq == 0):
            with marked_timer("testing", timing_raw):
                metrics.update(self._validate())
        save_freq = config.trainer.save_freq
        if save_freq > 0 and (is_last_step or self.global_steps % save_freq == 0):
            with marked_timer("save_checkpoint", timing_raw):
                self._save_checkpoint()
        with marked_timer("stop_profile", timing_raw):
            self._profile("stop_profile", config.global_profiler.stops_at(self.global_steps, last=is_last_step))

        metrics.update({"training/global_step": self.global_steps, "training/epoch": self.train_sampler.epoch})
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch, timing_raw))
        metrics.update(compute_throughout_metrics(batch, timing_raw, n_gpus=self.n_devices))
        metrics.update(self._mfu(batch, timing_raw))
        return metrics

    def _profile(self, method: str, now: bool) -> None:
        """``start_profile``/``stop_profile`` on every worker group, around the steps ``global_profiler.steps``
        lists; each role's own ``profiler`` section says whether it records and on which ranks."""
        if not now:
            return
        groups = self.workers
        separate = groups.rollout if groups.rollout is not groups.actor_rollout else None
        for group in (groups.actor_rollout, separate, groups.critic, groups.rm):
            if group is not None:
                getattr(group, method)(profile_step=self.global_steps)

    def _validate(self) -> dict:
        return validate(self.spec, self.workers.rollout, self.val_dataset, self.val_reward_fn,
                        self.tokenizer, self.global_steps)

    def _send_weights(self) -> dict:
        """The actor's weights to a rollout that decodes during the update (its groups in flight continue with the
        new weights), tagged with the policy version: to the rollout's own workers (``separate_async``), or into
        each rank's colocated copy (``colocate_async.overlap_generation``)."""
        groups = self.workers
        if not self.spec.separate_rollout:
            copied = groups.actor_rollout.update_rollout_weights(self.policy_version)[0]
            return {"perf/weight_sync_gb": copied["bytes"] / 2**30}
        if self._sync_address is None:
            self._sync_address = groups.actor_rollout.weight_sync_address()
        world = 1 + groups.rollout.world_size
        sent = groups.actor_rollout.send_weights(self._sync_address, world)
        received = groups.rollout.receive_weights(self._sync_address, world, self.policy_version)
        stats = sent.get()[0]
        received.get()
        return {"perf/weight_sync_gb": stats.get("bytes", 0) / 2**30,
                "perf/weight_sync_buckets": stats.get("buckets", 0)}

    def _train_batches(self):
        """Batches of prompts, epoch after epoch (the sampler moves to the next epoch each pass). With
        dynamic sampling a step may take several batches: the run then also ends after
        ``trainer.total_epochs`` passes over the data (unless ``total_training_steps`` is set), as
        the original's does, the last step's unfinished rounds dropped."""
        trainer = self.spec.trainer
        bounded = self.filter_groups and not trainer.total_training_steps
        while not bounded or self.train_sampler.epoch < int(trainer.total_epochs):
            yield from self.train_dataloader

    def _async_rollout(self, batches) -> AsyncRollout:
        """The groups in flight of ``trainer.v1.trainer_mode`` (colocate_async or separate_async), restored from
        the checkpoint the run resumed from, if any."""
        v1, algorithm = self.spec.trainer.v1, self.spec.algorithm
        keep_group = None
        if self.filter_groups:
            def keep_group(rows: DataProto) -> bool:  # DAPO: a group whose samples all score alike teaches nothing
                values = self._group_metric(rows, algorithm.filter_groups.metric)
                return len(values) == 1 or max(values) > min(values)

        def score(rows: DataProto) -> DataProto:
            tic = time.perf_counter()
            rows = self.scoring.score(rows, self.reward_fn)
            self._reward_s += time.perf_counter() - tic
            return rows

        rollouts = AsyncRollout(
            batch_size=self.spec.data.train_batch_size, world_size=self.workers.rollout.world_size,
            threshold=v1.sampler.max_off_policy_threshold, strategy=v1.sampler.max_off_policy_strategy,
            warmup_batches=v1.num_warmup_batches, prompts=batches, generate=self.workers.rollout.generate_stream,
            score=score, keep_group=keep_group, ahead_of_update=self.spec.rollout_thread)
        if self._async_state is not None:
            rollouts.load_state_dict(self._async_state, self.policy_version)
        return rollouts

    def _logged_config(self) -> dict:
        """The config as the experiment trackers record it: as given, with what the run resolved filled in."""
        logged, spec = copy.deepcopy(self.config), self.spec
        resolved = {"actor_rollout_ref.actor.optim.total_training_steps": self.total_training_steps,
                    "critic.optim.total_training_steps": self.total_training_steps,
                    "actor_rollout_ref.model.enable_gradient_checkpointing":
                        spec.actor_rollout_ref.model.enable_gradient_checkpointing,
                    "critic.model.enable_gradient_checkpointing": spec.critic.model.enable_gradient_checkpointing}
        with open_dict(logged):
            for key, value in resolved.items():
                OmegaConf.update(logged, key, value, force_add=True)
        return OmegaConf.to_container(logged, resolve=True)

    def fit(self) -> dict:
        """Train for ``total_training_steps`` steps; returns the last step's metrics."""
        trainer = self.spec.trainer
        tracker = Tracking(trainer.project_name, trainer.experiment_name, default_backend=trainer.logger,
                           config=self._logged_config(), total_steps=self.total_training_steps)
        last_metrics: dict = {}
        try:
            self._load_checkpoint()
            if self.spec.rollout_thread and self.policy_version:  # the rollout loaded model.path, not the checkpoint
                self._send_weights()
            if self.global_steps:
                tracker.resumed_at(self.global_steps)
            if self.val_dataset is not None and trainer.val_before_train:
                last_metrics = self._validate()
                tracker.log(last_metrics, step=self.global_steps)
                if trainer.val_only:
                    return last_metrics
            batches = self._train_batches()
            if self.spec.trainer.v1.asynchronous:
                self.rollouts = self._async_rollout(batches)
            while self.global_steps < self.total_training_steps:
                try:
                    batch_dict = None if self.rollouts is not None else next(batches)
                    self.global_steps += 1
                    last_metrics = self.train_step(batch_dict, next_batch=lambda: next(batches))
                except StopIteration:  # dynamic sampling used up trainer.total_epochs passes
                    logger.info("the data's trainer.total_epochs passes are used up after %d steps",
                                self.global_steps - 1)
                    break
                tracker.log(last_metrics, step=self.global_steps)
                self.workers.log_startup(last_metrics)  # once, after the first step: where start-up time went
        finally:
            tracker.finish()
        return last_metrics
