import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A ChatML byte-level BPE tokenizer saved to disk (load it with AutoTokenizer)."""
    from verl.utils.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer(str(tmp_path_factory.mktemp("tiny_tokenizer")))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
