"""Utilities; the names the original exports here are imported on first use, so ``import verl.utils`` stays
cheap: ``from verl.utils import hf_tokenizer, hf_processor, omega_conf_to_dataclass``."""

from verl.utils.lazy import lazy_exports

_EXPORTS = {"hf_tokenizer": "verl.utils.tokenizer", "hf_processor": "verl.utils.tokenizer",
            "omega_conf_to_dataclass": "verl.utils.config"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
