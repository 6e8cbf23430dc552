from transformers import AutoModelForCausalLM, AutoTokenizer


def test_tokenizer_ids_survive_reload_from_model_folders(tiny_tokenizer_dir, tiny_qwen2_dir, tiny_llama_dir):
    # transformers loads a Qwen2 folder with Qwen2Tokenizer, which rebuilds its pre-tokenizer; the
    # tiny tokenizer must give the same ids whichever folder it is loaded from.
    text = "Natalia sold 48 clips, then 1,234 more!  Hi \n\n#### 72 é"
    ids = [AutoTokenizer.from_pretrained(d)(text)["input_ids"]
           for d in (tiny_tokenizer_dir, tiny_qwen2_dir, tiny_llama_dir)]
    assert ids[0] == ids[1] == ids[2]
    tok = AutoTokenizer.from_pretrained(tiny_qwen2_dir)
    assert tok.decode(ids[0]) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None and tok.padding_side == "left"
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+3?"}], add_generation_prompt=True,
                                     tokenize=False)
    assert prompt == "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_models_load_with_tied_and_untied_embeddings(tiny_qwen2_dir, tiny_llama_dir, tiny_tokenizer):
    qwen = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir)
    llama = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert qwen.config.tie_word_embeddings and not llama.config.tie_word_embeddings
    assert qwen.lm_head.weight.data_ptr() == qwen.model.embed_tokens.weight.data_ptr()
    assert qwen.config.vocab_size == len(tiny_tokenizer) == llama.config.vocab_size
