"""The single controller: the driver calls worker groups; workers compute.

- :mod:`.decorator` -- ``@register`` and the dispatch modes (how arguments are split over ranks);
- :mod:`.worker` -- ``Worker``, the base class of every role (rank, world size, process group);
- :mod:`.worker_group` -- ``WorkerGroup``, the driver-side handle that turns registered worker
  methods into plain method calls;
- :mod:`.ray` -- the Ray backend (resource pools, one actor per device, colocated roles);
- :mod:`.local` -- the in-process backend, for debugging and the smallest runs.

The backends are imported from their modules, so that importing this package does not import Ray.
"""

from verl.single_controller.decorator import Dispatch, Execute, register, register_dispatch_mode
from verl.single_controller.worker import Worker
from verl.single_controller.worker_group import (
    ClassWithInitArgs, DataProtoFuture, WorkerError, WorkerFuture, WorkerGroup
)

__all__ = ["Dispatch", "Execute", "register", "register_dispatch_mode", "Worker", "WorkerGroup",
           "WorkerError", "WorkerFuture", "DataProtoFuture", "ClassWithInitArgs"]
