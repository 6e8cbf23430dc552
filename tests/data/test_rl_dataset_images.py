"""RLHFDataset with a vision-language processor: images from bytes or paths, expanded image tokens, M-RoPE
positions, multi_modal_data / multi_modal_inputs, and errors that name the key, the file and the row."""

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from tests.models.test_vision import vlm_dir  # noqa: F401 - the module-scoped model fixture
from verl.data import DatasetError, RLHFDataset, collate_fn
from verl.models.vision import load_processor, rope_index


def png(size=(56, 56), color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def write(path, rows):
    table = [{"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": content}], "images": images,
              "reward_model": {"style": "rule", "ground_truth": "1"}} for content, images in rows]
    pq.write_table(pa.Table.from_pylist(table), path)
    return str(path)


@pytest.fixture(scope="module")
def processor(vlm_dir):  # noqa: F811
    return load_processor(vlm_dir)


def test_rows_with_images_become_model_inputs(processor, tmp_path):
    Image.new("RGB", (84, 56), "white").save(tmp_path / "side.png")
    path = write(tmp_path / "d.parquet", [("<image>Find x.", [{"bytes": png(), "path": None}]),
                                          ("Compare <image> and <image>.",
                                           [{"bytes": None, "path": "side.png"}, {"bytes": png(), "path": "a.png"}]),
                                          ("Text only.", [])])
    dataset = RLHFDataset(path, processor.tokenizer, {"max_prompt_length": 64}, processor=processor)
    batch = collate_fn([dataset[i] for i in range(3)])
    assert batch["input_ids"].shape == (3, 64) and batch["position_ids"].shape == (3, 3, 64)
    image_token = processor.image_token_id
    assert (batch["input_ids"] == image_token).sum(-1).tolist() == [4, 10, 0]  # 56x56: 4x4 patches, 4 tokens; 84x56: 6 tokens
    first = batch["multi_modal_inputs"][0]
    assert first["image_grid_thw"].tolist() == [[1, 4, 4]] and first["pixel_values"].shape == (16, 1176)
    assert [len(d.get("image", [])) for d in batch["multi_modal_data"]] == [1, 2, 0]
    assert batch["multi_modal_inputs"][2] == {}
    assert "images" not in batch
    grid = batch["multi_modal_inputs"][1]["image_grid_thw"]
    expected = rope_index(processor.config, batch["input_ids"][1], batch["attention_mask"][1], grid)
    torch.testing.assert_close(batch["position_ids"][1], expected)
    assert torch.equal(batch["position_ids"][2][0], batch["position_ids"][2][2])  # text only: one position per token


def test_a_vision_model_needs_the_image_column(processor, tmp_path):
    path = tmp_path / "text.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "x", "prompt": [{"role": "user", "content": "hi"}]}]), path)
    with pytest.raises(DatasetError, match=r"text.parquet: actor_rollout_ref.model.path is a vision-language model "
                                           r".*data.image_key='images'"):
        RLHFDataset(str(path), processor.tokenizer, {"max_prompt_length": 64}, processor=processor)


@pytest.mark.parametrize("content, images, message", [
    ("Two <image> <image>", [{"bytes": png(), "path": None}],
     r"row 0: the chat-templated prompt holds 2 image token"),
    ("<image>", [{"bytes": b"not a png", "path": None}], r"row 0, column 'images': image 0 could not be read"),
    ("<image>", [{"bytes": None, "path": "missing.png"}], r"row 0, column 'images': image 0 could not be read"),
])
def test_bad_image_rows_name_file_and_row(processor, tmp_path, content, images, message):
    path = write(tmp_path / "bad.parquet", [(content, images)])
    with pytest.raises(DatasetError, match=r"bad.parquet, " + message):
        RLHFDataset(path, processor.tokenizer, {"max_prompt_length": 64}, processor=processor)


def test_prompts_with_images_are_never_cut(processor, tmp_path):
    path = write(tmp_path / "long.parquet", [("<image>Find x.", [{"bytes": png((112, 112)), "path": None}])])
    with pytest.raises(DatasetError, match="prompts with images are never cut"):
        RLHFDataset(path, processor.tokenizer, {"max_prompt_length": 16, "truncation": "left"}, processor=processor)
    dataset = RLHFDataset(path, processor.tokenizer, {"max_prompt_length": 64}, processor=processor)
    assert len(dataset) == 1


def test_a_text_model_refuses_rows_with_images(tiny_tokenizer, tmp_path):
    path = write(tmp_path / "img.parquet", [("plain", []), ("<image>", [{"bytes": png(), "path": None}])])
    with pytest.raises(DatasetError, match=r"img.parquet, row 1, column 'images' \(data.image_key\) holds images, "
                                           r"but actor_rollout_ref.model.path is a text-only model"):
        RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 64})
