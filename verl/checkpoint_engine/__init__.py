"""Sending the trainer's weights to rollout processes (``actor_rollout_ref.rollout.checkpoint_engine``).

``backend=naive`` (colocated rollout): nothing is sent; the rollout reads the actor's weights in place.
``backend=nccl`` (separate rollout, the ``separate_async`` mode): every few steps trainer rank 0 broadcasts the
weights over a :class:`WeightSyncGroup` to every rollout process, in buckets of
``update_weights_bucket_megabytes`` (default 2048)::

    # trainer rank 0                              # every rollout process (rank 1..R)
    group = WeightSyncGroup(address, 0, 1 + R,     group = WeightSyncGroup(address, r, 1 + R, device)
                            device)                loader = WeightLoader(model)
    group.send(model_weights(), megabytes << 20)   group.receive(on_bucket=loader)
                                                   loader.finish()
    # other trainer ranks: drain(model_weights())
"""

from verl.checkpoint_engine.apply import WeightLoader, apply_weights
from verl.checkpoint_engine.sync import WeightSyncGroup, drain

__all__ = ["WeightLoader", "WeightSyncGroup", "apply_weights", "drain"]
