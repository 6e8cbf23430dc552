"""The base class of every worker: where it sits (rank, world size, device) and its
torch.distributed process group.

A WorkerGroup starts one worker per device and tells each one its place through environment
variables, set before the worker's ``__init__`` runs:

- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (index among the group's workers on its node),
  ``LOCAL_WORLD_SIZE``;
- ``VERL_DEVICE``: ``cpu`` or ``cuda``;
- ``VERL_DIST_INIT_METHOD``: the torch.distributed rendezvous. On one node it is a ``file://``
  path in the temp folder, so no socket is opened for the rendezvous at all; across nodes it is
  ``tcp://<rank-0 node address>:<port>``.

A worker created by hand (no group) is rank 0 of a world of 1, which makes unit tests and
debugging of a single worker easy.

On CUDA, constructing a worker also points its process's compile caches at a persistent folder
(:func:`verl.utils.startup.use_compile_cache`) before anything compiles, and ``startup_phases``
reports the process's start-up phases to the driver.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import tempfile
import urllib.parse

import torch
import torch.distributed as dist

from verl.single_controller.decorator import Dispatch, register
from verl.utils import startup

__all__ = ["Worker", "INIT_METHOD_ENV", "DEVICE_ENV"]

INIT_METHOD_ENV = "VERL_DIST_INIT_METHOD"
NODE_IP_ENV = "VERL_NODE_IP"  # the worker's node address in the cluster (set by the Ray worker group)
DEVICE_ENV = "VERL_DEVICE"


class Worker:
    """Subclass this, call ``super().__init__()`` first, and mark the methods the driver may call
    with ``@register(...)``. Call :meth:`init_process_group` (in ``__init__`` or in an ``init_model``
    method) before using collectives; roles colocated in one process share the one process group.
    """

    def __init__(self):
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.device_name = os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device_name not in ("cpu", "cuda"):
            raise ValueError(f"{DEVICE_ENV}={self.device_name!r}; expected 'cpu' or 'cuda'")
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
        init_method = os.environ.get(INIT_METHOD_ENV)
        if init_method is None:
            if self.world_size != 1:
                raise RuntimeError(f"WORLD_SIZE={self.world_size} but {INIT_METHOD_ENV} is not set: "
                                   "start multi-rank workers through a WorkerGroup")
            init_method = "file://" + os.path.join(tempfile.mkdtemp(prefix="verl-rdzv-"), "store")
        timeout = datetime.timedelta(seconds=timeout_s)
        if init_method.startswith("file://"):
            # One node: keep the collective library's own sockets on loopback too.
            _loopback_collectives()
            os.makedirs(os.path.dirname(init_method[len("file://"):]), exist_ok=True)
            rendezvous = {"init_method": init_method}
        else:  # tcp://host:port on rank 0's node (several nodes)
            rendezvous = {"store": _tcp_store(init_method, self.rank, self.world_size, timeout)}
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, timeout=timeout, **rendezvous)
        return dist.group.WORLD

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def startup_phases(self) -> dict[str, float]:
        """This process's start-up phases and compile figures so far (:func:`verl.utils.startup.worker_snapshot`);
        colocated roles share the process, so each role reports the same."""
        return startup.worker_snapshot()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"


def free_port(host: str) -> int:
    """A TCP port free at the moment on ``host`` (an address of this machine), for a store this process serves."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def interface_of(ip: str) -> str | None:
    """The name of this machine's network interface holding IPv4 address ``ip`` (Linux), or None."""
    import fcntl
    import struct

    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:  # SIOCGIFADDR
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == ip:
            return name
    return None


def _loopback_collectives() -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def _tcp_store(init_method: str, rank: int, world_size: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """The rendezvous store of a group spread over nodes: served by rank 0 on its node's address only
    (torch's own ``tcp://`` store would listen on every interface), joined by the other ranks."""
    address = urllib.parse.urlparse(init_method)
    host, port = address.hostname, address.port
    if host is None or port is None:
        raise ValueError(f"{INIT_METHOD_ENV}={init_method!r} is not tcp://HOST:PORT")
    if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
        _loopback_collectives()  # nodes on one machine (tests): the collectives stay on loopback too
    elif "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo would take the hostname's address, often 127.0.1.1, unreachable from other machines:
        # use the interface of this node's cluster address instead.
        interface = interface_of(os.environ.get(NODE_IP_ENV, ""))
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    if rank != 0:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(world_size)
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=listener.detach(), use_libuv=False)
