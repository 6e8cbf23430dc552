"""How a worker method's arguments are split over ranks and how the results come back.

A worker class marks each method the driver may call with :func:`register`::

    class CriticWorker(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def compute_values(self, data: DataProto) -> DataProto: ...

The WorkerGroup turns every registered method into a driver-side call of the same name that
*dispatches* the arguments (one share per rank), runs the method on the ranks, and *collects* the
per-rank results into one value. A dispatch mode is a named pair of functions:

- ``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)``: every positional argument
  and every keyword value of the result is a list with one entry per rank;
- ``collect_fn(worker_group, outputs: list) -> result``: ``outputs[i]`` is rank i's return value.

The built-in modes are the attributes of :class:`Dispatch`; :func:`register_dispatch_mode` adds
a mode under a new name, after which ``Dispatch.<NAME>`` refers to it. As in the original verl,
``@register(dispatch_mode={"dispatch_fn": ..., "collect_fn": ...})`` also gives one method a mode
of its own without naming it. The original's import path ``verl.single_controller.base.decorator``
is this module.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from verl.protocol import DataProto, pad_dataproto_to_divisor

__all__ = ["Dispatch", "Execute", "register", "register_dispatch_mode", "get_dispatch_mode",
           "registered_methods", "MethodSpec", "DispatchMode"]


class Dispatch:
    """Names of the dispatch modes (plain strings; :func:`register_dispatch_mode` adds more).

    - ``RANK_ZERO``: run on rank 0 only, with the arguments as given; return its result.
    - ``ONE_TO_ALL``: every rank gets the arguments as given; return the list of rank results.
    - ``ALL_TO_ALL``: the default; same split and result as ``ONE_TO_ALL``.
    - ``DP_COMPUTE``: each argument is a list with one entry per rank, entry i goes to rank i;
      return the list of rank results.
    - ``DP_COMPUTE_PROTO``: each DataProto argument is padded to a multiple of the world size
      (rows repeated from its start) and cut into equal consecutive chunks, chunk i to rank i;
      other arguments go to every rank as given. The rank results (DataProtos) are concatenated
      in rank order and the padding rows removed, so the result lines up with the input.
    - ``DP_COMPUTE_PROTO_WITH_FUNC``: the first argument is a function, sent to every rank; the
      other arguments are split and the results gathered as in ``DP_COMPUTE_PROTO``. The method
      typically calls the function on its chunk (``Worker.execute_with_func_generator``).
    - ``DP_COMPUTE_METRIC``: split like ``DP_COMPUTE_PROTO``; return the list of rank results
      (typically metric dicts). Padding rows are seen by the last ranks.
    """

    RANK_ZERO = "RANK_ZERO"
    ONE_TO_ALL = "ONE_TO_ALL"
    ALL_TO_ALL = "ALL_TO_ALL"
    DP_COMPUTE = "DP_COMPUTE"
    DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO"
    DP_COMPUTE_PROTO_WITH_FUNC = "DP_COMPUTE_PROTO_WITH_FUNC"
    DP_COMPUTE_METRIC = "DP_COMPUTE_METRIC"


class Execute(enum.Enum):
    """Which ranks run a call: all of them, or rank 0 alone (which then returns its own result,
    without a collect step)."""

    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"


# ----------------------------------------------------------------------------- built-in modes
def dispatch_one_to_all(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return [[a] * n for a in args], {k: [v] * n for k, v in kwargs.items()}


def dispatch_dp_compute(worker_group, *args, **kwargs):
    n = worker_group.world_size
    named = [*((f"argument {i}", a) for i, a in enumerate(args)),
             *((f"argument {k!r}", v) for k, v in kwargs.items())]
    for where, value in named:
        if not isinstance(value, (list, tuple)) or len(value) != n:
            got = f"a {type(value).__name__} of length {len(value)}" if isinstance(value, (list, tuple)) \
                else f"a {type(value).__name__}"
            raise ValueError(f"Dispatch.DP_COMPUTE needs every argument to be a list with one entry "
                             f"per rank ({n}); {where} is {got}")
    return [list(a) for a in args], {k: list(v) for k, v in kwargs.items()}


def dispatch_dp_compute_proto(worker_group, *args, **kwargs):
    """Chunk every DataProto argument over the ranks (their lengths must already divide the world
    size: the WorkerGroup pads them first, see :func:`pad_dataproto_args`); others are replicated."""
    n = worker_group.world_size

    def split(value):
        return value.chunk(n) if isinstance(value, DataProto) else [value] * n

    return [split(a) for a in args], {k: split(v) for k, v in kwargs.items()}


def dispatch_dp_compute_proto_with_func(worker_group, *args, **kwargs):
    """The function to every rank, the rest as :func:`dispatch_dp_compute_proto` splits it."""
    if not args or not callable(args[0]):
        got = f"a {type(args[0]).__name__}" if args else "no positional argument"
        raise TypeError(f"Dispatch.DP_COMPUTE_PROTO_WITH_FUNC takes a function as its first argument (each rank "
                        f"calls it on its chunk), got {got}")
    rank_args, rank_kwargs = dispatch_dp_compute_proto(worker_group, *args[1:], **kwargs)
    return [[args[0]] * worker_group.world_size, *rank_args], rank_kwargs


def collect_list(worker_group, outputs: list) -> list:
    return list(outputs)


def collect_first(worker_group, outputs: list) -> Any:
    return outputs[0]


def collect_dp_compute_proto(worker_group, outputs: list) -> DataProto:
    if not all(isinstance(o, DataProto) for o in outputs):
        kinds = sorted({type(o).__name__ for o in outputs})
        raise TypeError(f"a Dispatch.DP_COMPUTE_PROTO method must return a DataProto on every rank, "
                        f"got {kinds}; use Dispatch.DP_COMPUTE_METRIC to get a list of other values")
    return DataProto.concat(outputs)


def pad_dataproto_args(world_size: int, args: tuple, kwargs: dict) -> tuple[tuple, dict, int]:
    """Pad every DataProto argument to a multiple of ``world_size``; return the padded arguments
    and the number of rows added (the same for all, since they must have the same length)."""
    protos = [v for v in (*args, *kwargs.values()) if isinstance(v, DataProto)]
    lengths = {len(p) for p in protos}
    if len(lengths) > 1:
        raise ValueError(f"the DataProto arguments of one call must have the same length to be "
                         f"split over ranks together; got lengths {sorted(lengths)}")

    def pad(value):
        return pad_dataproto_to_divisor(value, world_size)[0] if isinstance(value, DataProto) else value

    pad_size = (-lengths.pop()) % world_size if lengths else 0
    return tuple(pad(a) for a in args), {k: pad(v) for k, v in kwargs.items()}, pad_size


# ----------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class DispatchMode:
    name: str
    dispatch_fn: Callable
    collect_fn: Callable
    pads_dataproto: bool = False  # pad DataProto arguments to the world size before dispatch


_MODES: dict[str, DispatchMode] = {}


def _add_mode(mode: DispatchMode) -> None:
    _MODES[mode.name] = mode
    setattr(Dispatch, mode.name, mode.name)


for _mode in (
    DispatchMode(Dispatch.RANK_ZERO, dispatch_one_to_all, collect_first),
    DispatchMode(Dispatch.ONE_TO_ALL, dispatch_one_to_all, collect_list),
    DispatchMode(Dispatch.ALL_TO_ALL, dispatch_one_to_all, collect_list),
    DispatchMode(Dispatch.DP_COMPUTE, dispatch_dp_compute, collect_list),
    DispatchMode(Dispatch.DP_COMPUTE_PROTO, dispatch_dp_compute_proto, collect_dp_compute_proto, True),
    DispatchMode(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, dispatch_dp_compute_proto_with_func, collect_dp_compute_proto,
                 True),
    DispatchMode(Dispatch.DP_COMPUTE_METRIC, dispatch_dp_compute_proto, collect_list, True),
):
    _add_mode(_mode)


def register_dispatch_mode(name: str, dispatch_fn: Callable, collect_fn: Callable) -> str:
    """Add a dispatch mode (see the module docstring for the two functions' contracts) and return
    its name, which is also available as ``Dispatch.<name>`` from now on."""
    if not name.isidentifier():
        raise ValueError(f"a dispatch mode name must be a Python identifier, got {name!r}")
    if name in _MODES:
        raise ValueError(f"dispatch mode {name!r} already exists; pick another name")
    _add_mode(DispatchMode(name, dispatch_fn, collect_fn))
    return name


def get_dispatch_mode(mode: str | dict | DispatchMode) -> DispatchMode:
    """The mode named ``mode``; a ``{"dispatch_fn", "collect_fn"}`` dict (the original's inline form)
    or a :class:`DispatchMode` is a mode of its own."""
    if isinstance(mode, DispatchMode):
        return mode
    if isinstance(mode, dict):
        missing = sorted({"dispatch_fn", "collect_fn"} - mode.keys())
        if missing or not all(callable(mode[k]) for k in ("dispatch_fn", "collect_fn")):
            raise ValueError(f"a dispatch mode given as a dict needs callable 'dispatch_fn' and 'collect_fn' "
                             f"entries; got keys {sorted(mode)}")
        fn = mode["dispatch_fn"]
        return DispatchMode(f"custom:{getattr(fn, '__qualname__', repr(fn))}", fn, mode["collect_fn"])
    try:
        return _MODES[mode]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dispatch mode {mode!r}; known modes: {sorted(_MODES)} "
                         f"(add one with register_dispatch_mode)") from None


# ----------------------------------------------------------------------------- @register
_SPEC_ATTR = "__verl_register__"


@dataclass(frozen=True)
class MethodSpec:
    """What ``@register`` stored on a method: a mode's name, or a mode of its own (given as a dict)."""

    dispatch_mode: str | DispatchMode
    execute_mode: Execute
    blocking: bool


def register(dispatch_mode: str | dict | DispatchMode = Dispatch.ALL_TO_ALL, execute_mode: Execute = Execute.ALL,
             blocking: bool = True):
    """Mark a worker method as callable from the driver through a WorkerGroup.

    ``blocking=False`` makes the driver-side call return a future at once; ``future.get()`` waits
    and returns what the blocking call would have. ``Dispatch.RANK_ZERO`` implies
    ``Execute.RANK_ZERO``.
    """
    mode = get_dispatch_mode(dispatch_mode)  # fail at class definition on a misspelled mode
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")
    if mode.name == Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    spec = MethodSpec(mode.name if _MODES.get(mode.name) is mode else mode, execute_mode, blocking)

    def decorate(fn):
        if inspect.iscoroutinefunction(fn):
            raise TypeError(f"@register does not support async methods ({fn.__qualname__})")
        setattr(fn, _SPEC_ATTR, spec)
        return fn

    return decorate


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """The ``@register``-ed methods of ``cls`` (including inherited ones), by name."""
    specs = {name: getattr(getattr(cls, name, None), _SPEC_ATTR, None) for name in dir(cls)}
    return {name: spec for name, spec in specs.items() if isinstance(spec, MethodSpec)}
