"""The built-in fast rollout engine (``actor_rollout_ref.rollout.name=native``): generation with the
actor's own weights over a slot KV cache, continuous batching and CUDA-graph decode."""

from verl.workers.rollout.native.engine import NativeRollout
from verl.workers.rollout.native.weights import UnsupportedModelError

__all__ = ["NativeRollout", "UnsupportedModelError"]
