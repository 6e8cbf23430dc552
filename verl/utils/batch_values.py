"""Per-sample values as a DataProto carries them: deep equality, a short type description, and a tensor without
the parts of a larger storage it views (for pickling)."""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["compact_tensor", "type_summary", "values_equal"]


def compact_tensor(value):
    """``value`` without the parts of a larger storage it views (pickling a view ships the whole storage)."""
    if not isinstance(value, torch.Tensor):
        return value.clone()  # a nested TensorDict
    owns = value.untyped_storage().nbytes() == value.numel() * value.element_size() and value.is_contiguous()
    return value if owns else value.clone(memory_format=torch.contiguous_format)


def values_equal(a, b) -> bool:
    """Deep equality (DataProto's union and concat checks): numpy arrays and tensors by value, NaN equal to NaN."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        return a.shape == b.shape and all(values_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    result = a == b
    return bool(result) if not isinstance(result, (np.ndarray, torch.Tensor)) else bool(np.all(result))


def type_summary(value) -> str:
    """A short nested type description (:meth:`verl.protocol.DataProto.get_data_info`)."""
    if isinstance(value, list):
        return f"list[{'|'.join(sorted({type_summary(v) for v in value[:3]})) or '...'}]"
    if isinstance(value, tuple):
        return f"tuple({', '.join(type_summary(v) for v in value)})"
    if isinstance(value, dict):
        if not value:
            return "dict"
        key, item = next(iter(value.items()))
        return f"dict[{type_summary(key)}: {type_summary(item)}]"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape} ({value.dtype})"
    return type(value).__name__
