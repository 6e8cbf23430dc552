"""A process group of its own between trainer rank 0 and the rollout workers, and the bucketed broadcast over it.

The trainer's ranks and the rollout workers already belong to default process groups of their own (FSDP's, the
rollout's), with other worlds; the group here is built from a TCP store and kept out of torch.distributed's global
registry, so it neither disturbs those groups nor depends on them. Rank 0 is the sender, ranks 1..R the receivers.

Weights travel in flat uint8 buckets of at most ``bucket_bytes``; before each bucket a small JSON header names the
tensors in it (name, dtype, shape, byte offset). A header per bucket, rather than one manifest up front, is what lets
the sender consume a lazy iterator: the trainer gathers its FSDP shards one parameter at a time, and the names,
dtypes and shapes of what is still to come are unknown without gathering it.
"""

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from urllib.parse import urlsplit

import torch
from torch.distributed import ProcessGroup, TCPStore

from verl.utils.net import serve_store

NamedTensors = list[tuple[str, torch.Tensor]]

# Each tensor starts on a 64-byte boundary: a uint8 slice can then be viewed as any dtype, and read with wide loads.
_ALIGN = 64
# Header lengths that carry no header: the end of a send, and the sender failing midway.
_END = 0
_ABORT = -1


class WeightSyncGroup:
    """One weight-sync group, as seen from one of its processes.

    Every member constructs it with the same ``init_method`` and ``world_size``; construction returns once all of
    them have joined (or raises after ``timeout`` seconds). ``device`` picks the transport: gloo for ``cpu``, NCCL for
    ``cuda`` (the sender's buckets and the receivers' buffers live there). Rank 0 hosts the rendezvous store, bound
    to the host of ``init_method`` only, so the address must be one of rank 0's own. ``timeout`` bounds every wait,
    a receiver's wait for a send to begin included: call :meth:`receive` when the controller has started a send.
    """

    def __init__(self, init_method: str, rank: int, world_size: int, device: torch.device | str = "cpu",
                 timeout: float = 600.0):
        if world_size < 2:
            raise ValueError(f"WeightSyncGroup: world_size={world_size}, but the group needs the sender (trainer rank "
                             "0) and at least one rollout process: world_size = 1 + the number of rollout processes")
        if not 0 <= rank < world_size:
            raise ValueError(f"WeightSyncGroup: rank {rank} is outside 0..{world_size - 1} (0 is trainer rank 0, "
                             f"1..{world_size - 1} the rollout processes)")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"WeightSyncGroup: device {device} is not supported: use 'cpu' (gloo) or 'cuda' (NCCL)")
        self.rank, self.world_size, self.device = rank, world_size, device
        host, port = _parse_address(init_method)
        self._store = _rendezvous_store(host, port, rank, world_size, timedelta(seconds=timeout))
        self._group = _new_group(self._store, rank, world_size, device, timedelta(seconds=timeout))

    @torch.no_grad()
    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> dict:
        """Broadcasts every tensor to the receivers; returns ``bytes``, ``tensors``, ``buckets`` and ``seconds``.

        Packing the next bucket (which, for a lazy iterator, includes producing its tensors) runs while the previous
        bucket is on the wire, so at most two buckets are alive: the extra device memory is 2 x ``bucket_bytes``.
        A tensor larger than a bucket is sent alone, from its own memory. Trainer ranks other than 0 are not in
        this group but must step through the same iterator when it gathers shards: see :func:`drain`.

        If the iterator raises, the receivers are told before the error propagates, so they raise at once instead
        of waiting out the timeout, and the group stays usable for the next send.
        """
        self._check_role(sender=True)
        if bucket_bytes < _ALIGN:
            raise ValueError(f"bucket_bytes={bucket_bytes} is too small to hold a tensor: set "
                             "checkpoint_engine.update_weights_bucket_megabytes to at least 1")
        start = time.perf_counter()
        stats = {"bytes": 0, "tensors": 0, "buckets": 0}
        buckets = _pack_buckets(named_tensors, bucket_bytes, self.device)
        in_flight = None  # (work, payload): the payload stays referenced until its broadcast has been waited on
        while True:
            try:
                manifest, payload = next(buckets, (None, None))
            except Exception:
                if in_flight is not None:
                    in_flight[0].wait()
                self._broadcast_length(_ABORT)
                raise
            if manifest is None:
                break
            if in_flight is not None:
                in_flight[0].wait()
            header = json.dumps({"nbytes": payload.numel(), "tensors": manifest}).encode()
            self._broadcast_length(len(header))
            self._broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device))
            in_flight = (self._group.broadcast(payload, 0), payload)
            stats["bytes"] += payload.numel()
            stats["tensors"] += len(manifest)
            stats["buckets"] += 1
        if in_flight is not None:
            in_flight[0].wait()
        self._broadcast_length(_END)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return {**stats, "seconds": time.perf_counter() - start}

    def receive(self, on_bucket: Callable[[NamedTensors], None] | None = None) -> NamedTensors:
        """Receives one send, bit-identical to what was sent, as views into one buffer per bucket on ``device``.

        Without ``on_bucket`` it returns every (name, tensor): a full copy of the weights. With ``on_bucket`` each
        bucket is handed over as it lands and not kept (the returned list is empty), so applying weights this way
        costs one bucket of memory, not a second model. If ``on_bucket`` raises, the remaining buckets are still
        received (and dropped) before the error is raised, so the sender is not left blocked.

        It touches only this group, so a background thread may call it while the main thread keeps computing.
        """
        self._check_role(sender=False)
        received, failure = [], None
        while (header := self._receive_header()) is not None:
            buffer = torch.empty(header["nbytes"], dtype=torch.uint8, device=self.device)
            self._broadcast(buffer)
            bucket = [(name, _view(buffer, dtype, shape, offset)) for name, dtype, shape, offset in header["tensors"]]
            if on_bucket is None:
                received.extend(bucket)
            elif failure is None:
                try:
                    on_bucket(bucket)
                except Exception as error:
                    failure = error
        if failure is not None:
            raise failure
        return received

    def close(self) -> None:
        """Shuts this process's end of the group down; local, not a collective. Closing twice is harmless."""
        if self._group is not None:
            self._group.shutdown()
        self._group = self._store = None

    def __enter__(self) -> "WeightSyncGroup":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _check_role(self, sender: bool) -> None:
        if self._group is None:
            raise RuntimeError("this WeightSyncGroup is closed: create a new one (on every member) to sync again")
        if sender != (self.rank == 0):
            raise RuntimeError(f"WeightSyncGroup rank {self.rank} called {'send' if sender else 'receive'}(): rank 0 "
                               f"(trainer rank 0) sends, ranks 1..{self.world_size - 1} (the rollout) receive")

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self._group.broadcast(tensor, 0).wait()

    def _broadcast_length(self, length: int) -> None:
        self._broadcast(torch.tensor([length], dtype=torch.int64, device=self.device))

    def _receive_header(self) -> dict | None:
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(length)
        length = int(length.item())
        if length == _END:
            return None
        if length == _ABORT:
            raise RuntimeError("the weight sender (trainer rank 0) failed midway through a send: buckets already "
                               "handed to on_bucket were applied, the rest never came, so sync again before trusting "
                               "these weights. The cause is in trainer rank 0's log.")
        header = torch.empty(length, dtype=torch.uint8, device=self.device)
        self._broadcast(header)
        return json.loads(header.cpu().numpy().tobytes())


