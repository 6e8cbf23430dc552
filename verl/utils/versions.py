"""The oldest transformers this package runs on, checked when :mod:`verl.models` is first imported (this module
imports nothing of verl's, so the check itself loads under any transformers).

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
import importlib.util
import re

__all__ = ["MIN_TRANSFORMERS", "installed_transformers", "require_transformers"]

MIN_TRANSFORMERS = "5.17"


def installed_transformers() -> str | None:
    """The version of the transformers package an import would load, None when there is none. Read from that
    package's ``__init__.py`` (``__version__ = "..."``) without importing it: a copy put on ``PYTHONPATH``
    without its ``.dist-info`` would otherwise be judged by another installation's metadata. The metadata is
    the fallback for a package whose source does not say."""
    spec = importlib.util.find_spec("transformers")
    if spec is None:
        return None
    if spec.origin and spec.origin.endswith(".py"):
        try:
            with open(spec.origin, encoding="utf-8") as f:
                match = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", f.read(), re.M)
            if match:
                return match.group(1)
        except OSError:
            pass
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_transformers(installed: str | None = None) -> None:
    """Raise ImportError naming the installed and the needed version when transformers is older than
    :data:`MIN_TRANSFORMERS`, compared as pip does (PEP 440: ``5.17.0rc1`` is older than ``5.17``).
    ``installed`` defaults to :func:`installed_transformers`; nothing is checked when transformers is not
    installed (its first import says so) or its version cannot be parsed."""
    installed = installed_transformers() if installed is None else installed
    if installed is None:
        return
    from packaging.version import InvalidVersion, Version  # transformers depends on it: present from here on

    try:
        too_old = Version(installed) < Version(MIN_TRANSFORMERS)
    except InvalidVersion:
        return
    if too_old:
        raise ImportError(
            f"transformers {installed} is installed; verl needs transformers>={MIN_TRANSFORMERS} (older releases "
            "store mixture-of-experts weights, attention implementations and RoPE scaling differently, and runs "
            f"would fail or generate wrong tokens). Upgrade it: pip install -U 'transformers>={MIN_TRANSFORMERS}'")
