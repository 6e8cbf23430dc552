"""The oldest transformers this package runs on, checked when :mod:`verl.models` is first imported.

Before transformers 5, several things the model code relies on are missing or mean something else: the
mixture-of-experts families keep their experts in a ``ModuleList`` (the native engine and the expert
sharding read 3-D ``gate_up_proj`` / ``down_proj`` weights); some families pick their attention from a fixed
table, so the packed-sequence attention registered through ``AttentionInterface`` is never found; RoPE
scaling lives under ``rope_scaling`` rather than ``rope_parameters``, so a length-dependent scaling the native
engine must refuse is not seen; ``generate`` rejects the tokenizer's ``token_type_ids``; Gemma 3's decoding
differs from the native engine's. Each showed up as a failing test (or wrong tokens) under 4.57, none with a
message naming the cause. :data:`MIN_TRANSFORMERS` is the oldest release the test suite was run on (on a CPU,
all of it but the tests that build Qwen2-VL's image processor, which that release builds with torchvision);
``pyproject.toml`` declares the same floor (a test compares them).
"""

from __future__ import annotations

import importlib.metadata
import re

__all__ = ["MIN_TRANSFORMERS", "require_transformers"]

MIN_TRANSFORMERS = "5.17"


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: ``'5.17.0.dev0'`` -> ``(5, 17, 0)``."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def require_transformers(installed: str | None = None) -> None:
    """Raise ImportError naming the installed and the needed version when transformers is older than
    :data:`MIN_TRANSFORMERS`. ``installed`` defaults to the distribution's metadata (transformers itself is not
    imported here); nothing is checked when transformers is not installed: its first import says so."""
    if installed is None:
        try:
            installed = importlib.metadata.version("transformers")
        except importlib.metadata.PackageNotFoundError:
            return
    floor = _release(MIN_TRANSFORMERS)
    have = _release(installed)
    if have[:len(floor)] + (0,) * (len(floor) - len(have)) < floor:
        raise ImportError(
            f"transformers {installed} is installed; verl needs transformers>={MIN_TRANSFORMERS} (older releases "
            "store mixture-of-experts weights, attention implementations and RoPE scaling differently, and runs "
            f"would fail or generate wrong tokens). Upgrade it: pip install -U 'transformers>={MIN_TRANSFORMERS}'")
