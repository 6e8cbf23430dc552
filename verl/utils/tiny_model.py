"""Tiny tokenizers and models built locally, for tests and the CPU demo (no model hub needed).

The tokenizer is a byte-level BPE trained on a small corpus, wrapped as a fast tokenizer with a
ChatML chat template, ``<|im_end|>`` as eos and left padding -- the same shape as Qwen2.5's.
Everything is written with ``save_pretrained`` so callers load it through the real loading code.
"""

from __future__ import annotations

import os

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_DEFAULT_CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? #### 72",
    "Let's think step by step and output the final answer after \"####\".",
    "The answer is \\boxed{42}. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) , . $ %",
    "user assistant system You are a helpful assistant.",
]


def build_tiny_tokenizer(save_dir: str, corpus: list[str] | None = None, vocab_size: int = 512):
    """Train a byte-level BPE on ``corpus`` and save it as a chat tokenizer in ``save_dir``.

    Returns the saved directory; load it with ``transformers.AutoTokenizer.from_pretrained``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # The Qwen2 pipeline exactly: transformers rebuilds it when it loads a Qwen2 model folder, so a
    # tokenizer trained any other way would change its ids on reload.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus or _DEFAULT_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", padding_side="left", chat_template=CHATML_TEMPLATE)
    os.makedirs(save_dir, exist_ok=True)
    fast.save_pretrained(save_dir)
    return save_dir


def build_tiny_causal_lm(save_dir: str, tokenizer_dir: str | None = None, arch: str = "qwen2",
                         hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                         num_kv_heads: int = 2, intermediate_size: int = 128, vocab_size: int | None = None,
                         tie_word_embeddings: bool | None = None, seed: int = 0):
    """Save a random-weight Qwen2 or Llama causal LM (and the tokenizer, if given) to ``save_dir``.

    ``vocab_size`` defaults to the tokenizer's length so every token id has an embedding.
    Returns ``save_dir``; load it with ``AutoModelForCausalLM.from_pretrained``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else None
    if vocab_size is None:
        if tokenizer is None:
            raise ValueError("build_tiny_causal_lm needs vocab_size or tokenizer_dir")
        vocab_size = len(tokenizer)
    config_classes = {"qwen2": (Qwen2Config, True), "llama": (LlamaConfig, False)}  # class, tied by default
    if arch not in config_classes:
        raise ValueError(f"build_tiny_causal_lm supports arch 'qwen2' or 'llama', got {arch!r}")
    config_cls, tied = config_classes[arch]
    config = config_cls(
        tie_word_embeddings=tied if tie_word_embeddings is None else tie_word_embeddings, vocab_size=vocab_size,
        hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, max_position_embeddings=2048,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id if tokenizer is not None else None,
        pad_token_id=tokenizer.pad_token_id if tokenizer is not None else None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    os.makedirs(save_dir, exist_ok=True)
    model.save_pretrained(save_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(save_dir)
    return save_dir


def main(argv: list[str] | None = None) -> None:
    """``python -m verl.utils.tiny_model --save_dir DIR [--corpus train.parquet ...]``: a tiny random
    Qwen2 model and its tokenizer, trained on the prompts of the given parquet files, for CPU runs."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m verl.utils.tiny_model", description=main.__doc__)
    parser.add_argument("--save_dir", required=True)
    parser.add_argument("--corpus", nargs="*", default=[], help="verl-format parquet files to train the BPE on")
    parser.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    parser.add_argument("--vocab_size", type=int, default=512)
    args = parser.parse_args(argv)
    corpus = None
    if args.corpus:
        import pandas as pd

        corpus = [m["content"] for f in args.corpus for chat in pd.read_parquet(f)["prompt"] for m in chat]
    tokenizer_dir = build_tiny_tokenizer(os.path.join(args.save_dir, "tokenizer"), corpus, args.vocab_size)
    build_tiny_causal_lm(args.save_dir, tokenizer_dir, arch=args.arch)
    print(f"wrote a tiny {args.arch} model and its tokenizer to {args.save_dir}")


if __name__ == "__main__":
    main()
