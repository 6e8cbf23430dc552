"""Checks of the reward loop's keys (``reward_model.use_reward_loop``, ``num_workers``, ``rollout.*``): the judge of a
generative reward model (:mod:`verl.rewards.generative`) runs on a built-in engine, and keys that do nothing here
are named in a warning."""

from __future__ import annotations

from collections.abc import Iterator

from verl.trainer.config.checks import Issue, Run, _format, _positive_int, error, warn
from verl.workers.config.reward_model import uses_generative_reward
from verl.workers.rollout.registry import check_rollout_name, ignored_config_keys

RM = "reward_model"
JUDGE = f"{RM}.rollout"
_VLLM_ONLY = ("cudagraph_capture_sizes", "data_parallel_size")  # vLLM's settings, read by no built-in engine


def _set(run: Run, key: str) -> bool:
    return run.get(key) != run.default(key) and not run.follows(key)


def check_reward_loop(run: Run) -> Iterator[Issue]:
    generative = uses_generative_reward(run.get(f"{RM}.enable"), run.get(f"{RM}.use_reward_loop"),
                                        run.get("custom_reward_function.path"))
    if _set(run, f"{RM}.num_workers"):
        scored = (f"the rows are scored on threads of the driver, up to {JUDGE}.max_num_seqs at once" if generative
                  else "rewards are computed by the reward manager in the driver")
        yield warn(f"{RM}.num_workers", f"is {_format(run.get(f'{RM}.num_workers'))}, but there are no reward-loop "
                                        f"worker processes here: {scored}. Remove it to silence this warning")
    if not generative:
        for key in [f"{JUDGE}.{field}" for field in run.get(JUDGE) or {} if _set(run, f"{JUDGE}.{field}")]:
            yield warn(key, f"is set to {_format(run.get(key))}, but only a generative reward model reads "
                            f"{JUDGE}.* ({RM}.enable=true, {RM}.use_reward_loop=true and a custom_reward_function "
                            "that asks the judge); a reward model without a custom_reward_function is a sequence "
                            "classifier run by the FSDP engine. Remove it to silence this warning")
        return
    name = run.get(f"{JUDGE}.name")
    try:
        check_rollout_name(name)
    except ValueError as exc:
        yield error(f"{JUDGE}.name", str(exc).replace("actor_rollout_ref.rollout.name", f"{JUDGE}.name"))
        return
    for key in (f"{JUDGE}.prompt_length", f"{JUDGE}.response_length", f"{JUDGE}.max_num_seqs"):
        if not _positive_int(run.get(key)):
            yield error(key, f"must be a positive integer, got {_format(run.get(key))}")
    for field in (*ignored_config_keys(name), *_VLLM_ONLY):
        key = f"{JUDGE}.{field}"
        value = run.get(key)
        if field == "tensor_model_parallel_size":
            if _set(run, key) and isinstance(value, int) and value > 1:
                yield warn(key, f"is {value}, but the judge is not split over devices: every device of the reward "
                                "model's pool holds a whole copy and the requests are split between them (data "
                                "parallel). Remove it to silence this warning")
        elif _set(run, key):
            yield warn(key, f"is set to {_format(value)} but the {name!r} engine that serves the judge does not read "
                            "it. Remove it to silence this warning")
