"""Rollout engines: generate responses for a batch of prompts (``actor_rollout_ref.rollout.*``).

Pick one by name with :func:`get_rollout_class` (``rollout.name``); every engine implements
:class:`BaseRollout`. Built-in: ``hf`` (transformers ``generate``, the reference engine) and
``native`` (the fast engine over the actor's own weights, :mod:`verl.workers.rollout.native`).
"""

from verl.workers.rollout.base import (
    BaseRollout,
    SamplingParams,
    build_rollout_output,
    check_left_padded,
    get_rollout_class,
    register_rollout,
    registered_rollouts,
    resolve_sampling_params,
)
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.native import NativeRollout

__all__ = [
    "BaseRollout",
    "HFRollout",
    "NativeRollout",
    "SamplingParams",
    "build_rollout_output",
    "check_left_padded",
    "get_rollout_class",
    "register_rollout",
    "registered_rollouts",
    "resolve_sampling_params",
]
