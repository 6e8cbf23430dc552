"""WorkerGroup: the driver's handle on the workers of one role.

For every ``@register``-ed method of the worker class, the group gets a method of the same name
that runs on the driver:

    dispatch (split the arguments over ranks) -> run on every rank (or rank 0) -> wait -> collect

so the driver writes ``values = critic_wg.compute_values(batch)`` and never sees the ranks. The
backends (``ray``, ``local``) only say how a call reaches a rank and how its result is
awaited; everything else lives here, once. The original verl's import path
``verl.single_controller.base.worker_group`` is this module.
"""

from __future__ import annotations

import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Callable

from verl.protocol import DataProto, unpad_dataproto
from verl.single_controller.decorator import (
    Execute, MethodSpec, collect_dp_compute_proto, collect_list, get_dispatch_mode, pad_dataproto_args, register,
    registered_methods
)

__all__ = ["ClassWithInitArgs", "ResourcePool", "WorkerGroup", "WorkerError", "WorkerFuture", "DataProtoFuture",
           "WorkerDict", "colocated_worker_class"]


class ResourcePool:
    """How many workers a pool runs on each node: ``process_on_nodes[i]`` on the i-th node, the i-th
    node's workers having local ranks ``0 .. process_on_nodes[i] - 1``. A backend places them
    (:class:`verl.single_controller.ray.RayResourcePool`); up to ``max_colocate_count`` worker groups
    may share the pool's devices."""

    def __init__(self, process_on_nodes: Sequence[int], max_colocate_count: int = 3):
        process_on_nodes = list(process_on_nodes)
        if not process_on_nodes or any(int(n) != n or n <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must be a non-empty list of positive worker counts per "
                             f"node, got {process_on_nodes}")
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be at least 1, got {max_colocate_count}")
        self.process_on_nodes = [int(n) for n in process_on_nodes]
        self.max_colocate_count = max_colocate_count

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def local_world_size_list(self) -> list[int]:
        """The number of workers on each rank's node, by rank."""
        return [n for n in self.process_on_nodes for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """Each rank's index among its node's workers, by rank."""
        return [i for n in self.process_on_nodes for i in range(n)]


class ClassWithInitArgs:
    """A worker class and the arguments to build it with, kept apart so that the backend can
    build it where the worker lives (a Ray actor, or the driver itself)."""

    def __init__(self, cls: type, *args, **kwargs):
        # Accept a class already wrapped by ``ray.remote`` (verl configs often hold those).
        metadata = getattr(cls, "__ray_metadata__", None)
        self.cls = metadata.modified_class.__ray_actor_class__ if metadata is not None else cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self):
        return self.cls(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"ClassWithInitArgs({self.cls.__name__})"


class WorkerDict:
    """Colocated roles in one process: one instance of each role, built in the given order.
    :func:`colocated_worker_class` adds a ``{role}_{method}`` forwarder per registered method,
    registered as the role's method is, and ``role_classes`` (role -> class)."""

    role_classes: dict[str, type] = {}

    def __init__(self, roles: dict[str, ClassWithInitArgs]):
        self.workers = {role: build() for role, build in roles.items()}

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()

    def __repr__(self) -> str:  # Ray prefixes the actor's log lines with this
        return f"WorkerDict({'+'.join(self.workers)}, rank={os.environ.get('RANK')})"


def _forward(role: str, method: str, spec: MethodSpec) -> Callable:
    def call(self, *args, **kwargs):
        return getattr(self.workers[role], method)(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"{role}_{method}"
    return register(spec.dispatch_mode, spec.execute_mode, spec.blocking)(call)


def colocated_worker_class(roles: dict[str, ClassWithInitArgs]) -> type:
    """A :class:`WorkerDict` subclass hosting ``roles``; build it with ``(roles,)``."""
    for role in roles:
        if not role.isidentifier():
            raise ValueError(f"colocated role names must be Python identifiers, got {role!r}")
    methods = {f"{role}_{m}": _forward(role, m, spec) for role, c in roles.items()
               for m, spec in registered_methods(c.cls).items()}
    return type("WorkerDict", (WorkerDict,), {**methods, "role_classes": {role: c.cls for role, c in roles.items()}})


class WorkerError(RuntimeError):
    """A worker failed: it raised (``died=False``) or its process went away (``died=True``).
    The message names the role, the rank and the method, and carries the worker's traceback."""

    def __init__(self, role: str, rank: int, method: str, detail: str, died: bool = False):
        what = "died while running" if died else "raised in"
        super().__init__(f"worker group '{role}' rank {rank} {what} {method}():\n{detail}")
        self.role, self.rank, self.method, self.detail, self.died = role, rank, method, detail, died


class WorkerFuture:
    """The result of a ``blocking=False`` call. ``get()`` waits for every rank (failing as soon as
    one fails), collects, and returns what the blocking call would have returned."""

    def __init__(self, group: "WorkerGroup", method: str, ranks: list[int], handles: list,
                 finish: Callable[[list], Any]):
        self._group, self._method, self._ranks, self._handles = group, method, ranks, handles
        self._finish = finish
        self._done, self._value = False, None

    def get(self) -> Any:
        if not self._done:
            self._value = self._finish(self._group._wait(self._method, self._ranks, self._handles))
            self._done, self._handles = True, None
        return self._value


class DataProtoFuture(WorkerFuture):
    """A future from a ``DP_COMPUTE_PROTO`` method: ``get()`` returns the concatenated DataProto
    with the padding rows removed. Passing it to another group method waits for it first."""


class WorkerGroup(ABC):
    """Backend-independent part of a worker group. A backend subclass provides
    ``world_size``, ``_submit``, ``_wait`` and ``shutdown``.

    ``name`` is the role shown in errors. ``method_prefix`` is prepended to method names when a
    call reaches the worker (colocated roles live in one object as ``{role}_{method}``).
    """

    # What a non-blocking call returns when its result is the list of rank results (a backend may give
    # a future that its own library also understands).
    _list_future: type[WorkerFuture] = WorkerFuture

    def __init__(self, worker_cls: type, name: str, method_prefix: str = ""):
        self.worker_cls = worker_cls
        self.name = name
        self._method_prefix = method_prefix
        for method, spec in registered_methods(worker_cls).items():
            if hasattr(type(self), method) or method in vars(self):
                raise TypeError(f"{worker_cls.__name__}.{method} is @register-ed but its name clashes "
                                f"with WorkerGroup.{method}; rename the worker method")
            setattr(self, method, self._make_proxy(method, spec))

    # --------------------------------------------------------------- backend hooks
    @property
    @abstractmethod
    def world_size(self) -> int:
        """Number of ranks."""

    @abstractmethod
    def _submit(self, method: str, calls: list[tuple[int, tuple, dict]]) -> list:
        """Start ``method`` for each ``(rank, args, kwargs)``; return one handle per call."""

    @abstractmethod
    def _wait(self, method: str, ranks: list[int], handles: list) -> list:
        """Return the results of ``handles`` in order, raising :class:`WorkerError` on failure."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers. Colocated roles share them, so this stops every role's workers."""

    # --------------------------------------------------------------- direct calls
    def execute_all(self, method_name: str, *args, **kwargs) -> list:
        """Call ``method_name`` with the same arguments on every rank; return the list of results.
        Any method of the worker works (for colocated roles: their ``@register``-ed methods)."""
        return self.execute_all_async(method_name, *args, **kwargs).get()

    def execute_all_async(self, method_name: str, *args, **kwargs) -> WorkerFuture:
        """:meth:`execute_all` without waiting: the calls start now, ``get()`` returns the list of results.
        Calls to one worker process run in the order they were made."""
        ranks = list(range(self.world_size))
        handles = self._submit(method_name, [(r, args, kwargs) for r in ranks])
        return self._list_future(self, method_name, ranks, handles, finish=list)

    def execute_rank_zero(self, method_name: str, *args, **kwargs) -> Any:
        """Call ``method_name`` on rank 0 only and return its result."""
        return self._wait(method_name, [0], self._submit(method_name, [(0, args, kwargs)]))[0]

    # --------------------------------------------------------------- registered methods
    def _make_proxy(self, method: str, spec: MethodSpec) -> Callable:
        mode = get_dispatch_mode(spec.dispatch_mode)
        if mode.collect_fn is collect_dp_compute_proto:
            future_cls = DataProtoFuture
        elif mode.collect_fn is collect_list and spec.execute_mode == Execute.ALL:
            future_cls = self._list_future
        else:
            future_cls = WorkerFuture

        def call(*args, **kwargs):
            args = tuple(a.get() if isinstance(a, WorkerFuture) else a for a in args)  # a future: wait for it
            kwargs = {k: v.get() if isinstance(v, WorkerFuture) else v for k, v in kwargs.items()}
            pad_size = padded_len = 0
            if mode.pads_dataproto:
                args, kwargs, pad_size = pad_dataproto_args(self.world_size, args, kwargs)
                padded_len = next((len(v) for v in (*args, *kwargs.values()) if isinstance(v, DataProto)), 0)
            rank_args, rank_kwargs = mode.dispatch_fn(self, *args, **kwargs)
            ranks = [0] if spec.execute_mode == Execute.RANK_ZERO else list(range(self.world_size))
            calls = [(r, tuple(a[r] for a in rank_args), {k: v[r] for k, v in rank_kwargs.items()})
                     for r in ranks]

            def finish(outputs: list) -> Any:
                if spec.execute_mode == Execute.RANK_ZERO:
                    return outputs[0]
                result = mode.collect_fn(self, outputs)
                if not isinstance(result, DataProto) or not pad_size:
                    return result
                # A method may return k rows per input row (k samples per prompt, interleaved);
                # the padding rows came last, so their outputs are the last pad_size * k rows.
                k, rest = divmod(len(result), padded_len)
                if rest:
                    raise ValueError(f"{self.name}.{method} returned {len(result)} rows for {padded_len} "
                                     "input rows; it must return a whole number of rows per input row")
                return unpad_dataproto(result, pad_size * k)

            future = future_cls(self, method, ranks, self._submit(method, calls), finish)
            return future.get() if spec.blocking else future

        worker_method = getattr(self.worker_cls, method)
        functools.update_wrapper(call, worker_method, assigned=("__name__", "__qualname__", "__doc__"),
                                updated=())
        return call

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, world_size={self.world_size})"
