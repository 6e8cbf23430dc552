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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or _DEFAULT_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        chat_template=CHATML_TEMPLATE,
    )
    os.makedirs(save_dir, exist_ok=True)
    fast.save_pretrained(save_dir)
    return save_dir
