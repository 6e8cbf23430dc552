"""Tiny random mixture-of-experts models for the tests: Qwen3-MoE and Qwen2-MoE (shared expert with a sigmoid gate)."""

import torch

FAMILIES = ("qwen3_moe", "qwen2_moe")
# Other families whose routers the same code reads (softmax top-k, transformers' load-balancing loss).
OTHER_FAMILIES = ("mixtral", "olmoe")


def moe_config(family: str, vocab_size: int = 96, num_experts: int = 4, **overrides):
    """Two decoder layers of hidden 32 with ``num_experts`` experts of 16, top-2 routing."""
    from transformers import Qwen2MoeConfig, Qwen3MoeConfig

    common = {"vocab_size": vocab_size, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 48, "moe_intermediate_size": 16,
              "num_experts": num_experts, "num_experts_per_tok": 2, "max_position_embeddings": 256,
              "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    common.update(overrides)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(head_dim=8, norm_topk_prob=True, **common)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(shared_expert_intermediate_size=24, **common)
    if family == "mixtral":  # experts of intermediate_size, counted by num_local_experts
        from transformers import MixtralConfig

        common["intermediate_size"] = common.pop("moe_intermediate_size")
        return MixtralConfig(num_local_experts=common.pop("num_experts"), **common)
    if family == "olmoe":
        from transformers import OlmoeConfig

        common["intermediate_size"] = common.pop("moe_intermediate_size")
        return OlmoeConfig(**common)
    raise ValueError(family)


def save_moe_model(save_dir, family: str, tokenizer_dir=None, seed: int = 0, **overrides) -> str:
    """A random-weight MoE causal LM (and the tokenizer, if given) written with ``save_pretrained``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        overrides = {"vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id,
                     "pad_token_id": tokenizer.pad_token_id, **overrides}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(moe_config(family, **overrides), dtype=torch.float32)
    model.save_pretrained(save_dir)
    if tokenizer_dir is not None:
        tokenizer.save_pretrained(save_dir)
    return str(save_dir)


def ragged_batch(vocab: int, seed: int = 3):
    """Three rows of 7 prompt + 5 response columns: prompts of 7, 4 and 2 tokens (left-padded),
    responses of 5, 2 and 3 (right-padded)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (3, 12), generator=generator)
    mask = torch.zeros_like(input_ids)
    for row, (prompt, response) in enumerate([(7, 5), (4, 2), (2, 3)]):
        mask[row, 7 - prompt:7 + response] = 1
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), 5
