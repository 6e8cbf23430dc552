"""Checks of ``actor_rollout_ref.rollout.multi_turn.*`` before any worker starts: the tool and interaction
files load, the prompts' messages reach the rollout, and nothing is set that the agent loop does not do."""

from __future__ import annotations

from collections.abc import Iterator

from verl.trainer.config.checks import Issue, Run, error

MT = "actor_rollout_ref.rollout.multi_turn"
SANITY_MODES = ("strict", "disable")


def check_multi_turn(run: Run) -> Iterator[Issue]:
    if not run.get(f"{MT}.enable"):
        return
    if not run.get("data.return_raw_chat"):
        yield error("data.return_raw_chat", f"must be True with {MT}.enable=true: the agent loop renders each "
                                            "prompt's messages with the tool schemas. Set data.return_raw_chat=True")
    if run.get(f"{MT}.format") != "hermes":
        yield error(f"{MT}.format", f"is {run.get(f'{MT}.format')!r}; the agent loop parses 'hermes' tool calls "
                                    "(<tool_call>{json}</tool_call>, as Qwen2.5 writes them). Set it to hermes")
    if run.get(f"{MT}.tokenization_sanity_check_mode") not in SANITY_MODES:
        yield error(f"{MT}.tokenization_sanity_check_mode",
                    f"is {run.get(f'{MT}.tokenization_sanity_check_mode')!r}; use one of {list(SANITY_MODES)}")
    if run.get(f"{MT}.use_inference_chat_template"):
        yield error(f"{MT}.use_inference_chat_template", "is not implemented: the agent loop trains on the tokens "
                                                         "it generated with the training template; remove the key")
    for key in ("max_assistant_turns", "max_user_turns", "max_parallel_calls"):
        value = run.get(f"{MT}.{key}")
        if value is not None and (not isinstance(value, int) or value < 1):
            yield error(f"{MT}.{key}", f"must be a positive integer (or null for no limit), got {value!r}")
    if run.get(f"{MT}.tool_response_truncate_side") not in ("left", "right", "middle"):
        yield error(f"{MT}.tool_response_truncate_side", "must be left, right or middle")
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config as load_interactions
    from verl.tools.base import load_tools

    for key, load in (("tool_config_path", load_tools), ("interaction_config_path", load_interactions)):
        path = run.get(f"{MT}.{key}")
        if path:
            try:
                load(path)
            except (FileNotFoundError, ValueError) as err:
                yield error(f"{MT}.{key}", str(err))
