"""A tiny random Qwen2.5-VL model with its tokenizer and image processor, saved offline.

No video processor is written: transformers builds those (and so the whole ``Qwen2_5_VLProcessor``) only with
torchvision, which this environment does not install; verl reads the image processor on its own.

The tokenizer is the tiny byte-level BPE of :mod:`verl.utils.tiny_model` plus Qwen2.5-VL's vision tokens, with a
chat template that renders ``{"type": "image"}`` content items as ``<|vision_start|><|image_pad|><|vision_end|>``
as Qwen2.5-VL's does. Images are cut into 14-pixel patches merged 2 x 2, with at most 112 x 112 pixels, so a
56 x 56 picture is 4 x 4 patches and 4 image tokens.
"""

import os

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PIXELS = {"min_pixels": 28 * 28, "max_pixels": 112 * 112}


def save_tiny_qwen2_5_vl(save_dir: str, tokenizer_dir: str, seed: int = 0) -> str:
    """Write a random-weight Qwen2.5-VL (text: hidden 64, 2 layers; vision: hidden 32, 2 blocks) and its
    tokenizer and image processor to ``save_dir``."""
    import torch
    from transformers import (AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2VLImageProcessorPil)

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 2048, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                          "mrope_section": [2, 3, 3]},
                     "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
                     "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": True},
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
                       "fullatt_block_indexes": [1], "tokens_per_second": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    os.makedirs(save_dir, exist_ok=True)
    model.save_pretrained(save_dir)
    image_processor = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2, **PIXELS)
    image_processor.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    return save_dir
