"""The local backend: the workers live in the driver's own process.

World size 1, rank 0, a torch.distributed group of one (gloo on CPU, nccl on CUDA, met through a
private file: ``Worker.init_process_group``), and the same ``@register`` dispatch as the Ray backend,
so a whole run can be stepped through with a debugger, and the smallest runs need no Ray at all.
Arguments are deep copied on the way in, as if they had crossed a process boundary: a worker that changes its input
in place changes its own copy, as it would under Ray. Calls run when made, so a ``blocking=False``
call returns an already-resolved future, and a failing call raises at once.
"""

from __future__ import annotations

import copy
import os
import traceback

import torch
import torch.distributed as dist

from verl.single_controller.worker import DEVICE_ENV
from verl.single_controller.worker_group import ClassWithInitArgs, WorkerError, WorkerGroup, colocated_worker_class

__all__ = ["LocalWorkerGroup", "create_colocated_worker_groups"]


class LocalWorkerGroup(WorkerGroup):
    """The worker ``cls_with_init`` builds, in this process, as rank 0 of a world of 1.
    ``worker_group.worker`` is the worker object itself, for inspection in a debugger."""

    def __init__(self, cls_with_init: ClassWithInitArgs, name_prefix: str | None = None,
                 device: str | None = None):
        super().__init__(cls_with_init.cls, name_prefix or cls_with_init.cls.__name__)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                           DEVICE_ENV: device})
        try:
            self.worker = self._target = cls_with_init()
        except Exception as e:
            raise WorkerError(self.name, 0, "__init__", traceback.format_exc()) from e

    @property
    def world_size(self) -> int:
        return 1

    def _submit(self, method: str, calls: list[tuple[int, tuple, dict]]) -> list:
        results = []
        for rank, args, kwargs in calls:
            args, kwargs = copy.deepcopy((args, kwargs))
            try:
                results.append(getattr(self._target, self._method_prefix + method)(*args, **kwargs))
            except Exception as e:
                raise WorkerError(self.name, rank, method, traceback.format_exc()) from e
        return results

    def _wait(self, method: str, ranks: list[int], handles: list) -> list:
        return handles  # the calls already ran

    def shutdown(self) -> None:
        """Stop the workers' own threads (this process lives on), then leave the process group (colocated local
        roles share it, so it ends for all of them)."""
        close = getattr(self._target, "close", None)  # a Worker's, or a WorkerDict's for each of its roles
        if close is not None:
            close()
        if dist.is_initialized():
            dist.destroy_process_group()


class _ColocatedRole(LocalWorkerGroup):
    """One role's view of the shared ``WorkerDict``; ``worker`` is that role's own instance."""

    def __init__(self, host: LocalWorkerGroup, worker_cls: type, role: str):
        WorkerGroup.__init__(self, worker_cls, role, method_prefix=f"{role}_")
        self._target, self.worker = host._target, host._target.workers[role]


def create_colocated_worker_groups(resource_pool, roles: dict[str, ClassWithInitArgs],
                                   device: str | None = None) -> dict[str, LocalWorkerGroup]:
    """The local counterpart of ``verl.single_controller.ray.create_colocated_worker_groups``: the
    same ``WorkerDict`` hosting every role, here in this process. ``resource_pool`` is accepted for
    the same signature and ignored: the local world size is always 1."""
    host = LocalWorkerGroup(ClassWithInitArgs(colocated_worker_class(roles), dict(roles)),
                            name_prefix="+".join(roles), device=device)
    return {role: _ColocatedRole(host, c.cls, role) for role, c in roles.items()}
