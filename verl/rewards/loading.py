"""Building the reward function the trainer calls: a reward manager around a scoring function.

The scoring function is the user's ``custom_reward_function.{path,name}`` when set, otherwise the
rule rewards of ``verl.rewards.scorers``. The manager class is ``reward_model.reward_manager``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import sys
from typing import Callable

from verl.rewards.managers import get_reward_manager_cls
from verl.trainer.config.config import CustomRewardFunctionConfig, DataConfig
from verl.workers.config.reward_model import RewardModelConfig

__all__ = ["get_custom_reward_fn", "load_reward_manager"]


def _sections(config) -> tuple[CustomRewardFunctionConfig, RewardModelConfig, DataConfig]:
    """The typed sections the reward reads, from the whole trainer config (a section it lacks: the yaml's)."""
    return (CustomRewardFunctionConfig.from_config(config.get("custom_reward_function")),
            RewardModelConfig.from_config(config.get("reward_model")), DataConfig.from_config(config.get("data")))


def _load_module(path: str):
    """Import a Python file by path, under a module name unique to that path."""
    abs_path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(f"custom_reward_function.path={path!r}: no such file ({abs_path})")
    digest = hashlib.sha1(abs_path.encode()).hexdigest()[:12]
    module_name = f"verl_custom_reward_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, abs_path)
    module = importlib.util.module_from_spec(spec)
    # Registered before running, as a normal import would be (dataclasses and pickling look it up).
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ImportError(f"could not import the custom reward file {abs_path} "
                          f"(custom_reward_function.path): {type(exc).__name__}: {exc}") from exc
    return module


def _check_signature(fn: Callable, name: str, path: str, expected: tuple[str, ...], bound_kwargs: dict) -> None:
    """Raise unless ``fn`` accepts the keyword call the reward manager will make."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some C callables expose no signature; let the call itself decide
    try:
        signature.bind(**{param: None for param in expected}, **bound_kwargs)
    except TypeError as exc:
        kwargs_note = f" plus reward_kwargs {sorted(bound_kwargs)}" if bound_kwargs else ""
        raise TypeError(
            f"custom reward function {name}{signature} in {path} cannot be called as "
            f"{name}({', '.join(expected)}){kwargs_note}: {exc}. Expected a signature like "
            f"def {name}({', '.join(expected)}, **kwargs) -- the reward manager passes these as keywords."
        ) from None


def get_custom_reward_fn(config) -> Callable | None:
    """The function named by ``custom_reward_function.{path,name}``, with ``reward_kwargs`` bound.

    Without a path: the rule rewards with ``reward_kwargs`` bound when some are set, else None. The
    expected signature depends on the reward manager (``reward_model.reward_manager``): per sample
    ``(data_source, solution_str, ground_truth, extra_info)`` for ``naive``/``dapo``, lists
    ``(data_sources, solution_strs, ground_truths, extra_infos)`` for ``batch``.
    """
    custom, reward_model, _ = _sections(config)
    path, reward_kwargs = custom.path, dict(custom.reward_kwargs or {})
    if not path:
        if not reward_kwargs:
            return None
        # No file: the keyword arguments go to the rule rewards (e.g. normalize=True for gsm8k and MATH).
        from verl.rewards.scorers import default_compute_score

        if reward_model.reward_manager == "batch":
            raise ValueError("custom_reward_function.reward_kwargs without custom_reward_function.path go to the "
                             "rule rewards, which score one sample at a time; use reward_model.reward_manager=naive")
        return functools.partial(default_compute_score, **reward_kwargs)
    name = custom.name
    module = _load_module(path)
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        defined = sorted(attr for attr, value in vars(module).items()
                         if callable(value) and getattr(value, "__module__", None) == module.__name__)
        raise AttributeError(f"custom_reward_function.name={name!r} is not a function defined in {path}. "
                             f"Functions defined there: {defined}")

    manager_cls = get_reward_manager_cls(reward_model.reward_manager)
    _check_signature(fn, name, path, manager_cls.compute_score_params, reward_kwargs)
    return functools.partial(fn, **reward_kwargs) if reward_kwargs else fn


def load_reward_manager(config, tokenizer, num_examine: int, **reward_kwargs):
    """Build the reward manager selected by ``reward_model.reward_manager``.

    ``reward_kwargs`` go to the manager, which forwards the ones it does not use to every scoring
    call (the original CLI passes ``reward_model.reward_kwargs`` here).
    """
    _, reward_model, data = _sections(config)
    manager_cls = get_reward_manager_cls(reward_model.reward_manager)
    kwargs = {"reward_fn_key": data.reward_fn_key}
    if reward_model.reward_manager == "dapo":
        kwargs.update(max_resp_len=data.max_response_length, overlong_buffer_cfg=reward_model.overlong_buffer)
    kwargs.update(reward_kwargs)
    # None lets each manager pick its default (the rule rewards; the batch manager requires a function).
    return manager_cls(tokenizer=tokenizer, num_examine=num_examine,
                       compute_score=get_custom_reward_fn(config), **kwargs)


def check_rule_reward_rows(dataset, config, split: str = "data.train_files") -> None:
    """Before any worker starts: every row a rule reward will score has a ``data_source`` with a
    registered scorer and a ``reward_model.ground_truth``. Skipped with a reward model or a custom reward
    function (they decide what they need). Raises ``DatasetError`` naming the file, the row and the fix."""
    custom, reward_model, data = _sections(config)
    if reward_model.enable or custom.path:
        return
    from verl.data import DatasetError
    from verl.rewards.scorers import find_scorer, registered_data_sources, rejected_kwargs
    from verl.sandbox.process import SandboxUnavailable, isolation

    known = registered_data_sources()
    reward_kwargs = dict(custom.reward_kwargs or {})
    checked_sources, sandbox_checked, problems = set(), set(), []
    source_key = data.reward_fn_key
    for (path, row, source), (_, _, reward_model) in zip(dataset.column_values(source_key),
                                                         dataset.column_values("reward_model")):
        if reward_kwargs and source not in checked_sources and find_scorer(source) is not None:
            checked_sources.add(source)
            unknown, takes = rejected_kwargs(source, reward_kwargs)
            if unknown:
                problems.append(f"{path}, row {row}: the scorer of {source_key}={source!r} takes no "
                                f"custom_reward_function.reward_kwargs {unknown} (it takes {takes})")
        scorer = find_scorer(source)
        if scorer is not None and getattr(scorer, "needs_sandbox", False) and source not in sandbox_checked:
            sandbox_checked.add(source)
            if isolation() != "namespaces":
                problems.append(f"{path}, row {row}: {source_key}={source!r} is scored by running or evaluating model "
                                f"text, which needs the sandbox, and this machine has none: {isolation()}. Allow "
                                "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; in Docker "
                                "--security-opt seccomp=unconfined) or score these rows with a custom reward")
            elif getattr(scorer, "check", None) is not None:
                try:
                    scorer.check()
                except SandboxUnavailable as exc:
                    problems.append(f"{path}, row {row}: {source_key}={source!r} cannot be scored here: {exc}")
        if scorer is None:
            problems.append(f"{path}, row {row}: {source_key}={source!r} has no rule reward")
        elif not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
            problems.append(f"{path}, row {row}: reward_model.ground_truth is missing or None")
        if len(problems) >= 5:
            break
    if problems:
        raise DatasetError(
            f"{split}: rows a rule reward cannot score (first {len(problems)}):\n  " + "\n  ".join(problems)
            + f"\nKnown data sources: {', '.join(known)}. Fix or drop those rows, or set "
            "custom_reward_function.path to a reward that handles them")
