"""The single controller: the driver calls worker groups; workers compute.

- :mod:`.decorator` -- ``@register`` and the dispatch modes (how arguments are split over ranks);
- :mod:`.worker` -- ``Worker``, the base class of every worker (rank, world size, process group);
- :mod:`.worker_group` -- ``WorkerGroup``, the driver-side handle that turns registered worker
  methods into plain method calls, and ``ResourcePool`` (workers per node);
- :mod:`.ray` -- the Ray backend (``RayResourcePool``, one actor per device, colocated roles);
- :mod:`.local` -- the in-process backend, for debugging and the smallest runs.

The original verl's paths work too: ``verl.single_controller.base`` is this package (its
``decorator``, ``worker`` and ``worker_group`` modules are these), and ``verl.single_controller.ray.base``
is :mod:`.ray`. The backends are imported from their modules, so that importing this package does not
import Ray.
"""

from verl.single_controller.decorator import Dispatch, Execute, register, register_dispatch_mode
from verl.single_controller.worker import Worker
from verl.single_controller.worker_group import (
    ClassWithInitArgs, DataProtoFuture, ResourcePool, WorkerError, WorkerFuture, WorkerGroup
)

__all__ = ["Dispatch", "Execute", "register", "register_dispatch_mode", "Worker", "WorkerGroup", "ResourcePool",
           "WorkerError", "WorkerFuture", "DataProtoFuture", "ClassWithInitArgs"]
