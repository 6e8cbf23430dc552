"""Building the reward function the trainer calls, and calling it (the original's ``verl.trainer.ppo.reward``).

The scoring function is the user's ``custom_reward_function.{path,name}`` when set, otherwise the
rule rewards of ``verl.rewards.scorers``. The manager class is ``reward_model.reward_manager``: a built-in one
or one the user registered (``@register``) in the custom reward file, which is imported before the name is
looked up. :func:`compute_reward` calls the manager on a batch; :data:`compute_reward_async` does so in a Ray task.
With a generative reward model the function also gets the judge (:mod:`verl.rewards.generative`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any, Callable

import torch

from verl.protocol import DataProto
from verl.rewards.generative import GENRM_KWARGS
from verl.rewards.managers import DAPORewardManager, REWARD_MANAGER_REGISTRY, get_reward_manager_cls
from verl.rewards.managers.naive import NaiveRewardManager
from verl.trainer.config.config import CustomRewardFunctionConfig, DataConfig
from verl.workers.config.reward_model import RewardModelConfig, uses_generative_reward

__all__ = ["compute_reward", "compute_reward_async", "find_reward_manager_cls", "get_custom_reward_fn",
           "load_reward_manager"]

# Custom reward files are imported as modules named this prefix + a digest of their path.
_MODULE_PREFIX = "verl_custom_reward_"


def _sections(config) -> tuple[CustomRewardFunctionConfig, RewardModelConfig, DataConfig]:
    """The typed sections the reward reads, from the whole trainer config (a section it lacks: the yaml's)."""
    return (CustomRewardFunctionConfig.from_config(config.get("custom_reward_function")),
            RewardModelConfig.from_config(config.get("reward_model")), DataConfig.from_config(config.get("data")))


def _load_module(path: str):
    """Import a Python file by path, once per process for each content of the file: a second import of the same
    file would register its reward managers again, as other classes; a file edited since (a long-lived Python
    session) is imported anew, under a module name of its own."""
    abs_path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(f"custom_reward_function.path={path!r}: no such file ({abs_path})")
    with open(abs_path, "rb") as f:
        digest = hashlib.sha1(abs_path.encode() + b"\0" + f.read()).hexdigest()[:12]
    module_name = f"{_MODULE_PREFIX}{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
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

    manager_cls = find_reward_manager_cls(reward_model.reward_manager, path)
    expected = _score_params(manager_cls)
    if uses_generative_reward(reward_model.enable, reward_model.use_reward_loop, custom.path):
        expected += GENRM_KWARGS  # the judge's address and tokenizer (verl.rewards.generative)
    _check_signature(fn, name, path, expected, reward_kwargs)
    return functools.partial(fn, **reward_kwargs) if reward_kwargs else fn


def _score_params(manager_cls: type) -> tuple[str, ...]:
    """The keywords ``manager_cls`` calls its scoring function with; a user's manager that does not say is taken
    to score one sample at a time, like ``naive``."""
    return getattr(manager_cls, "compute_score_params", NaiveRewardManager.compute_score_params)


def find_reward_manager_cls(name: str, custom_reward_path: str | None = None) -> type:
    """The reward manager class registered under ``name``. A name not registered yet may be registered by the
    user's custom reward file (``custom_reward_function.path``), so that file is imported first."""
    if name not in REWARD_MANAGER_REGISTRY and custom_reward_path:
        _load_module(custom_reward_path)
    return get_reward_manager_cls(name)


def load_reward_manager(config, tokenizer, num_examine: int, **reward_kwargs):
    """Build the reward manager selected by ``reward_model.reward_manager``.

    ``reward_kwargs`` go to the manager, which forwards the ones it does not use to every scoring
    call (the original CLI passes ``reward_model.reward_kwargs`` here). The scoring function handed to it is the
    user's custom one, else the rule rewards (``default_compute_score``); a manager whose function takes lists
    (``batch``) gets None without a custom one, and says so.
    """
    custom, reward_model, data = _sections(config)
    compute_score = get_custom_reward_fn(config)  # imports the custom file, whose managers then are registered
    manager_cls = find_reward_manager_cls(reward_model.reward_manager, custom.path)
    if compute_score is None and _score_params(manager_cls) == NaiveRewardManager.compute_score_params:
        from verl.rewards.scorers import default_compute_score

        compute_score = default_compute_score
    kwargs = {"reward_fn_key": data.reward_fn_key}
    if issubclass(manager_cls, DAPORewardManager):
        kwargs.update(max_resp_len=data.max_response_length, overlong_buffer_cfg=reward_model.overlong_buffer)
    kwargs.update(reward_kwargs)
    if uses_generative_reward(reward_model.enable, reward_model.use_reward_loop, custom.path):
        from verl.models import load_tokenizer
        from verl.rewards.generative import GenerativeReward

        judge_tokenizer = load_tokenizer(reward_model.model.path, config_key="reward_model.model.path",
                                         trust_remote_code=reward_model.model.trust_remote_code)
        return GenerativeReward(reward_model, judge_tokenizer, manager_cls, tokenizer, num_examine, compute_score,
                                kwargs)
    return manager_cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score, **kwargs)


