"""Sockets for the stores processes meet at: a free port, the interface holding an address, and a TCP store
served on one address only.

``torch.distributed.TCPStore`` binding its own socket listens on every interface, whatever host it is given;
:func:`serve_store` binds the socket itself, so a store on ``127.0.0.1`` is reachable from this machine alone
and one on a node's cluster address from that network alone.
"""

from __future__ import annotations

import socket
from datetime import timedelta

__all__ = ["free_port", "interface_of", "serve_store"]


def free_port(host: str) -> int:
    """A TCP port free at the moment on ``host`` (an address of this machine), for a store this process serves."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
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


def serve_store(host: str, port: int, world_size: int, timeout: timedelta | None = None):
    """The master side of a ``TCPStore`` for ``world_size`` processes, listening on ``host:port`` only. Raises
    OSError when the address cannot be bound (not this machine's, or the port taken): callers say what to do."""
    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(world_size)
    except OSError:
        listener.close()
        raise
    kwargs = {} if timeout is None else {"timeout": timeout}
    return TCPStore(host, port, world_size, is_master=True, wait_for_workers=False,
                    master_listen_fd=listener.detach(), use_libuv=False, **kwargs)
