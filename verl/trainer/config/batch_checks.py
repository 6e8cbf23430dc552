"""Config checks of batch sizes: micro-batch keys (rows or token budgets), the split of batches over
devices and into mini/micro-batches, and DAPO dynamic sampling's generation batch. Part of the
checks :func:`verl.trainer.config_validation.validate_config` runs (see :mod:`.checks` for the rest)."""

from __future__ import annotations

from collections.abc import Iterator

from verl.trainer.config.checks import ACTOR, AR, ROLLOUT, Issue, Run, _positive_int, error, warn
from verl.workers.config.batching import POLICY_PHASES, micro_rows_per_device, uses_token_budget


def _by_tokens(run: Run, section: str, dynamic_key: str) -> bool:
    """Whether ``section`` sizes micro batches by a token budget (see :func:`uses_token_budget`)."""
    model = f"{AR}.model" if section.startswith(AR) else f"{section}.model"
    return uses_token_budget(run.get(dynamic_key), run.get(f"{model}.use_remove_padding", False))


def _micro_batch_roles(run: Run) -> list[tuple[str, str, str]]:
    """(section, micro batch key name, dynamic-batch flag) of the roles this run uses."""
    phases = ["update", "log_prob"] + ["ref_log_prob"] * run.uses_ref
    roles = [(f"{AR}.{where}", name, f"{AR}.{where}.{dynamic}")
             for where, name, dynamic, _ in (POLICY_PHASES[phase] for phase in phases)]
    if run.uses_critic:
        roles.append(("critic", "ppo_micro_batch_size", "critic.use_dynamic_bsz"))
    if run.uses_reward_model:
        roles.append(("reward_model", "micro_batch_size", "reward_model.use_dynamic_bsz"))
    return roles


def check_micro_batch_pairs(run: Run) -> Iterator[Issue]:
    """Exactly one of ``<x>_micro_batch_size`` (deprecated, global) and ``<x>_micro_batch_size_per_gpu``."""
    unused = []
    for section, name, dynamic_key in _micro_batch_roles(run):
        global_key, gpu_key = f"{section}.{name}", f"{section}.{name}_per_gpu"
        global_value, gpu_value = run.get(global_key), run.get(gpu_key)
        if _by_tokens(run, section, dynamic_key):  # sized by the token budget; the row counts are not used
            if run.get(dynamic_key) is None:
                unused += [k for k, v in ((global_key, global_value), (gpu_key, gpu_value)) if v is not None]
            continue
        if global_value is not None and gpu_value is not None:
            yield error(global_key, f"is set together with {gpu_key}; set only one. "
                                    f"Remove {global_key} (deprecated) and keep {gpu_key}")
        elif global_value is None and gpu_value is None:
            yield error(gpu_key, f"is not set. Set {gpu_key}=<sequences per device per forward pass>, e.g. 4, "
                                 f"or {dynamic_key}=true to size micro batches by tokens")
        elif global_value is not None:
            per_gpu = global_value // run.n_devices if _positive_int(global_value) and run.n_devices else "N"
            yield warn(global_key, f"is deprecated. Use {gpu_key}={per_gpu} "
                                   "(the global value divided by the number of devices)")
    if unused:
        others = f" (nor {', '.join(unused[1:])})" if unused[1:] else ""
        yield warn(unused[0], f"is not used{others}: with packed forwards (use_remove_padding) and use_dynamic_bsz "
                              "unset, micro batches are sized by tokens (*max_token_len_per_gpu); same gradients, "
                              "fewer and larger passes. Set use_dynamic_bsz=false in that section to size them by rows")
    if run.uses_critic and not _by_tokens(run, "critic", "critic.use_dynamic_bsz"):
        global_key, gpu_key = "critic.forward_micro_batch_size", "critic.forward_micro_batch_size_per_gpu"
        if run.get(global_key) is not None and run.get(gpu_key) is not None:
            yield error(global_key, f"is set together with {gpu_key}; set only one. Keep {gpu_key}")


FILTER_GROUP_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