def _takes_return_dict(reward_fn: Callable) -> bool:
    try:
        params = inspect.signature(reward_fn).parameters.values()
    except (TypeError, ValueError):
        return True  # no signature to read (a C callable): the manager protocol's call
    return any(p.name == "return_dict" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def compute_reward(data: DataProto, reward_fn: Callable) -> tuple[torch.Tensor, dict[str, Any]]:
    """The reward tensor (batch, response_length) of ``data`` and the reward's extra info (key -> one value per
    sample), from a reward manager (``load_reward_manager``).

    The manager is called as ``reward_fn(data, return_dict=True)``; a callable without a ``return_dict``
    parameter as ``reward_fn(data)``, its tensor then coming with no extra info. An exception from the reward
    function stops the run with its own message: unlike the original, which prints it and scores the batch a
    second time without ``return_dict``, hiding the first error.
    """
    result = reward_fn(data, return_dict=True) if _takes_return_dict(reward_fn) else reward_fn(data)
    if isinstance(result, torch.Tensor):
        reward_tensor, extra_info = result, {}
    elif isinstance(result, Mapping) and "reward_tensor" in result:
        reward_tensor, extra_info = result["reward_tensor"], dict(result.get("reward_extra_info") or {})
    else:
        found = sorted(result) if isinstance(result, Mapping) else type(result).__name__
        raise TypeError(f"the reward function {reward_fn!r} returned {found}; a reward manager returns a tensor, or "
                        "with return_dict=True a dict {'reward_tensor': tensor, 'reward_extra_info': {...}}")
    if data.batch is not None and "responses" in data.batch.keys():
        expected = tuple(data.batch["responses"].shape)
        if tuple(reward_tensor.shape) != expected:
            raise ValueError(f"the reward function {reward_fn!r} returned a reward tensor of shape "
                             f"{tuple(reward_tensor.shape)}; it must match data.batch['responses'] {expected}, with "
                             "each sample's reward on its response tokens")
    for key, values in extra_info.items():
        if not hasattr(values, "__len__") or isinstance(values, str) or len(values) != len(data):
            raise ValueError(f"reward_extra_info[{key!r}] of the reward function {reward_fn!r} must hold one value "
                             f"per sample ({len(data)}), got {values!r}")
    return reward_tensor, extra_info


def _compute_reward_task(data: DataProto, config=None, tokenizer=None, reward_fn=None):
    if reward_fn is None:
        if config is None or tokenizer is None:
            raise ValueError("compute_reward_async needs reward_fn (a reward manager), or config and tokenizer to "
                             "build one with load_reward_manager")
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
    return compute_reward(data, reward_fn)


class _ComputeRewardAsync:
    """``compute_reward_async.remote(data, config=None, tokenizer=None, reward_fn=None)``: :func:`compute_reward`
    in a one-CPU Ray task (the original's ``@ray.remote`` function); ``ray.get`` of the returned reference gives
    ``(reward_tensor, reward_extra_info)``. Without ``reward_fn`` the task builds one from ``config`` and
    ``tokenizer``. Ray is imported at the first call, not with this module."""

    def __init__(self):
        self._remote = None

    def remote(self, *args, **kwargs):
        import ray
        from ray import cloudpickle

        # Classes and functions of custom reward files live in modules the task's process cannot import: send
        # them by value.
        for name, module in list(sys.modules.items()):
            if name.startswith(_MODULE_PREFIX):
                cloudpickle.register_pickle_by_value(module)
        if self._remote is None:
            self._remote = ray.remote(num_cpus=1)(_compute_reward_task)
        return self._remote.remote(*args, **kwargs)


compute_reward_async = _ComputeRewardAsync()


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
