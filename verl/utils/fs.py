"""Files that are either fully written or not there at all."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success rename it to ``path``.

    A crash or an exception mid-write leaves any previous file at ``path`` untouched and no
    temporary file behind (the rename is atomic because both names are in the same folder).
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # Created like any new file (mode 0o666 less the umask, not mkstemp's 0o600), under a name no one else uses.
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def atomic_torch_save(obj, path: str) -> None:
    """``torch.save`` through :func:`atomic_write`."""
    import torch

    with atomic_write(path) as f:
        torch.save(obj, f)
