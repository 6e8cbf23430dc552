"""Layer 3: loading Hugging Face models and computing log-probs/entropy without full fp32 logits."""

from verl.utils.versions import require_transformers

require_transformers()  # before any model code runs: an older transformers fails in ways that do not say why

from verl.models.loader import load_causal_lm, load_hf_config, load_tokenizer, load_value_model, resolve_dtype
from verl.models.logprob import (
    forward_logprobs,
    forward_logprobs_and_routing,
    forward_values,
    logprobs_and_entropy_from_hidden,
)

__all__ = ["forward_logprobs", "forward_logprobs_and_routing", "forward_values", "load_causal_lm", "load_hf_config",
           "load_tokenizer", "load_value_model", "logprobs_and_entropy_from_hidden", "resolve_dtype"]
