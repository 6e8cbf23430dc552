"""Rows with videos (data.video_key) are refused when the dataset is built, with a text or a vision-language model:
no model here reads videos, and dropping them silently would train on prompts that point at nothing."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.models.test_vision import vlm_dir  # noqa: F401 - the module-scoped model fixture
from verl.data import DatasetError, RLHFDataset
from verl.models.vision import load_processor


def write(path, videos, column="videos"):
    rows = [{"data_source": "x", "prompt": [{"role": "user", "content": f"Describe clip {i}."}], column: clips,
             "images": [], "reward_model": {"style": "rule", "ground_truth": "1"}} for i, clips in enumerate(videos)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_a_row_with_videos_stops_the_dataset(tiny_tokenizer, tmp_path):
    path = write(tmp_path / "clips.parquet", [[], None, ["clip.mp4"], ["other.mp4"]])
    with pytest.raises(DatasetError) as err:
        RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 64})
    message = str(err.value)
    assert message.startswith(f"{path}, row 2, column 'videos' (data.video_key) holds videos")
    assert "does not support video inputs" in message and "set data.video_key to a name that no column has" in message


def test_empty_video_cells_and_another_video_key_are_accepted(tiny_tokenizer, tmp_path):
    path = write(tmp_path / "empty.parquet", [[], None])
    assert len(RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 64})) == 2
    path = write(tmp_path / "clips.parquet", [["clip.mp4"]])
    dataset = RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 64, "video_key": "no_such_column"})
    assert dataset[0]["videos"] == ["clip.mp4"]  # passed along as any other column, never read


def test_data_video_key_names_the_column_checked(tiny_tokenizer, tmp_path):
    path = write(tmp_path / "renamed.parquet", [[{"path": "a.mp4"}]], column="clips")
    with pytest.raises(DatasetError, match=r"renamed.parquet, row 0, column 'clips' \(data.video_key\) holds videos"):
        RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 64, "video_key": "clips"})


def test_only_the_rows_served_are_checked(tiny_tokenizer, tmp_path):
    path = write(tmp_path / "late.parquet", [[], [], ["clip.mp4"]])
    assert len(RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 64, "shuffle": False}, max_samples=2)) == 2


def test_a_vision_language_model_refuses_videos_too(vlm_dir, tmp_path):  # noqa: F811
    processor = load_processor(vlm_dir)
    path = write(tmp_path / "vl.parquet", [[], ["clip.mp4"]])
    with pytest.raises(DatasetError, match=r"vl.parquet, row 1, column 'videos' \(data.video_key\) holds videos"):
        RLHFDataset(path, processor.tokenizer, {"max_prompt_length": 64}, processor=processor)
