"""What a worker process listens on: tests check that everything binds to loopback only."""

import os
import socket

LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def listening_addresses() -> set[str]:
    """Local addresses of the TCP sockets this process listens on."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table, family in (("/proc/self/net/tcp", socket.AF_INET), ("/proc/self/net/tcp6", socket.AF_INET6)):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    raw = bytes.fromhex(fields[1].split(":")[0])
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # per-word endianness
                    found.add(socket.inet_ntop(family, raw))
    return found
