"""Rule rewards, dispatched by the ``data_source`` column of the dataset.

``default_compute_score`` is the scoring function reward managers use when no
``custom_reward_function.path`` is configured. Each data source maps to one scorer with the signature
``scorer(solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict``; a new task adds
itself with ``@register_score("my/data_source")``. A name ending in ``*`` covers every data source that
starts with the rest (``aime*``); exact names win over such prefixes.

The scorers of the data sources the original verl names score as the original does (see each module);
``gsm8k`` and MATH take ``normalize=True`` (``custom_reward_function.reward_kwargs``) for this
project's more forgiving comparison.
"""

from __future__ import annotations

import inspect
from typing import Callable

from verl.rewards.scorers import code, geo3k, gsm8k, math_dapo, math_reward, prime_math, reverse_digits, search_qa

__all__ = ["default_compute_score", "find_scorer", "register_score", "registered_data_sources", "rejected_kwargs"]

_SCORERS: dict[str, Callable] = {}


def register_score(*data_sources: str, override: bool = False):
    """Decorator registering a scorer for one or more data sources.

    Registering a different function under a name that is already taken raises, unless ``override``
    is set, so two tasks cannot silently claim the same data source.
    """
    if not data_sources:
        raise ValueError("register_score needs at least one data_source name")

    def decorator(fn: Callable) -> Callable:
        for name in data_sources:
            current = _SCORERS.get(name)
            if current is not None and current is not fn and not override:
                raise ValueError(f"data_source {name!r} already has the scorer {current.__qualname__}; "
                                 "pass override=True to replace it")
            _SCORERS[name] = fn
        return fn

    return decorator


def registered_data_sources() -> list[str]:
    return sorted(_SCORERS)


def find_scorer(data_source) -> Callable | None:
    """The scorer of ``data_source``: its exact name, else the longest matching ``prefix*``; or None."""
    name = str(data_source)
    if name in _SCORERS:
        return _SCORERS[name]
    prefixes = [p for p in _SCORERS if p.endswith("*") and name.startswith(p[:-1])]
    return _SCORERS[max(prefixes, key=len)] if prefixes else None


def _rule(target: Callable, with_extra_info: bool = False, sandboxed: bool = False,
          check: Callable | None = None) -> Callable:
    """A scorer calling ``target(solution_str, ground_truth, [extra_info,] **kwargs)``; ``target`` is kept for
    :func:`rejected_kwargs`, ``needs_sandbox`` (it runs model text: :mod:`verl.sandbox.process`) and ``check``
    (raises :class:`~verl.sandbox.process.SandboxUnavailable` when it cannot work here) for the pre-flight check."""
    def scorer(solution_str, ground_truth, extra_info=None, **kwargs):
        if with_extra_info:
            kwargs["extra_info"] = extra_info
        return target(solution_str, ground_truth, **kwargs)

    scorer.target = target
    scorer.needs_sandbox = sandboxed
    scorer.check = check
    scorer.__qualname__ = f"{target.__module__}.{target.__name__}"
    return scorer


register_score("openai/gsm8k")(_rule(gsm8k.compute_score))
register_score("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")(
    _rule(math_reward.compute_score))
register_score("math_dapo", "math", "math_dapo_reasoning", "aime*")(_rule(math_dapo.compute_score))
register_score("searchR1_*")(_rule(search_qa.compute_score))
register_score("hiyouga/geometry3k")(_rule(geo3k.compute_score))
register_score(*prime_math.DATA_SOURCES)(_rule(prime_math.compute_score, sandboxed=True,
                                                 check=lambda: prime_math.check_sandbox()))
register_score(*code.DATA_SOURCES)(_rule(code.compute_score, with_extra_info=True, sandboxed=True))
register_score(reverse_digits.DATA_SOURCE)(_rule(reverse_digits.compute_score, with_extra_info=True))


def rejected_kwargs(data_source, kwargs) -> tuple[list[str], list[str]]:
    """The keyword arguments the scorer of ``data_source`` does not take, and those it takes (empty lists
    when it takes any, or has no scorer)."""
    scorer = find_scorer(data_source)
    if scorer is None:
        return [], []
    try:
        params = inspect.signature(getattr(scorer, "target", scorer)).parameters
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return [], []
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return [], []
    takes = [n for n in params if n not in ("solution_str", "ground_truth", "extra_info")]
    return [k for k in kwargs if k not in params or k in ("solution_str", "ground_truth")], takes


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Score one response with the rule registered for ``data_source``.

    Returns a float, or the scorer's dict unchanged when it returns one (it must hold ``"score"``).
    Extra keyword arguments go to the scorer (e.g. ``method="flexible"`` for gsm8k).
    """
    scorer = find_scorer(data_source)
    if scorer is None:
        raise ValueError(
            f"No rule reward is registered for data_source={data_source!r}. "
            f"Known data sources: {registered_data_sources()}. To score this data, write "
            "compute_score(data_source, solution_str, ground_truth, extra_info=None) in a .py file and "
            "set custom_reward_function.path=<that file> (and custom_reward_function.name=<function> if "
            "it has another name), or register a scorer with "
            "verl.rewards.scorers.register_score."
        )
    unknown, takes = rejected_kwargs(data_source, kwargs)
    if unknown:
        raise TypeError(f"the scorer of data_source={data_source!r} takes no {unknown} (it takes {takes}); "
                        "keyword arguments (custom_reward_function.reward_kwargs) go to every data source's scorer")
    result = scorer(solution_str, ground_truth, extra_info=extra_info, **kwargs)
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"the scorer for data_source={data_source!r} returned a dict without a "
                             f"'score' key (keys: {sorted(result)})")
        return result
    return float(result)
