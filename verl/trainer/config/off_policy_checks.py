"""Checks of training on samples another policy generated, before any worker starts: the trainer's mode
(``trainer.v1.*``: asynchronous generation, its staleness bound, the separate rollout pool and how weights reach
it) and ``algorithm.rollout_correction.*`` (importance weights, rejection, bypass mode)."""

from __future__ import annotations

from collections.abc import Iterator

from verl.algorithms.rollout_correction import (IS_LEVELS, RS_KEY, RS_THRESHOLD_KEY, parse_rollout_rs,
                                                parse_rollout_rs_thresholds)
from verl.trainer.config.checks import ACTOR, AR, ROLLOUT, Issue, Run, _format, _not_in, _positive_int, error, warn

CORR = "algorithm.rollout_correction"
LOSS_TYPES = ("ppo_clip", "reinforce")
V1 = "trainer.v1"
TRAINER_MODES = ("sync", "colocate_async", "separate_async")
STRATEGIES = ("drop", "wait")
CHECKPOINT_BACKENDS = ("naive", "nccl")


def _count(run: Run, key: str, minimum: int) -> Iterator[Issue]:
    value = run.get(key)
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
        yield error(key, f"must be an integer >= {minimum}, got {_format(value)}")


def check_trainer_mode(run: Run) -> Iterator[Issue]:
    """``trainer.v1``: a known mode, a staleness bound >= 0, and what each asynchronous mode needs, so that an
    impossible combination stops before any worker starts."""
    mode = run.get(f"{V1}.trainer_mode")
    if mode not in TRAINER_MODES:
        yield _not_in(f"{V1}.trainer_mode", mode, TRAINER_MODES)
        return
    yield from _count(run, f"{V1}.sampler.max_off_policy_threshold", 0)
    if run.get(f"{V1}.sampler.max_off_policy_strategy") not in STRATEGIES:
        yield _not_in(f"{V1}.sampler.max_off_policy_strategy", run.get(f"{V1}.sampler.max_off_policy_strategy"),
                      STRATEGIES)
    for part in ("path", "name"):
        if run.get(f"{V1}.sampler.custom_sampler.{part}") is not None:
            yield error(f"{V1}.sampler.custom_sampler.{part}", "a sampler class of one's own is not supported here. "
                        "Remove it; max_off_policy_threshold and max_off_policy_strategy choose the groups")
    if run.get(f"{V1}.separate_async.hybrid_rollout.enable_switch"):
        yield error(f"{V1}.separate_async.hybrid_rollout.enable_switch",
                    "lending idle trainer devices to the rollout is not supported here. Set it to false, and balance "
                    f"{ROLLOUT}.n_gpus_per_node x nnodes against the trainer's devices instead")
    backend = run.get(f"{ROLLOUT}.checkpoint_engine.backend")
    if backend not in CHECKPOINT_BACKENDS:
        yield _not_in(f"{ROLLOUT}.checkpoint_engine.backend", backend, CHECKPOINT_BACKENDS, "checkpoint engine here")
    yield from _count(run, f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes", 1)
    if mode == "sync":
        return
    yield from _count(run, f"{V1}.{mode}.num_warmup_batches", 0)
    why = f"{V1}.trainer_mode={mode}"
    if run.get(f"{ROLLOUT}.name") != "native":
        yield error(f"{ROLLOUT}.name", f"{why} needs the native rollout engine, which can suspend a generation and "
                                       f"resume it with new weights; {run.get(f'{ROLLOUT}.name')!r} cannot. Set "
                                       f"{ROLLOUT}.name=native, or {V1}.trainer_mode=sync")
    if run.get(f"{ROLLOUT}.multi_turn.enable"):
        yield error(f"{ROLLOUT}.multi_turn.enable", f"multi-turn rollouts run in {V1}.trainer_mode=sync only here. "
                                                    f"Set {V1}.trainer_mode=sync")
    if run.get("algorithm.filter_groups.enable") and run.get("algorithm.filter_groups.max_num_gen_batches"):
        yield warn("algorithm.filter_groups.max_num_gen_batches", f"is not read with {why}: a group the filter drops "
                                                                  "is replaced by a new prompt, without a limit")
    if run.get("algorithm.adv_estimator") == "remax":
        yield error("algorithm.adv_estimator", f"remax generates a greedy baseline with the current policy every step, "
                                               f"which {why} does not do. Use grpo or rloo, or {V1}.trainer_mode=sync")
    if mode == "colocate_async":
        if backend == "nccl":
            yield error(f"{ROLLOUT}.checkpoint_engine.backend", "colocate_async generates with the actor's own "
                                                                "weights: nothing is sent. Set it to naive (nccl is "
                                                                "for separate_async)")
        if run.get(f"{V1}.colocate_async.overlap_generation") and run.get(f"{AR}.model.lora_rank"):
            yield error(f"{V1}.colocate_async.overlap_generation", "LoRA with a rollout that decodes during the "
                        "update is not supported here (its copy would need the merged weights after every update). "
                        "Set it to false")
        return
    yield from _separate_async(run, backend)


def _separate_async(run: Run, backend) -> Iterator[Issue]:
    nodes, per_node = run.get(f"{ROLLOUT}.nnodes"), run.get(f"{ROLLOUT}.n_gpus_per_node")
    if not (_positive_int(nodes) and _positive_int(per_node)):
        yield error(f"{ROLLOUT}.nnodes", f"separate_async runs the rollout on devices of its own, but {ROLLOUT}.nnodes="
                                         f"{_format(nodes)} x n_gpus_per_node={_format(per_node)} gives it none. Set "
                                         f"{ROLLOUT}.nnodes=1 and {ROLLOUT}.n_gpus_per_node=<devices>, or use "
                                         f"{V1}.trainer_mode=colocate_async to share the trainer's devices")
    if backend == "naive":
        yield error(f"{ROLLOUT}.checkpoint_engine.backend", "separate_async must send the weights to the rollout's own "
                                                            "devices; naive sends nothing. Set it to nccl")
    if run.get("trainer.backend") == "local":
        yield error("trainer.backend", "separate_async needs two pools of workers, which the local backend (one "
                                       "process) does not have. Set trainer.backend=ray")
    if run.get(f"{AR}.model.lora_rank"):
        yield error(f"{AR}.model.lora_rank", "LoRA with separate_async is not supported here (the rollout would need "
                                             f"the merged weights at every sync). Use {V1}.trainer_mode=colocate_async")
    steps, mini, batch = (run.get(f"{V1}.separate_async.parameter_sync_step"), run.get(f"{ACTOR}.ppo_mini_batch_size"),
                          run.get("data.train_batch_size"))
    yield from _count(run, f"{V1}.separate_async.parameter_sync_step", 1)
    if all(_positive_int(v) for v in (steps, mini, batch)) and steps * mini != batch:
        fix = (f"Set it to {batch // mini}" if batch % mini == 0 else
               f"Make data.train_batch_size a multiple of {ACTOR}.ppo_mini_batch_size")
        yield error(f"{V1}.separate_async.parameter_sync_step",
                    f"is {steps}, but data.train_batch_size={batch} / {ACTOR}.ppo_mini_batch_size={mini} makes "
                    f"{batch / mini:g} PPO mini-batches per training step, after which the weights go to the "
                    f"rollout. {fix}")


def check_async_keys_in_sync_mode(run: Run) -> Iterator[Issue]:
    """Settings that only the asynchronous modes read, set while the trainer is synchronous: a warning each."""
    if run.get(f"{V1}.trainer_mode") != "sync":
        return
    for key in (f"{V1}.sampler.max_off_policy_threshold", f"{V1}.sampler.max_off_policy_strategy",
                f"{V1}.colocate_async.num_warmup_batches", f"{V1}.colocate_async.overlap_generation",
                f"{V1}.separate_async.num_warmup_batches",
                f"{V1}.separate_async.parameter_sync_step", f"{ROLLOUT}.nnodes"):
        if run.get(key) != run.default(key):
            yield warn(key, f"is read only by the asynchronous modes, and {V1}.trainer_mode=sync. Set {V1}.trainer_mode"
                            "=colocate_async or separate_async, or remove it")


def check_rollout_correction(run: Run) -> Iterator[Issue]:
    rollout_is, rollout_rs = run.get(f"{CORR}.rollout_is"), run.get(f"{CORR}.rollout_rs")
    bypass = bool(run.get(f"{CORR}.bypass_mode"))
    if rollout_is is not None and rollout_is not in IS_LEVELS:
        yield _not_in(f"{CORR}.rollout_is", rollout_is, [*IS_LEVELS, "null"])
    threshold = run.get(f"{CORR}.rollout_is_threshold")
    if rollout_is is not None and not (isinstance(threshold, (int, float)) and threshold > 0):
        yield error(f"{CORR}.rollout_is_threshold", f"must be a number > 0 (the IS weights' upper truncation), got "
                                                    f"{_format(threshold)}. The usual value is 2.0")
    if rollout_rs is not None:
        try:
            parse_rollout_rs_thresholds(parse_rollout_rs(rollout_rs), run.get(f"{CORR}.rollout_rs_threshold"))
        except ValueError as err:  # the message starts with the key it is about
            key = RS_THRESHOLD_KEY if str(err).startswith(RS_THRESHOLD_KEY) else RS_KEY
            yield error(key, str(err).split(": ", 1)[-1])
    loss_type = run.get(f"{CORR}.loss_type")
    if loss_type not in LOSS_TYPES:
        yield _not_in(f"{CORR}.loss_type", loss_type, LOSS_TYPES)
    needed = [what for what, used in (("rollout_is", rollout_is is not None), ("rollout_rs", rollout_rs is not None),
                                      ("bypass_mode", bypass)) if used]
    if needed and not run.get(f"{ROLLOUT}.calculate_log_probs"):
        yield error(f"{ROLLOUT}.calculate_log_probs",
                    f"is false, but {CORR}.{needed[0]} needs the rollout's own log-probs (the behaviour policy). Set "
                    f"{ROLLOUT}.calculate_log_probs=true")
