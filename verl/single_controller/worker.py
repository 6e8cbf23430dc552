"""The base class of every worker: where it sits (rank, world size, device) and its
torch.distributed process group.

A WorkerGroup starts one worker per device and tells each one its place through environment
variables, set before the worker's ``__init__`` runs -- the ones torch.distributed reads:

- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (index among the group's workers on its node),
  ``LOCAL_WORLD_SIZE``;
- ``MASTER_ADDR``, ``MASTER_PORT``: the group's rendezvous store, which rank 0's ``Worker.__init__``
  serves on that address only (``127.0.0.1`` when the group is on one node, rank 0's node address
  otherwise). ``TORCHELASTIC_USE_AGENT_STORE=True`` tells torch that the store is served already,
  so code written for the original verl that calls ``torch.distributed.init_process_group()``
  (the ``env://`` rendezvous) joins the same store instead of opening one on every interface;
- ``VERL_DEVICE``: ``cpu`` or ``cuda``.

A worker created by hand (no group) is rank 0 of a world of 1, which makes unit tests and
debugging of a single worker easy; its process group meets through a private file.

On CUDA, constructing a worker also points its process's compile caches at a persistent folder
(:func:`verl.utils.startup.use_compile_cache`) before anything compiles, and ``startup_phases``
reports the process's start-up phases to the driver.

The original verl's import path ``verl.single_controller.base.worker`` is this module.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import tempfile

import torch
import torch.distributed as dist

from verl.single_controller.decorator import Dispatch, Execute, register
from verl.utils import startup
from verl.utils.net import free_port, interface_of, serve_store  # noqa: F401 - free_port: the groups' import

__all__ = ["Worker", "DEVICE_ENV", "rendezvous_env"]

NODE_IP_ENV = "VERL_NODE_IP"  # the worker's node address in the cluster (set by the Ray worker group)
DEVICE_ENV = "VERL_DEVICE"
HOSTS_STORE_ENV = "VERL_RANK0_HOSTS_STORE"  # "1": this group's rank 0 serves the store at MASTER_ADDR:MASTER_PORT

# The rendezvous stores this process serves, by (address, port): colocated roles share one process and its store.
_SERVED_STORES: dict[tuple[str, int], dist.TCPStore] = {}


def rendezvous_env(master_addr: str, master_port: int) -> dict[str, str]:
    """The environment a WorkerGroup gives each of its ranks (with ``RANK``, ``WORLD_SIZE``, ...) so that
    they meet at ``master_addr:master_port``, served by rank 0."""
    return {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",  # older torch reads it on the agent-store path (a key prefix)
            HOSTS_STORE_ENV: "1"}


class Worker:
    """Subclass this, call ``super().__init__()`` first, and mark the methods the driver may call
    with ``@register(...)``. Call :meth:`init_process_group` (in ``__init__`` or in an ``init_model``
    method) before using collectives -- or, as in the original verl,
    ``torch.distributed.init_process_group(backend)``, which meets at the same store; roles colocated
    in one process share the one process group.
    """

    def __init__(self):
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.device_name = os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device_name not in ("cpu", "cuda"):
            raise ValueError(f"{DEVICE_ENV}={self.device_name!r}; expected 'cpu' or 'cuda'")
        if os.environ.get(HOSTS_STORE_ENV) == "1":
            # Before any subclass code runs: it may join the process group in its own __init__, through
            # init_process_group or torch.distributed.init_process_group (env://).
            _collectives_interface(os.environ["MASTER_ADDR"])
            if self.rank == 0:
                _serve_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), self.world_size)
        startup.prepare_worker_process(self.device_name)

    @property
    def device(self) -> torch.device:
        if self.device_name == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def init_process_group(self, backend: str | None = None, timeout_s: float = 1800.0):
        """Join the group's torch.distributed world (``gloo`` on CPU, ``nccl`` on CUDA unless
        ``backend`` says otherwise). Does nothing if this process already joined one, so every
        colocated role may call it."""
        if dist.is_initialized():
            return dist.group.WORLD
        if self.device_name == "cuda":
            # Ray shows each worker only its own GPU; without Ray, pick by local rank.
            torch.cuda.set_device(0 if torch.cuda.device_count() == 1 else self.local_rank)
        backend = backend or ("nccl" if self.device_name == "cuda" else "gloo")
        timeout = datetime.timedelta(seconds=timeout_s)
        if os.environ.get(HOSTS_STORE_ENV) == "1":
            host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            rendezvous = {"store": _join_store(host, port, self.rank, self.world_size, timeout)}
        elif self.world_size == 1:  # a worker made by hand: a private group of one, met through a file
            _loopback_collectives()
            rendezvous = {"init_method": "file://" + os.path.join(tempfile.mkdtemp(prefix="verl-rdzv-"), "store")}
        else:
            raise RuntimeError(f"WORLD_SIZE={self.world_size} but no rendezvous is set up for this worker: start "
                               "multi-rank workers through a WorkerGroup")
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, timeout=timeout, **rendezvous)
        return dist.group.WORLD

    def get_master_addr_port(self) -> tuple[str | None, str | None]:
        """The group's rendezvous address and port (``MASTER_ADDR``, ``MASTER_PORT``), as strings."""
        return os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")

    def get_cuda_visible_devices(self) -> str:
        """``CUDA_VISIBLE_DEVICES`` of this worker's process (Ray sets it to the worker's GPU), or ``"not set"``."""
        return os.environ.get("CUDA_VISIBLE_DEVICES", "not set")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func, *args, **kwargs):
        """Run a function sent by the driver on this rank's chunk: ``func(worker, *chunks, **kwargs)``
        (the DataProto arguments are split over the ranks and the DataProto results concatenated)."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        """Run a function sent by the driver on rank 0 only: ``func(*args, **kwargs)``."""
        return func(*args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def startup_phases(self) -> dict[str, float]:
        """This process's start-up phases and compile figures so far (:func:`verl.utils.startup.worker_snapshot`);
        colocated roles share the process, so each role reports the same."""
        return startup.worker_snapshot()

    def close(self) -> None:
        """Stop what this worker runs beside its calls (threads of its own). Called when its group shuts down in a
        process that lives on (the local backend: the driver's own); a Ray worker's process just ends."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"


def _loopback_collectives() -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def _collectives_interface(host: str) -> None:
    """Keep gloo and NCCL's own sockets on loopback when the group meets there (one node); across nodes,
    point gloo at the interface of this node's cluster address."""
    if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
        _loopback_collectives()
    elif "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo would take the hostname's address, often 127.0.1.1, unreachable from other machines.
        interface = interface_of(os.environ.get(NODE_IP_ENV, ""))
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface


def _serve_store(host: str, port: int, world_size: int) -> dist.TCPStore:
    """Serve the group's rendezvous store on ``host:port`` only (see :func:`verl.utils.net.serve_store`)."""
    if (host, port) not in _SERVED_STORES:
        try:
            _SERVED_STORES[host, port] = serve_store(host, port, world_size)
        except OSError as error:
            raise RuntimeError(f"rank 0 cannot serve the worker group's rendezvous store on {host}:{port} ({error}); "
                               "another process took the port after the group picked it: create the group "
                               "again") from error
    return _SERVED_STORES[host, port]


def _join_store(host: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    if rank == 0 and (host, port) in _SERVED_STORES:
        store = _SERVED_STORES[host, port]
        store.set_timeout(timeout)
        return store
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