def drain(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Steps through the weight iterator without sending: what trainer ranks other than 0 do while rank 0 sends.

    Gathering a sharded parameter is a collective of the trainer's own group, so every trainer rank must run the
    same iterator to the end, or rank 0's gather waits for ranks that never join.
    """
    for _ in named_tensors:
        pass


def _pack_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
                  device: torch.device) -> Iterator[tuple[list, torch.Tensor]]:
    """Yields (manifest, uint8 payload) per bucket, filling two buffers in turn.

    A buffer is written again only two yields after it was handed out, by which time :meth:`WeightSyncGroup.send`
    has waited for its broadcast. Copying into a view of the buffer also makes non-contiguous tensors contiguous
    without an extra copy.
    """
    buffers, current, manifest, used = [], 0, [], 0
    for name, tensor in named_tensors:
        tensor = tensor.detach()
        nbytes = tensor.numel() * tensor.element_size()
        if manifest and _aligned(used) + nbytes > bucket_bytes:
            yield manifest, buffers[current][:used]
            current, manifest, used = 1 - current, [], 0
        if nbytes > bucket_bytes:
            yield [_entry(name, tensor, 0)], tensor.to(device).contiguous().view(-1).view(torch.uint8)
            continue
        if not buffers:  # allocated on first use: a send of oversized tensors only needs none
            buffers = [torch.empty(bucket_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        entry = _entry(name, tensor, _aligned(used))
        _view(buffers[current], *entry[1:]).copy_(tensor)
        manifest.append(entry)
        used = entry[3] + nbytes
    if manifest:
        yield manifest, buffers[current][:used]


def _entry(name: str, tensor: torch.Tensor, offset: int) -> list:
    return [name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset]


def _view(buffer: torch.Tensor, dtype_name: str, shape: list[int], offset: int) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    return buffer[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _parse_address(init_method: str) -> tuple[str, int]:
    parts = urlsplit(init_method)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise ValueError(f"weight-sync address {init_method!r} is not of the form tcp://HOST:PORT: give the address "
                         "of trainer rank 0's host and a free port on it")
    return parts.hostname, port


def _rendezvous_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> TCPStore:
    """Rank 0 hosts the store on a socket it binds itself: a TCPStore that binds its own listens on every
    interface, whatever host it is given."""
    if rank == 0:
        try:
            return serve_store(host, port, world_size, timeout)
        except OSError as error:
            raise RuntimeError(f"the weight-sync sender cannot listen on {host}:{port} ({error}): give an address of "
                               "this host and a port that is free on it") from error
    try:
        return TCPStore(host, port, world_size, False, timeout)
    except RuntimeError as error:
        raise RuntimeError(f"rollout process {rank} could not reach the weight-sync store at tcp://{host}:{port} "
                           f"within {timeout.total_seconds():g} s: check that trainer rank 0 creates its "
                           "WeightSyncGroup at that address and that this host can reach it") from error


def _new_group(store: TCPStore, rank: int, world_size: int, device: torch.device,
               timeout: timedelta) -> ProcessGroup:
    """Builds the group from the store the way torch's ``_new_process_group_helper`` does, minus the registration
    in torch.distributed's globals: nothing else in the process can see, reuse or destroy it."""
    if device.type == "cpu":
        backend_type = ProcessGroup.BackendType.GLOO
        backend = torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)
    else:
        backend_type = ProcessGroup.BackendType.NCCL
        options = torch.distributed.ProcessGroupNCCL.Options()
        options._timeout = timeout
        backend = torch.distributed.ProcessGroupNCCL(store, rank, world_size, options)
        backend.eager_connect_single_device(device)  # connect now, as gloo does, so rendezvous errors surface here
    group = ProcessGroup(store, rank, world_size)
    group._set_default_backend(backend_type)
    group._register_backend(torch.device(device.type), backend_type, backend)
    return group
