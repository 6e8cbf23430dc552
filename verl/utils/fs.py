"""Files that are either fully written or not there at all, and local copies of remote (HDFS) or
shared-memory paths (the original's ``copy_to_local``)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
from typing import IO, Iterator

_HDFS_PREFIX = "hdfs://"
_SHM_ROOT = "/dev/shm/verl-cache"
_TREE_RECORD = ".directory_record.txt"


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


# ------------------------------------------------------------------------------------------------ local copies
def is_non_local(path: str) -> bool:
    """True for an HDFS path (``hdfs://...``)."""
    return path.startswith(_HDFS_PREFIX)


def md5_encode(path: str) -> str:
    return hashlib.md5(path.encode()).hexdigest()


def _tree(folder: str) -> set[str]:
    """``dir:<relative path>`` and ``file:<relative path>`` for everything under ``folder`` (the record file
    aside)."""
    entries = set()
    for root, dirs, files in os.walk(folder):
        entries.update(f"dir:{os.path.relpath(os.path.join(root, d), folder)}" for d in dirs)
        entries.update(f"file:{os.path.relpath(os.path.join(root, f), folder)}" for f in files if f != _TREE_RECORD)
    return entries


def _same_copy(src: str, dest: str) -> bool:
    """Whether ``dest`` holds a complete copy of ``src``: the same files (and folders) with the same sizes."""
    if not (os.path.exists(src) and os.path.exists(dest)) or os.path.isfile(src) != os.path.isfile(dest):
        return False
    if os.path.isfile(src):
        return os.path.getsize(src) == os.path.getsize(dest)
    if _tree(src) != _tree(dest):
        return False
    return all(os.path.getsize(os.path.join(src, entry[5:])) == os.path.getsize(os.path.join(dest, entry[5:]))
               for entry in _tree(src) if entry.startswith("file:"))


def _complete_copy(local_path: str) -> bool:
    """A copied file, or a copied folder whose files are all still those recorded after the copy."""
    if os.path.isfile(local_path):
        return True
    record = os.path.join(local_path, _TREE_RECORD)
    if not os.path.exists(record):
        return False
    with open(record) as f:
        return _tree(local_path) == set(f.read().splitlines())


def _hdfs_get(src: str, dest: str) -> None:
    hdfs = shutil.which("hdfs")
    if hdfs is None:
        raise FileNotFoundError(f"copy_to_local: {src} is on HDFS but the `hdfs` command is not on PATH; install "
                                "the Hadoop client, or copy the files to a local folder and give that path")
    result = subprocess.run([hdfs, "dfs", "-get", src, dest], capture_output=True, text=True)
    if result.returncode != 0:
        raise OSError(f"copy_to_local: `hdfs dfs -get {src} {dest}` failed: {result.stderr.strip()}")


def _copy_from_hdfs(src: str, cache_dir: str | None, verbose: bool, always_recopy: bool) -> str:
    """``<cache_dir>/<md5(src)>/<basename>``, copied from HDFS under a lock unless a complete copy is there."""
    if src.endswith("/"):
        raise ValueError(f"copy_to_local: drop the trailing '/' of {src} (its base name names the local copy)")
    cache_dir = cache_dir or tempfile.gettempdir()
    local_path = os.path.join(cache_dir, md5_encode(src), os.path.basename(src))
    os.makedirs(os.path.dirname(local_path), exist_ok=True)
    with open(os.path.join(cache_dir, md5_encode(src) + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process copies; the others wait and reuse its copy
        if os.path.exists(local_path) and (always_recopy or not _complete_copy(local_path)):
            if os.path.isdir(local_path):
                shutil.rmtree(local_path)
            else:
                os.remove(local_path)
        if not os.path.exists(local_path):
            if verbose:
                print(f"Copy from {src} to {local_path}")
            _hdfs_get(src, local_path)
            if os.path.isdir(local_path):
                with open(os.path.join(local_path, _TREE_RECORD), "w") as record:
                    record.write("\n".join(sorted(_tree(local_path))))
    return local_path


def copy_to_shm(src: str) -> str:
    """A copy of ``src`` (file or folder) under ``/dev/shm/verl-cache/<md5(abs src)>/``, made unless a
    complete one is there, so that loading the same model many times reads memory."""
    src = os.path.abspath(os.path.normpath(src))
    dest = os.path.join(_SHM_ROOT, md5_encode(src), os.path.basename(src))
    if not _same_copy(src, dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest)
    return dest


def copy_to_local(src: str, cache_dir: str | None = None, filelock: str = ".file.lock", verbose: bool = False,
                  always_recopy: bool = False, use_shm: bool = False) -> str:
    """A local path holding ``src``: a local path is returned as it is; an ``hdfs://`` path is copied (with
    the ``hdfs`` command) to ``<cache_dir or the temp folder>/<md5(src)>/<base name>`` once, later calls
    reusing the copy while it is complete (``always_recopy`` copies again). With ``use_shm`` the result is
    copied once more to ``/dev/shm`` (:func:`copy_to_shm`). ``filelock`` is accepted for compatibility:
    the lock is named after the path, as the original names it.
    """
    local_path = _copy_from_hdfs(src, cache_dir, verbose, always_recopy) if is_non_local(src) else src
    return copy_to_shm(local_path) if use_shm else local_path
