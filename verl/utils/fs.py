"""Files that are either fully written or not there at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success rename it to ``path``.

    A crash or an exception mid-write leaves any previous file at ``path`` untouched and no
    temporary file behind (the rename is atomic because both names are in the same folder).
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
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
