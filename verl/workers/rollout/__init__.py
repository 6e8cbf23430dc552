"""Rollout engines: generate responses for a batch of prompts (``actor_rollout_ref.rollout.*``).

Pick one by name with :func:`get_rollout_class` (``rollout.name``); every engine implements
:class:`BaseRollout`. Built-in: ``hf`` (transformers ``generate``, the reference engine) and
``native`` (the fast engine over the actor's own weights, :mod:`verl.workers.rollout.native`). The names
below are imported on first use: the registry (:mod:`.registry`) knows the engines without importing them.
"""

from verl.utils.lazy import lazy_exports

_EXPORTS = {**dict.fromkeys(("BaseRollout", "SamplingParams", "build_rollout_output", "check_left_padded",
                             "resolve_sampling_params"), ".base"),
            **dict.fromkeys(("get_rollout_class", "register_rollout", "registered_rollouts"), ".registry"),
            "HFRollout": ".hf_rollout", "NativeRollout": ".native"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
