"""DataProto: the batch that flows between the driver and the workers.

A ``DataProto`` holds three things that always travel together:

- ``batch``: named tensors that share their first dimension (the batch dimension);
- ``non_tensor_batch``: named numpy arrays (usually ``dtype=object``) of the same length, for
  strings, dicts and other per-sample Python values (``data_source``, ``reward_model``, ``uid``);
- ``meta_info``: a plain dict for values that describe the whole batch (temperature, metrics).

Every operation keeps the rows of all three aligned. Operations that change the number of rows
(``chunk``, ``split``, ``repeat``, ``select_idxs``...) act on ``batch`` and ``non_tensor_batch``
together and copy ``meta_info``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from verl.utils.fs import atomic_torch_save

__all__ = ["DataProto", "DataProtoItem", "pad_dataproto_to_divisor", "unpad_dataproto"]


def _as_object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (lists and dicts stay whole, never broadcast to 2-D)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _merge_metrics(parts: list[dict]) -> dict[str, list]:
    """Merge per-worker metric dicts into one dict of lists (a list value is extended)."""
    merged: dict[str, list] = {}
    for metrics in parts:
        for key, value in metrics.items():
            bucket = merged.setdefault(key, [])
            bucket.extend(value if isinstance(value, list) else [value])
    return merged


def _owns_storage(t: torch.Tensor) -> bool:
    return t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.is_contiguous()


@dataclass
class DataProtoItem:
    """One row of a DataProto: tensors without the batch dim, plain values, shared meta_info."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.batch = dict(self.batch or {})
        self.non_tensor_batch = dict(self.non_tensor_batch or {})
        self.meta_info = dict(self.meta_info or {})
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, tensors: dict | None = None, non_tensors: dict | None = None, meta_info=None):
        """Build from a dict of tensors and a dict of per-sample values (lists or arrays)."""
        non_tensors = {
            k: v if isinstance(v, np.ndarray) else _as_object_array(list(v))
            for k, v in (non_tensors or {}).items()
        }
        return cls(batch=dict(tensors or {}), non_tensor_batch=non_tensors, meta_info=meta_info or {})

    @classmethod
    def from_single_dict(cls, data: dict, meta_info: dict | None = None):
        """Build from one dict, sorting tensors into ``batch`` and everything else into
        ``non_tensor_batch`` (the output of the dataset's ``collate_fn``)."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        others = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, others, meta_info)

    def check_consistency(self) -> None:
        """Raise if tensors and non-tensor columns do not all share the batch dimension."""
        sizes: dict[str, int] = {}
        for key, value in self.batch.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"DataProto.batch['{key}'] is a {type(value).__name__}; batch holds "
                                "tensors only -- put per-sample Python values in non_tensor_batch")
            if value.dim() == 0:
                raise ValueError(f"DataProto.batch['{key}'] is a scalar tensor; tensors need a batch "
                                 "dimension -- put batch-wide values in meta_info")
            sizes[f"batch['{key}']"] = value.shape[0]
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise TypeError(f"DataProto.non_tensor_batch['{key}'] is a {type(value).__name__}; "
                                "it must be a numpy array (use DataProto.from_dict to convert lists)")
            if value.ndim == 0:
                raise ValueError(f"DataProto.non_tensor_batch['{key}'] is a 0-d array; it needs one "
                                 "entry per sample")
            sizes[f"non_tensor_batch['{key}']"] = value.shape[0]
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{k}={v}" for k, v in sizes.items())
            raise ValueError(f"DataProto columns disagree on the batch size: {listing}")

    # ------------------------------------------------------------------ basic access
    def __len__(self) -> int:
        for value in self.batch.values():
            return value.shape[0]
        for value in self.non_tensor_batch.values():
            return value.shape[0]
        return 0

    def __getitem__(self, item):
        if isinstance(item, (int, np.integer)):
            n = len(self)
            if not -n <= item < n:
                raise IndexError(f"DataProto index {item} out of range for batch size {n}")
            return DataProtoItem(
                batch={k: v[item] for k, v in self.batch.items()},
                non_tensor_batch={k: v[item] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        return self.select_idxs(item)

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}"
                            for k, v in self.batch.items())
        others = ", ".join(self.non_tensor_batch)
        return (f"DataProto(len={len(self)}, batch={{{tensors}}}, non_tensor_batch=[{others}], "
                f"meta_info={sorted(self.meta_info)})")

    def _missing(self, where: str, keys: Iterable[str], present: dict) -> None:
        missing = [k for k in keys if k not in present]
        if missing:
            raise KeyError(f"DataProto.{where} has no key(s) {missing}; available: {sorted(present)}")

    def _with_rows(self, take) -> "DataProto":
        """A new DataProto whose tensors and arrays are ``take(column)``; meta_info is copied."""
        return DataProto(
            batch={k: take(v) for k, v in self.batch.items()},
            non_tensor_batch={k: take(v) for k, v in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    # ------------------------------------------------------------------ column operations
    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None,
               deepcopy: bool = False) -> "DataProto":
        """Keep only the named columns (``None`` keeps all of that part)."""
        for where, keys, present in (("batch", batch_keys, self.batch),
                                     ("non_tensor_batch", non_tensor_batch_keys, self.non_tensor_batch),
                                     ("meta_info", meta_info_keys, self.meta_info)):
            if keys is not None:
                self._missing(where, keys, present)
        batch = self.batch if batch_keys is None else {k: self.batch[k] for k in batch_keys}
        non_tensor = (self.non_tensor_batch if non_tensor_batch_keys is None
                      else {k: self.non_tensor_batch[k] for k in non_tensor_batch_keys})
        meta = self.meta_info if meta_info_keys is None else {k: self.meta_info[k] for k in meta_info_keys}
        out = DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
        return copy.deepcopy(out) if deepcopy else out

    def pop(self, batch_keys=(), non_tensor_batch_keys=(), meta_info_keys=()) -> "DataProto":
        """Remove the named columns from this DataProto and return them as a new one."""
        self._missing("batch", batch_keys, self.batch)
        self._missing("non_tensor_batch", non_tensor_batch_keys, self.non_tensor_batch)
        self._missing("meta_info", meta_info_keys, self.meta_info)
        return DataProto(
            batch={k: self.batch.pop(k) for k in batch_keys},
            non_tensor_batch={k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys},
            meta_info={k: self.meta_info.pop(k) for k in meta_info_keys},
        )

    def rename(self, old_keys, new_keys) -> "DataProto":
        """Rename tensor columns in place (a str or a list of str on each side)."""
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename needs as many new keys as old keys, got {old_keys} -> {new_keys}")
        self._missing("batch", old_keys, self.batch)
        clash = [k for k in new_keys if k in self.batch and k not in old_keys]
        if clash:
            raise KeyError(f"rename would overwrite existing batch key(s) {clash}")
        tensors = [self.batch.pop(k) for k in old_keys]
        self.batch.update(zip(new_keys, tensors))
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Merge ``other``'s columns into this one in place. Keys present in both must hold equal
        values; anything else is a conflict and raises."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"cannot union DataProtos of batch sizes {len(self)} and {len(other)}")
        for key, value in other.batch.items():
            mine = self.batch.get(key)
            if mine is not None and (mine.shape != value.shape or not torch.equal(mine, value)):
                raise ValueError(f"union conflict: batch['{key}'] differs between the two DataProtos")
            self.batch[key] = value
        for key, value in other.non_tensor_batch.items():
            mine = self.non_tensor_batch.get(key)
            if mine is not None and (mine.shape != value.shape
                                     or not all(_same(a, b) for a, b in zip(mine, value))):
                raise ValueError(f"union conflict: non_tensor_batch['{key}'] differs between the two "
                                 "DataProtos")
            self.non_tensor_batch[key] = value
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _same(self.meta_info[key], value):
                raise ValueError(f"union conflict: meta_info['{key}'] is {self.meta_info[key]!r} here "
                                 f"and {value!r} in the other DataProto")
            self.meta_info[key] = value
        self.check_consistency()
        return self

    # ------------------------------------------------------------------ row operations
    def slice(self, start=None, end=None, step=None) -> "DataProto":
        s = slice(start, end, step)
        return self._with_rows(lambda v: v[s])

    def select_idxs(self, idxs) -> "DataProto":
        """Rows by integer indices or by a boolean mask (list, numpy array or tensor)."""
        idx = np.asarray(idxs.cpu() if isinstance(idxs, torch.Tensor) else idxs)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise ValueError(f"boolean mask of shape {idx.shape} does not match batch size {len(self)}")
            idx = np.nonzero(idx)[0]
        idx = idx.astype(np.int64).reshape(-1)
        t_idx = torch.from_numpy(idx)
        return self._with_rows(lambda v: v[t_idx.to(v.device)] if isinstance(v, torch.Tensor) else v[idx])

    def reorder(self, indices) -> "DataProto":
        """Permute the rows in place: row i becomes old row ``indices[i]``."""
        reordered = self.select_idxs(indices)
        if len(reordered) != len(self):
            raise ValueError(f"reorder needs {len(self)} indices, got {len(reordered)}")
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: ``aabb`` when interleaved, ``abab`` otherwise."""
        def rep(v):
            if isinstance(v, torch.Tensor):
                if interleave:
                    return v.repeat_interleave(repeat_times, dim=0)
                return v.repeat(repeat_times, *([1] * (v.dim() - 1)))
            return np.repeat(v, repeat_times, axis=0) if interleave else np.concatenate([v] * repeat_times)
        return self._with_rows(rep)

    def chunk(self, chunks: int) -> list["DataProto"]:
        """Split into ``chunks`` equal parts. Use :func:`pad_dataproto_to_divisor` first when the
        batch size is not a multiple of ``chunks`` (and :func:`unpad_dataproto` after)."""
        n = len(self)
        if chunks <= 0 or n % chunks:
            raise ValueError(f"cannot chunk a batch of {n} into {chunks} equal parts; pad it with "
                             f"pad_dataproto_to_divisor(data, {chunks}) first")
        return self.split(n // chunks)

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list["DataProto"]) -> "DataProto":
        """Stack parts row-wise. ``meta_info`` comes from the first part, except
        ``meta_info["metrics"]``, which is merged from all parts into a dict of lists."""
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        first = data[0]
        for i, part in enumerate(data[1:], start=1):
            if set(part.batch) != set(first.batch) or set(part.non_tensor_batch) != set(first.non_tensor_batch):
                raise KeyError(f"DataProto.concat: part {i} has columns "
                               f"{sorted(part.batch) + sorted(part.non_tensor_batch)} but part 0 has "
                               f"{sorted(first.batch) + sorted(first.non_tensor_batch)}")
        meta = dict(first.meta_info)
        metric_parts = [p.meta_info["metrics"] for p in data if "metrics" in p.meta_info]
        if metric_parts:
            meta["metrics"] = _merge_metrics(metric_parts)
        return DataProto(
            batch={k: torch.cat([p.batch[k] for p in data]) for k in first.batch},
            non_tensor_batch={k: np.concatenate([p.non_tensor_batch[k] for p in data])
                              for k in first.non_tensor_batch},
            meta_info=meta,
        )

    def make_iterator(self, mini_batch_size: int, epochs: int = 1, shuffle: bool = False,
                      seed: int | None = None) -> Iterator["DataProto"]:
        """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` passes. With ``shuffle``,
        each epoch uses a fresh permutation drawn from a generator seeded with ``seed``, so the
        order is reproducible."""
        n = len(self)
        if mini_batch_size <= 0 or n % mini_batch_size:
            raise ValueError(f"batch size {n} is not a multiple of mini_batch_size={mini_batch_size}")
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
            for start in range(0, n, mini_batch_size):
                yield self.select_idxs(order[start:start + mini_batch_size])

    # ------------------------------------------------------------------ devices and transfer
    def to(self, device) -> "DataProto":
        self.batch = {k: v.to(device) for k, v in self.batch.items()}
        return self

    def __getstate__(self):
        # Pickling a view would ship its whole parent storage (a chunk of a big batch would carry
        # the full batch), so compact views before they leave the process.
        batch = {k: v if _owns_storage(v) else v.contiguous().clone() for k, v in self.batch.items()}
        return {"batch": batch, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state):
        self.batch = state["batch"]
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, path: str) -> None:
        """Write to ``path`` atomically (a temporary file in the same folder, then rename), so a
        crash never leaves a half-written file under the final name."""
        atomic_torch_save(self.__getstate__(), path)

    @classmethod
    def load_from_disk(cls, path: str) -> "DataProto":
        """Load a file written by :meth:`save_to_disk` (it may hold pickled Python objects: only
        load files you trust)."""
        state = torch.load(path, weights_only=False)
        return cls(**state)


def _same(a, b) -> bool:
    """Equality for union checks that also works for numpy arrays and tensors."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        return a.shape == b.shape and all(_same(x, y) for x, y in zip(a.ravel(), b.ravel()))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    result = a == b
    return bool(result) if not isinstance(result, (np.ndarray, torch.Tensor)) else bool(np.all(result))


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append rows (taken from the start, cycling) until the length divides ``size_divisor``.
    Returns the padded DataProto and the number of rows added."""
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be positive, got {size_divisor}")
    n = len(data)
    pad = (-n) % size_divisor
    if pad == 0:
        return data, 0
    if n == 0:
        raise ValueError("cannot pad an empty DataProto")
    extra = data.select_idxs(np.arange(pad) % n)
    return DataProto.concat([data, extra]), pad


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the ``pad_size`` rows that :func:`pad_dataproto_to_divisor` appended."""
    return data.slice(0, len(data) - pad_size) if pad_size else data
