import pytest


@pytest.fixture(scope="module")
def no_pad_tokenizer_dir(tmp_path_factory):
    """A word-level tokenizer saved without a pad token (no text-only model needs a processor)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<eos>": 0, "a": 1, "b": 2, "<unk>": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    return str(folder)


def test_hf_tokenizer_pads_with_eos_when_the_tokenizer_has_no_pad(no_pad_tokenizer_dir):
    from verl.utils import hf_tokenizer

    with pytest.warns(UserWarning, match="pad_token"):
        tokenizer = hf_tokenizer(no_pad_tokenizer_dir)
    assert tokenizer.pad_token == "<eos>" and tokenizer.pad_token_id == 0
    assert tokenizer("a b")["input_ids"] == [1, 2]
    assert hf_tokenizer(no_pad_tokenizer_dir, correct_pad_token=False).pad_token is None


def test_hf_processor_is_none_for_a_text_only_model(no_pad_tokenizer_dir, tmp_path):
    from verl.utils import hf_processor

    assert hf_processor(no_pad_tokenizer_dir) is None
    with pytest.warns(UserWarning, match="Failed to create processor"):
        assert hf_processor(str(tmp_path / "missing")) is None
