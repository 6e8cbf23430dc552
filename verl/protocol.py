"""DataProto: the batch that flows between the driver and the workers.

A ``DataProto`` holds three things that always travel together:

- ``batch``: a ``tensordict.TensorDict`` of named tensors that share their first dimension
  (``batch_size=[rows]``), or ``None`` when there are no tensor columns -- as in the original verl.
  A dict of tensors given as ``batch`` is turned into a TensorDict;
- ``non_tensor_batch``: named numpy arrays (usually ``dtype=object``) of the same length, for
  strings, dicts and other per-sample Python values (``data_source``, ``reward_model``, ``uid``);
- ``meta_info``: a plain dict for values that describe the whole batch (temperature, metrics).

Every operation keeps the rows of all three aligned. Operations that change the number of rows
(``chunk``, ``split``, ``repeat``, ``select_idxs``...) act on ``batch`` and ``non_tensor_batch``
together and give each result its own (shallow) copy of ``meta_info``.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch

from verl.utils.batch_values import compact_tensor, type_summary, values_equal
from verl.utils.fs import atomic_torch_save
from verl.utils.model import compute_position_id_with_mask

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["DataProto", "DataProtoItem", "DataProtoConfig", "DataProtoError", "DataProtoValueError",
           "DataProtoKeyError", "DataProtoTypeError", "left_padded", "object_array", "pad_dataproto_to_divisor",
           "unpad_dataproto"]


# ---------------------------------------------------------------------------------------------- errors
class DataProtoError(AssertionError):
    """Raised where the original verl asserts: ``except AssertionError`` still catches it, and each
    subclass is also the built-in error this project raises for the same mistake."""


class DataProtoValueError(DataProtoError, ValueError):
    pass


class DataProtoTypeError(DataProtoError, TypeError):
    pass


class DataProtoKeyError(DataProtoError, KeyError):
    def __str__(self) -> str:  # KeyError would print the message as a quoted repr
        return str(self.args[0]) if self.args else ""


# ---------------------------------------------------------------------------------------------- config
class DataProtoConfig:
    """``DataProtoConfig.auto_padding = True`` (or ``VERL_AUTO_PADDING=1``) lets :meth:`DataProto.chunk` split a
    batch into unequal parts; ``meta_info[DataProtoConfig.auto_padding_key] = True`` (what
    ``from_dict(..., auto_padding=True)`` sets) does the same for one DataProto."""

    auto_padding = False
    auto_padding_key = "_verl_auto_padding"


# ---------------------------------------------------------------------------------------------- helpers
def _tensordict(tensors: dict, rows: int, device=None):
    # tensordict takes ~1.5 s to import (it loads torch._dynamo), so only processes that build a batch pay it.
    from tensordict import TensorDict

    return TensorDict(tensors, batch_size=[rows], device=device)


def _is_tensordict(value) -> bool:
    module = sys.modules.get("tensordict")  # no TensorDict can exist before tensordict is imported
    return module is not None and isinstance(value, module.TensorDictBase)


def _keys(batch) -> list[str]:
    return [] if batch is None else list(batch.keys())


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (lists and dicts stay whole, never broadcast to 2-D)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _tensordict_from(tensors: dict, rows: int | None = None, device=None):
    """A TensorDict of ``tensors`` with ``batch_size=[rows]`` (their common first dimension); None when empty
    and ``rows`` is not given."""
    sizes = {}
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor) and not _is_tensordict(value):
            raise DataProtoTypeError(f"DataProto.batch['{key}'] is a {type(value).__name__}; batch holds tensors "
                                     "only -- put per-sample Python values in non_tensor_batch")
        if value.dim() == 0:
            raise DataProtoValueError(f"DataProto.batch['{key}'] is a scalar tensor; tensors need a batch "
                                      "dimension -- put batch-wide values in meta_info")
        sizes[key] = value.shape[0]
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"batch['{k}']={v}" for k, v in sizes.items())
        raise DataProtoValueError(f"DataProto columns disagree on the batch size: {listing}")
    if rows is None:
        if not sizes:
            return None
        rows = next(iter(sizes.values()))
    return _tensordict(dict(tensors), rows, device)


# ---------------------------------------------------------------------------------------------- DataProto
@dataclass
class DataProtoItem:
    """One row of a DataProto: ``batch`` is a TensorDict row (``batch_size=[]``) or None, ``non_tensor_batch``
    the row's plain values, ``meta_info`` the DataProto's own dict."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.batch, dict):
            self.batch = _tensordict_from(self.batch)
        self.non_tensor_batch = dict(self.non_tensor_batch or {})
        self.meta_info = dict(self.meta_info or {})
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, tensors: dict | None = None, non_tensors: dict | None = None, meta_info: dict | None = None,
                  num_batch_dims: int = 1, auto_padding: bool = False) -> "DataProto":
        """Build from a dict of tensors (their first dimension is the batch) and a dict of per-sample
        values (lists or arrays; lists become 1-D object arrays)."""
        if num_batch_dims != 1:
            raise DataProtoValueError(f"DataProto supports one batch dimension, got num_batch_dims={num_batch_dims}")
        non_tensors = {k: v if isinstance(v, np.ndarray) else object_array(list(v))
                       for k, v in (non_tensors or {}).items()}
        meta_info = dict(meta_info or {})
        if auto_padding:
            meta_info[DataProtoConfig.auto_padding_key] = True
        return cls(batch=_tensordict_from(dict(tensors or {})), non_tensor_batch=non_tensors, meta_info=meta_info)

    @classmethod
    def from_single_dict(cls, data: dict, meta_info: dict | None = None, auto_padding: bool = False) -> "DataProto":
        """Build from one dict, sorting tensors into ``batch`` and everything else into
        ``non_tensor_batch`` (the output of the dataset's ``collate_fn``)."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        others = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, others, meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(cls, tensor_dict: TensorDict, meta_info: dict | None = None,
                        num_batch_dims: int = 1) -> "DataProto":
        """Build from a TensorDict: tensors go to ``batch``, stacks of non-tensor values (``NonTensorStack``)
        to ``non_tensor_batch``, single non-tensor values (``NonTensorData``) to ``meta_info``."""
        from tensordict import NonTensorData, NonTensorStack

        if num_batch_dims != 1:
            raise DataProtoValueError(f"DataProto supports one batch dimension, got num_batch_dims={num_batch_dims}")
        meta_info = dict(meta_info or {})
        tensors, non_tensors = {}, {}
        for key, value in tensor_dict.items():
            if isinstance(value, NonTensorStack):
                non_tensors[key] = object_array([item.data for item in value])
            elif isinstance(value, NonTensorData):
                meta_info[key] = value.data
            else:
                tensors[key] = value
        rows = tensor_dict.batch_size[0] if tensors and tensor_dict.batch_dims else None
        return cls(batch=_tensordict_from(tensors, rows, tensor_dict.device), non_tensor_batch=non_tensors,
                   meta_info=meta_info)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding everything: the tensors, each non-tensor column as a ``NonTensorStack``,
        each ``meta_info`` entry as ``NonTensorData`` (:meth:`from_tensordict` reverses it)."""
        from tensordict import NonTensorData, NonTensorStack

        names = [*_keys(self.batch), *self.non_tensor_batch, *self.meta_info]
        clash = {name for name in names if names.count(name) > 1}
        if clash:
            raise DataProtoValueError(f"to_tensordict: key(s) {sorted(clash)} appear in more than one of batch, "
                                      "non_tensor_batch and meta_info; rename them first")
        out = _tensordict(dict(self.batch.items()) if self.batch is not None else {}, len(self),
                          None if self.batch is None else self.batch.device)
        for key, values in self.non_tensor_batch.items():
            out[key] = NonTensorStack.from_list([NonTensorData(v) for v in values])
        for key, value in self.meta_info.items():
            out[key] = NonTensorData(value)
        return out

    def check_consistency(self) -> None:
        """Raise if ``batch`` is not a one-dimensional TensorDict or the columns disagree on the batch size."""
        sizes: dict[str, int] = {}
        if self.batch is not None:
            if not _is_tensordict(self.batch):
                raise DataProtoTypeError(f"DataProto.batch is a {type(self.batch).__name__}; it must be a "
                                         "tensordict.TensorDict, a dict of tensors or None")
            if self.batch.batch_dims != 1:
                raise DataProtoValueError(f"DataProto.batch has batch_size {list(self.batch.batch_size)}; DataProto "
                                          "needs exactly one batch dimension: build the TensorDict with "
                                          "batch_size=[rows]")
            rows = self.batch.batch_size[0]
            sizes.update({f"batch['{k}']": rows for k in self.batch.keys()} or {"batch": rows})
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise DataProtoTypeError(f"DataProto.non_tensor_batch['{key}'] is a {type(value).__name__}; it must "
                                         "be a numpy array (use DataProto.from_dict to convert lists)")
            if value.ndim == 0:
                raise DataProtoValueError(f"DataProto.non_tensor_batch['{key}'] is a 0-d array; it needs one "
                                          "entry per sample")
            sizes[f"non_tensor_batch['{key}']"] = value.shape[0]
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{k}={v}" for k, v in sizes.items())
            raise DataProtoValueError(f"DataProto columns disagree on the batch size: {listing}")

    # ------------------------------------------------------------------ basic access
    def __len__(self) -> int:
        if self.batch is not None:
            return self.batch.batch_size[0]
        for value in self.non_tensor_batch.values():
            return value.shape[0]
        return 0

    def __getitem__(self, item):
        """An int gives a :class:`DataProtoItem`; a slice, a list, a numpy array or a tensor of indices
        (or a boolean mask) gives a DataProto."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        if isinstance(item, (int, np.integer)):
            n = len(self)
            if not -n <= item < n:
                raise IndexError(f"DataProto index {item} out of range for batch size {n}")
            return DataProtoItem(batch=self.batch[item] if self.batch is not None else None,
                                 non_tensor_batch={k: v[item] for k, v in self.non_tensor_batch.items()},
                                 meta_info=self.meta_info)
        raise TypeError(f"DataProto indices are an int, a slice, a list, a numpy array or a tensor; "
                        f"got a {type(item).__name__}")

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        tensors = "None" if self.batch is None else "{" + ", ".join(
            f"{k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}" for k, v in self.batch.items()) + "}"
        return (f"DataProto(len={len(self)}, batch={tensors}, non_tensor_batch=[{', '.join(self.non_tensor_batch)}], "
                f"meta_info={sorted(self.meta_info)})")

    def get_data_info(self) -> str:
        """Shapes, dtypes and devices of the tensors, shapes of the arrays, types of the meta_info values."""
        tensors = self.batch.items() if self.batch is not None else ()
        return "\n".join([
            "batch", *(f"  {key}: {tuple(t.shape)} ({t.dtype}) {t.device}" for key, t in tensors),
            "non_tensor_batch", *(f"  {key}: ndarray{a.shape} ({a.dtype})" for key, a in self.non_tensor_batch.items()),
            "meta_info", *(f"  {key}: {type_summary(v)}" for key, v in self.meta_info.items())])

    def _check_keys(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> None:
        """Raise naming the keys (of each part given, not None) that this DataProto lacks."""
        for where, keys, present in (("batch", batch_keys, _keys(self.batch)),
                                     ("non_tensor_batch", non_tensor_batch_keys, list(self.non_tensor_batch)),
                                     ("meta_info", meta_info_keys, list(self.meta_info))):
            missing = [k for k in keys if k not in present] if keys is not None else []
            if missing:
                raise DataProtoKeyError(f"DataProto.{where} has no key(s) {missing}; available: {sorted(present)}")

    def _with_rows(self, take, rows: int) -> "DataProto":
        """A new DataProto of ``rows`` rows whose tensors and arrays are ``take(column)``; meta_info is copied."""
        batch = (None if self.batch is None
                 else _tensordict({k: take(v) for k, v in self.batch.items()}, rows, self.batch.device))
        return type(self)(batch=batch, non_tensor_batch={k: take(v) for k, v in self.non_tensor_batch.items()},
                          meta_info=dict(self.meta_info))

    # ------------------------------------------------------------------ column operations
    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None,
               deepcopy: bool = False) -> "DataProto":
        """Keep only the named columns (``None`` keeps all of that part). The result shares the tensors
        unless ``deepcopy``."""
        self._check_keys(batch_keys, non_tensor_batch_keys, meta_info_keys)
        batch = self.batch
        if batch is not None:
            batch = batch.copy() if batch_keys is None else batch.select(*batch_keys)
        non_tensor = (self.non_tensor_batch if non_tensor_batch_keys is None
                      else {k: self.non_tensor_batch[k] for k in non_tensor_batch_keys})
        meta = self.meta_info if meta_info_keys is None else {k: self.meta_info[k] for k in meta_info_keys}
        out = type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
        return copy.deepcopy(out) if deepcopy else out

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> "DataProto":
        """Remove the named columns from this DataProto and return them as a new one."""
        batch_keys, non_tensor_batch_keys, meta_info_keys = (list(keys or ()) for keys in
                                                             (batch_keys, non_tensor_batch_keys, meta_info_keys))
        self._check_keys(batch_keys, non_tensor_batch_keys, meta_info_keys)
        return DataProto.from_dict(
            tensors={k: self.batch.pop(k) for k in batch_keys},
            non_tensors={k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys},
            meta_info={k: self.meta_info.pop(k) for k in meta_info_keys},
        )

    def rename(self, old_keys=None, new_keys=None) -> "DataProto":
        """Rename tensor columns in place (a str or a list of str on each side)."""
        old_keys, new_keys = ([keys] if isinstance(keys, str) else list(keys or []) for keys in (old_keys, new_keys))
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename needs as many new keys as old keys, got {old_keys} -> {new_keys}")
        self._check_keys(batch_keys=old_keys)
        clash = [k for k in new_keys if k in _keys(self.batch) and k not in old_keys]
        if clash:
            raise DataProtoKeyError(f"rename would overwrite existing batch key(s) {clash}")
        for key, tensor in zip(new_keys, [self.batch.pop(k) for k in old_keys]):
            self.batch[key] = tensor
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Merge ``other``'s columns and meta_info into this one in place. Keys present in both must hold
        equal values (which then stay this one's); anything else is a conflict and raises."""
        has_columns = [p.batch is not None or bool(p.non_tensor_batch) for p in (self, other)]
        if all(has_columns) and len(self) != len(other):
            raise DataProtoValueError(f"cannot union DataProtos of batch sizes {len(self)} and {len(other)}")
        if other.batch is not None and self.batch is None:
            self.batch = other.batch.copy()
        elif other.batch is not None:
            for key, value in other.batch.items():
                mine = self.batch.get(key, None)
                if mine is None:
                    self.batch[key] = value
                elif not values_equal(mine, value):
                    raise DataProtoValueError(f"union conflict: batch['{key}'] differs between the two DataProtos")
        for key, value in other.non_tensor_batch.items():
            mine = self.non_tensor_batch.get(key)
            if mine is not None and not values_equal(mine, value):
                raise DataProtoValueError(f"union conflict: non_tensor_batch['{key}'] differs between the two "
                                          "DataProtos")
            self.non_tensor_batch[key] = value
        for key, value in other.meta_info.items():
            if key in self.meta_info and not values_equal(self.meta_info[key], value):
                raise DataProtoValueError(f"union conflict: meta_info['{key}'] is {self.meta_info[key]!r} here "
                                          f"and {value!r} in the other DataProto")
            self.meta_info[key] = value
        self.check_consistency()
        return self

    # ------------------------------------------------------------------ row operations
    def slice(self, start=None, end=None, step=None) -> "DataProto":
        """Rows ``start:end:step`` (the tensors are views of these)."""
        s = slice(start, end, step)
        return self._with_rows(lambda v: v[s], len(range(*s.indices(len(self)))))

    def select_idxs(self, idxs) -> "DataProto":
        """Rows by integer indices or by a boolean mask (list, numpy array or tensor)."""
        idx = np.asarray(idxs.detach().cpu() if isinstance(idxs, torch.Tensor) else idxs)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise DataProtoValueError(f"boolean mask of shape {idx.shape} does not match batch size {len(self)}")
            idx = np.nonzero(idx)[0]
        idx = idx.astype(np.int64).reshape(-1)
        t_idx = torch.from_numpy(idx)
        return self._with_rows(lambda v: v[t_idx.to(v.device)] if not isinstance(v, np.ndarray) else v[idx], len(idx))

    def reorder(self, indices) -> "DataProto":
        """Permute the rows in place: row i becomes old row ``indices[i]``."""
        reordered = self.select_idxs(indices)
        if len(reordered) != len(self):
            raise DataProtoValueError(f"reorder needs {len(self)} indices, got {len(reordered)}")
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: ``aabb`` when interleaved, ``abab`` otherwise."""
        def rep(v):
            times = (repeat_times,) + (1,) * (v.ndim - 1)
            if isinstance(v, np.ndarray):
                return np.repeat(v, repeat_times, axis=0) if interleave else np.tile(v, times)
            return v.repeat_interleave(repeat_times, dim=0) if interleave else v.repeat(*times)
        return self._with_rows(rep, len(self) * repeat_times)

    def sample_level_repeat(self, repeat_times) -> "DataProto":
        """Row i ``repeat_times[i]`` times, in order (a list, tuple, numpy array or tensor of counts)."""
        if not isinstance(repeat_times, (list, tuple, np.ndarray, torch.Tensor)):
            raise DataProtoTypeError("sample_level_repeat takes a list, tuple, numpy array or tensor of counts, "
                                     f"got a {type(repeat_times).__name__}")
        counts = np.asarray(repeat_times.cpu() if isinstance(repeat_times, torch.Tensor) else repeat_times,
                            dtype=np.int64)
        if counts.shape != (len(self),) or (counts < 0).any():
            raise DataProtoValueError(f"sample_level_repeat needs one count >= 0 per row ({len(self)} rows), "
                                      f"got {counts.tolist()}")
        t_counts = torch.from_numpy(counts)

        def rep(v):
            if isinstance(v, np.ndarray):
                return np.repeat(v, counts, axis=0)
            return v.repeat_interleave(t_counts.to(v.device), dim=0)
        return self._with_rows(rep, int(counts.sum()))

    def is_padding_enabled(self) -> bool:
        """Whether :meth:`chunk` may split unevenly (see :class:`DataProtoConfig`)."""
        return (bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding
                or os.getenv("VERL_AUTO_PADDING", "").upper() in ("TRUE", "1"))

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first row (``padding_candidate="first"``) or of the last
        row (anything else), in place."""
        if padding_size == 0:
            return
        if not len(self):
            raise DataProtoValueError("cannot pad an empty DataProto: there is no row to copy")
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = DataProto.concat([self, self.select_idxs([row]).repeat(padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list["DataProto"]:
        """Split into ``chunks`` consecutive parts of equal size; a batch size that is not a multiple of ``chunks``
        raises :class:`DataProtoValueError`, an ``AssertionError`` as in the original. Use
        :func:`pad_dataproto_to_divisor` first (and :func:`unpad_dataproto` after). With padding
        enabled (:meth:`is_padding_enabled`) an uneven batch is split as ``torch.chunk`` splits it (parts of
        ceil(n / chunks) rows), and empty parts complete the list when that gives fewer than ``chunks``."""
        n = len(self)
        if not isinstance(chunks, (int, np.integer)) or chunks <= 0:
            raise DataProtoValueError(f"chunks must be a positive int, got {chunks!r}")
        if n % chunks and not self.is_padding_enabled():
            raise DataProtoValueError(f"cannot chunk a batch of {n} rows into {chunks} equal parts: pad it with "
                                      f"pad_dataproto_to_divisor(data, {chunks}) first (unpad_dataproto after), or "
                                      "allow unequal parts with DataProtoConfig.auto_padding = True")
        size = -(-n // chunks)
        parts = [self.slice(start, start + size) for start in range(0, n, size)] if n else []
        return parts + [self.slice(n, n) for _ in range(chunks - len(parts))]

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        if split_size <= 0:
            raise DataProtoValueError(f"split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list["DataProto"]) -> "DataProto":
        """Stack parts row-wise. ``meta_info`` keeps the keys of every part, each once: a key in several parts
        must hold equal values there (compared deeply, NaN equal to NaN), else :class:`DataProtoValueError` (an
        ``AssertionError``, as in the original) names the key. ``metrics`` is merged instead: each part's
        metrics (a dict, or a list of dicts; None adds nothing) become one dict of lists with every key of
        every part, list values flattened into it (per-rank dicts of lists give one list per key)."""
        data = list(data)
        if not data:
            raise DataProtoValueError("DataProto.concat needs at least one DataProto")
        first = data[0]
        columns = sorted(_keys(first.batch)) + sorted(first.non_tensor_batch)
        for i, part in enumerate(data[1:], start=1):
            part_columns = sorted(_keys(part.batch)) + sorted(part.non_tensor_batch)
            if part_columns != columns or (part.batch is None) != (first.batch is None):
                raise DataProtoKeyError(f"DataProto.concat: part {i} has columns {part_columns} but part 0 has "
                                        f"{columns}")
        meta: dict = {}
        metric_parts: list[dict] = []
        for i, part in enumerate(data):
            for key, value in part.meta_info.items():
                if key == "metrics":
                    if value is not None:
                        metric_parts.extend(value if isinstance(value, list) else [value])
                elif key not in meta:
                    meta[key] = value
                elif not values_equal(meta[key], value):
                    raise DataProtoValueError(f"DataProto.concat: meta_info['{key}'] is {meta[key]!r} in an earlier "
                                              f"part but {value!r} in part {i}; the parts must agree on meta_info "
                                              "(except 'metrics', which is merged)")
        if metric_parts:  # per-worker metric dicts as one dict of lists: every key kept, list values extended
            meta["metrics"] = {}
            for metrics in metric_parts:
                for key, value in metrics.items():
                    meta["metrics"].setdefault(key, []).extend(value if isinstance(value, list) else [value])
        batch = None if first.batch is None else _tensordict(
            {k: torch.cat([p.batch[k] for p in data]) for k in first.batch.keys()}, sum(len(p) for p in data),
            first.batch.device)
        return type(first)(batch=batch, non_tensor_batch={k: np.concatenate([p.non_tensor_batch[k] for p in data])
                                                          for k in first.non_tensor_batch}, meta_info=meta)

    def make_iterator(self, mini_batch_size: int, epochs: int = 1, seed: int | None = None,
                      dataloader_kwargs: dict | None = None, *, shuffle: bool | None = None) -> Iterator["DataProto"]:
        """Mini-batches of ``mini_batch_size`` rows for ``epochs`` passes. With ``shuffle=True`` (or, as the
        original takes it, ``dataloader_kwargs={"shuffle": True}``) each epoch is a fresh permutation drawn from
        a generator seeded with ``seed``, so the order is reproducible. Rows are gathered here, no DataLoader."""
        kwargs = dict(dataloader_kwargs or {})
        unsupported = sorted(set(kwargs) - {"shuffle", "drop_last"})
        if unsupported:
            raise TypeError(f"make_iterator gathers rows itself; of the DataLoader arguments it takes only "
                            f"'shuffle' and 'drop_last', got {unsupported}")
        shuffle = bool(kwargs.get("shuffle", False)) if shuffle is None else bool(shuffle)
        n = len(self)
        if mini_batch_size <= 0 or n % mini_batch_size:
            raise DataProtoValueError(f"batch size {n} is not a multiple of mini_batch_size={mini_batch_size}")
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)

        def mini_batches():
            for _ in range(epochs):
                order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
                for start in range(0, n, mini_batch_size):
                    yield self.select_idxs(order[start:start + mini_batch_size])
        return mini_batches()

    # ------------------------------------------------------------------ devices and transfer
    def to(self, device) -> "DataProto":
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def __getstate__(self):
        # The tensors travel as a plain dict (as cheap to pickle as before the TensorDict; the TensorDict is
        # rebuilt on arrival), and a view would ship its whole parent storage (a chunk of a big batch would
        # carry the full batch), so views are compacted before they leave the process.
        state = {"batch": None, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}
        if self.batch is not None:
            state["batch"] = {k: compact_tensor(v) for k, v in self.batch.items()}
            state["batch_size"] = len(self)
            state["batch_device"] = None if self.batch.device is None else str(self.batch.device)
        return state

    def __setstate__(self, state):
        # Files written before the batch was a TensorDict hold only batch / non_tensor_batch / meta_info.
        batch = state["batch"]
        self.batch = (None if batch is None
                      else _tensordict_from(batch, state.get("batch_size"), state.get("batch_device")))
        self.non_tensor_batch, self.meta_info = state["non_tensor_batch"], state["meta_info"]

    def save_to_disk(self, path: str) -> None:
        """Write to ``path`` atomically (a temporary file in the same folder, then rename), so a
        crash never leaves a half-written file under the final name."""
        atomic_torch_save(self.__getstate__(), path)

    @classmethod
    def load_from_disk(cls, path: str) -> "DataProto":
        """Load a file written by :meth:`save_to_disk` (it may hold pickled Python objects: only
        load files you trust)."""
        out = cls.__new__(cls)
        out.__setstate__(torch.load(path, weights_only=False))
        out.check_consistency()
        return out


def left_padded(sequences: list[list[int]], pad: int, meta_info: dict | None = None,
                width: int | None = None) -> DataProto:
    """Token id lists as a left-padded prompt batch (``input_ids``, ``attention_mask``, ``position_ids``)
    of ``width`` columns (default: the longest)."""
    width = max(map(len, sequences)) if width is None else width
    input_ids = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids in sequences], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in sequences], dtype=torch.long)
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask,
                                "position_ids": compute_position_id_with_mask(mask)}, meta_info=dict(meta_info or {}))


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append rows (taken from the start, cycling) until the length divides ``size_divisor``.
    Returns the padded DataProto and the number of rows added."""
    if size_divisor <= 0:
        raise DataProtoValueError(f"size_divisor must be positive, got {size_divisor}")
    n = len(data)
    pad = (-n) % size_divisor
    if pad == 0:
        return data, 0
    extra = data.select_idxs(np.arange(pad) % n)
    return DataProto.concat([data, extra]), pad


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the ``pad_size`` rows that :func:`pad_dataproto_to_divisor` appended."""
    return data.slice(0, len(data) - pad_size) if pad_size else data