def check_dynamic_sampling(run: Run) -> Iterator[Issue]:
    """``algorithm.filter_groups`` (DAPO) and ``data.gen_batch_size``, which only it reads."""
    enabled = bool(run.get("algorithm.filter_groups.enable"))
    train, gen = run.get("data.train_batch_size"), run.get("data.gen_batch_size")
    if not enabled:
        if _positive_int(train) and gen is not None and gen != train:
            yield error("data.gen_batch_size", f"is {gen}, but only DAPO dynamic sampling reads it and "
                                               "algorithm.filter_groups.enable is false. Remove it (or set "
                                               "algorithm.filter_groups.enable=true)")
        return
    metric = run.get("algorithm.filter_groups.metric")
    if metric not in FILTER_GROUP_METRICS:
        yield error("algorithm.filter_groups.metric", f"is {metric!r}; with filter_groups enabled choose one of "
                                                      f"{', '.join(FILTER_GROUP_METRICS)} (e.g. acc with the DAPO "
                                                      "reward manager, score otherwise)")
    if not _positive_int(gen):
        yield error("data.gen_batch_size", f"is {gen!r}; with algorithm.filter_groups it is the number of prompts "
                                           "generated per round: set a positive number (e.g. 3 x train_batch_size)")
    n = run.get(f"{ROLLOUT}.n")
    if _positive_int(n) and n < 2:
        yield error(f"{ROLLOUT}.n", "is 1, but algorithm.filter_groups keeps groups whose samples differ: a group "
                                    "of one sample never does. Set actor_rollout_ref.rollout.n to 2 or more")
    devices = run.n_devices
    if _positive_int(gen) and _positive_int(n) and _positive_int(devices) and (gen * n) % devices:
        yield error("data.gen_batch_size", f"({gen}) x {ROLLOUT}.n ({n}) = {gen * n} sequences cannot be split "
                                           f"evenly over {devices} devices. Use a multiple of {devices}")


def check_batch_sizes(run: Run) -> Iterator[Issue]:
    """Batches split evenly over the devices, into mini batches, and into micro batches."""
    devices, source = run.n_devices, run.n_devices_source
    train, n = run.get("data.train_batch_size"), run.get(f"{ROLLOUT}.n")
    if not (_positive_int(devices) and _positive_int(train) and _positive_int(n)):
        return
    if (train * n) % devices:
        yield error("data.train_batch_size",
                    f"data.train_batch_size ({train}) x {ROLLOUT}.n ({n}) = {train * n} sequences cannot be split "
                    f"evenly over {devices} devices ({source}). Make train_batch_size x n a multiple of {devices}")
    roles = [(ACTOR, f"{ACTOR}.use_dynamic_bsz")]
    if run.uses_critic:
        roles.append(("critic", "critic.use_dynamic_bsz"))
    for section, dynamic_key in roles:
        yield from _check_role_batches(run, section, dynamic_key, train, n)


def _check_role_batches(run: Run, section: str, dynamic_key: str, train: int, n: int) -> Iterator[Issue]:
    devices, source = run.devices_for(section)
    mini_key, sp_key = f"{section}.ppo_mini_batch_size", f"{section}.ulysses_sequence_parallel_size"
    mini, sp = run.get(mini_key), run.get(sp_key, 1)
    if not (_positive_int(devices) and _positive_int(mini) and _positive_int(sp)):
        return
    if devices % sp:
        yield error(sp_key, f"({sp}) must divide the number of devices ({devices}, {source})")
        return
    dp = devices // sp
    # The critic's mini batch follows the actor's by default: a shared problem is reported once.
    shared = section != ACTOR and mini == run.get(f"{ACTOR}.ppo_mini_batch_size") and not run.own_pool(section)
    if mini > train or (mini * n) % dp:
        actor_sp = run.get(f"{ACTOR}.ulysses_sequence_parallel_size")
        if shared and (mini > train or sp == actor_sp):
            return
        if shared:
            yield error(sp_key, f"({sp}) leaves {dp} data-parallel ranks, over which {mini_key} ({mini}) x n ({n}) "
                                f"= {mini * n} sequences cannot be split evenly. Use a size that keeps this a multiple")
        elif mini > train:
            yield error(mini_key, f"({mini}) is larger than data.train_batch_size ({train}). "
                                  f"Set {mini_key} to a divisor of {train}")
        else:
            ranks = f"{dp} data-parallel ranks ({source}{f' / sequence parallel {sp}' if sp > 1 else ''})"
            yield error(mini_key, f"({mini}) x {ROLLOUT}.n ({n}) = {mini * n} sequences cannot be split evenly over "
                                  f"{ranks}. Make {mini_key} x n a multiple of {dp}")
        return
    if train % mini and not shared:
        yield error(mini_key, f"({mini}) must divide data.train_batch_size ({train}) so that every optimizer step "
                              f"sees a full mini batch. Set {mini_key} to a divisor of {train}")
    micro_key = f"{section}.ppo_micro_batch_size_per_gpu"
    per_gpu, global_micro = run.get(micro_key), run.get(f"{section}.ppo_micro_batch_size")
    if (_by_tokens(run, section, dynamic_key) or not run.n_devices
            or not (_positive_int(per_gpu) or (per_gpu is None and _positive_int(global_micro)))):
        return
    micro = micro_rows_per_device(per_gpu, global_micro, run.n_devices)
    per_device = mini * n // dp
    arithmetic = f"{mini_key} {mini} x n {n} / {dp} ranks = {per_device}"
    if micro > per_device:
        yield error(micro_key, f"({micro}) is larger than the per-device mini batch ({arithmetic}). "
                               f"Set {micro_key} to a divisor of {per_device}")
    elif per_device % micro:
        yield error(micro_key, f"({micro}) must divide the per-device mini batch ({arithmetic}). "
                               f"Set {micro_key} to a divisor of {per_device}")
