"""Loading a Hugging Face tokenizer or multimodal processor as the original's ``hf_tokenizer`` /
``hf_processor`` do (``from verl.utils import hf_tokenizer, hf_processor``)."""

from __future__ import annotations

import warnings

__all__ = ["hf_processor", "hf_tokenizer", "set_pad_token_id"]


def set_pad_token_id(tokenizer) -> None:
    """Use the end-of-sequence token for padding when the tokenizer has no pad token (with a warning)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = tokenizer.eos_token_id
        warnings.warn(f"tokenizer.pad_token_id is None. Now set to {tokenizer.eos_token_id}", stacklevel=2)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(f"tokenizer.pad_token is None. Now set to {tokenizer.eos_token}", stacklevel=2)


def hf_tokenizer(name_or_path, correct_pad_token: bool = True, correct_gemma2: bool = True, **kwargs):
    """``AutoTokenizer.from_pretrained(name_or_path, **kwargs)``, with the pad token set to the end-of-sequence
    token when missing (``correct_pad_token``), and for ``gemma-2-2b-it`` the end of sequence set to
    ``<end_of_turn>`` (id 107) rather than the ambiguous default (``correct_gemma2``)."""
    from transformers import AutoTokenizer

    if correct_gemma2 and isinstance(name_or_path, str) and "gemma-2-2b-it" in name_or_path:
        warnings.warn("Found gemma-2-2b-it tokenizer. Set eos_token and eos_token_id to <end_of_turn> and 107.",
                      stacklevel=2)
        kwargs["eos_token"] = "<end_of_turn>"
        kwargs["eos_token_id"] = 107
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def hf_processor(name_or_path, **kwargs):
    """The multimodal processor saved with a model (``AutoProcessor``), with the model's config as its
    ``config`` attribute; None for a text-only model (whose ``AutoProcessor`` is just its tokenizer) and,
    with a warning, when none can be loaded."""
    from transformers import AutoConfig, AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except Exception as e:  # noqa: BLE001 - a model without processor files is the common, text-only case
        warnings.warn(f"Failed to create processor from {name_or_path}: {e}. This may affect multimodal processing",
                      stacklevel=2)
        return None
    if "Processor" not in type(processor).__name__:
        return None
    processor.config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    return processor
