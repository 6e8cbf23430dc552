"""Checks of the original's ``reward:`` section (:mod:`verl.trainer.config.reward_section`): a ``reward.*`` key and
the key read here both set, to different values; ``reward.reward_manager.source``; ``reward.*`` keys nothing reads
here. `name_reward_keys` makes the issues of a key set through ``reward.*`` name the key as the user wrote it."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping

from verl.trainer.config.checks import Issue, Run, _format, _lookup, error, warn
from verl.trainer.config.reward_section import MANAGER_NAME, MANAGER_SOURCE, SECTION, mapped_keys, set_keys

_SOURCES = ("register", "importlib")
_MODULE = "reward.reward_manager.module."
_MAX_RESP_LEN = "reward.reward_kwargs.max_resp_len"
_JUDGE = "reward.reward_model.rollout."
_REGISTER = ("a reward manager of your own here subclasses AbstractRewardManager and is registered with "
             "@register(\"my_manager\") from verl.workers.reward_manager in the custom_reward_function.path file; "
             f"then set {MANAGER_SOURCE}=register {MANAGER_NAME}=my_manager")


def _written(run: Run) -> tuple[dict[str, str], list[tuple[str, object]]]:
    """(the mapped keys for this config's manager source, the ``reward.*`` keys set and their values)."""
    values = run.get(SECTION)
    if not isinstance(values, Mapping):
        return {}, []
    mapped = mapped_keys(run.get(MANAGER_SOURCE))
    return mapped, list(set_keys(values, run.default(SECTION) or {}, mapped))


def check_reward_section(run: Run) -> Iterator[Issue]:
    """Each ``reward.*`` key set: its key read here holds the same value; else it is read by nothing, and named."""
    mapped, written = _written(run)
    source = run.get(MANAGER_SOURCE)
    for key, value in written:
        if key in mapped:
            ours = _lookup(run.cfg, mapped[key])  # as written: a wrong type is check_types' to report
            if ours != value:
                yield error(key, f"is {_format(value)}, but {mapped[key]}, the setting it stands for here, is "
                                 f"{_format(ours)}. Set only one of the two keys (or both to the same value)")
        elif key == MANAGER_SOURCE:
            if source == "importlib":
                yield error(key, "is importlib, but loading a reward manager class from reward.reward_manager.module"
                                 ".path is not supported here (the original's importlib managers follow its "
                                 f"reward-loop interface, which this verl does not run): {_REGISTER}")
            else:
                yield error(key, f"must be one of {', '.join(_SOURCES)}, got {_format(value)}: {_REGISTER}")
        elif key.startswith(_MODULE) or (key == MANAGER_NAME and source == "importlib"):
            if source != "importlib":  # with importlib, the error on the source says what to do
                yield warn(key, f"is set to {_format(value)}, but only {MANAGER_SOURCE}=importlib reads it (as in the "
                                "original), so it has no effect. Remove it to silence this warning")
        elif key == _MAX_RESP_LEN:
            length = run.get("data.max_response_length")
            if value != length:
                yield warn(key, f"is {_format(value)}, but the dapo reward manager here measures the overlong penalty "
                                f"against data.max_response_length={_format(length)}. Remove it, or set "
                                "data.max_response_length")
        elif key.startswith(_JUDGE):
            name = key[len(_JUDGE):].split(".")[0]
            yield warn(key, f"is set to {_format(value)}, but reward_model.rollout (the judge's engine here) has no "
                            f"setting {name!r}, so it has no effect. Remove it to silence this warning")
        else:
            yield warn(key, f"is set to {_format(value)}, but no reward setting here stands for it, so it has no "
                            "effect. Remove it to silence this warning (ppo_trainer.yaml lists the reward.* keys read)")


def name_reward_keys(issues: Iterable[Issue], run: Run) -> list[Issue]:
    """The issues, those about a key set through ``reward.*`` naming the ``reward.*`` key instead (in the key and in
    the message); of two issues that then name the same key with the same severity (a wrong type, reported on both
    keys) the first is kept."""
    mapped, written = _written(run)
    # The values as written: through run.get a key of the wrong type reads as unset, yet it was set through reward.*
    origin = {mapped[key]: key for key, value in written if key in mapped and _lookup(run.cfg, mapped[key]) == value}
    out, renamed = [], set()
    for issue in issues:
        target = next((t for t in origin if issue.key == t or issue.key.startswith(f"{t}.")), None)
        if target is not None:
            key = origin[target] + issue.key[len(target):]
            message = re.sub(rf"(?<![\w.]){re.escape(target)}(?!\w)", origin[target], issue.message)
            issue = dataclasses.replace(issue, key=key, message=message)
            renamed.add(issue.key)
        out.append(issue)
    seen, kept = set(), []
    for issue in out:
        if issue.key in renamed and (issue.key, issue.warning) in seen:
            continue
        seen.add((issue.key, issue.warning))
        kept.append(issue)
    return kept
