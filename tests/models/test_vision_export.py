"""A vision-language policy's checkpoint (huggingface/) and its model-merger export carry the model's processor
files, so they load as a processor, not just as a model (tiny random Qwen2.5-VL, one rank, CPU)."""

import importlib.util
import json
import logging
import os

import pytest
import torch
from PIL import Image

from tests.models.test_vision import vlm_dir  # noqa: F401 - the module-scoped model fixture
from verl.model_merger.__main__ import main as merger
from verl.models import load_causal_lm, load_tokenizer
from verl.models.vision import copy_processor_files, load_processor
from verl.workers.engine import FSDPEngine


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_processor_files_are_copied_and_the_saved_tokenizer_template_kept(tmp_path):
    source, target = tmp_path / "model", tmp_path / "export"
    source.mkdir()
    target.mkdir()
    files = {"preprocessor_config.json": '{"merge_size": 2}', "processor_config.json": "{}",
             "chat_template.json": '{"chat_template": "source"}', "chat_template.jinja": "source",
             "tokenizer.json": "{}", "config.json": "{}"}
    for name, text in files.items():
        (source / name).write_text(text)
    (target / "chat_template.jinja").write_text("trained with")
    assert copy_processor_files(str(source), str(target)) == ["preprocessor_config.json", "processor_config.json",
                                                              "chat_template.json"]
    assert sorted(os.listdir(target)) == ["chat_template.jinja", "chat_template.json", "preprocessor_config.json",
                                          "processor_config.json"]  # no temporary file left, no model file copied
    assert (target / "chat_template.jinja").read_text() == "trained with"
    assert (target / "preprocessor_config.json").read_text() == '{"merge_size": 2}'


def test_a_text_model_folder_has_no_processor_to_copy(tiny_qwen2_dir, tmp_path):
    assert "chat_template.jinja" in os.listdir(tiny_qwen2_dir)
    assert copy_processor_files(tiny_qwen2_dir, str(tmp_path)) == []
    assert os.listdir(tmp_path) == []


def _pixels(folder):
    processor = load_processor(folder)
    ids, inputs = processor("<|vision_start|><|image_pad|><|vision_end|>Find x.",
                            [Image.new("RGB", (56, 84), (10, 120, 230))])
    return [t == processor.image_token_id for t in ids], ids, inputs


@pytest.fixture(scope="module")
def exported(vlm_dir, tmp_path_factory):  # noqa: F811
    """One checkpoint of the tiny Qwen2.5-VL (with hf_model) and its merged export."""
    import torch.distributed as dist

    root = tmp_path_factory.mktemp("vlm_export")
    checkpoint = str(root / "global_step_1" / "actor")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=0, world_size=1)
        try:
            engine = FSDPEngine(load_causal_lm(vlm_dir), fsdp_config={"dtype": "float32"})
            engine.save_checkpoint(checkpoint, save_contents=["model", "hf_model"],
                                   tokenizer=load_tokenizer(vlm_dir))
        finally:
            dist.destroy_process_group()
    target = str(root / "merged")
    assert merger(["merge", "--backend", "fsdp", "--local_dir", checkpoint, "--target_dir", target]) == 0
    return {"source": vlm_dir, "checkpoint": checkpoint, "huggingface": os.path.join(checkpoint, "huggingface"),
            "merged": target}


@pytest.mark.parametrize("folder", ["huggingface", "merged"])
def test_checkpoint_and_export_load_as_the_source_processor(exported, folder):
    path = exported[folder]
    assert read(os.path.join(path, "preprocessor_config.json")) == read(
        os.path.join(exported["source"], "preprocessor_config.json"))
    assert not [n for n in os.listdir(path) if n.startswith(".") or "tmp" in n]
    is_image, ids, inputs = _pixels(path)
    _, expected_ids, expected = _pixels(exported["source"])
    assert ids == expected_ids and sum(is_image) == 6  # 6 x 4 patches of 14 pixels, 2 x 2 merged
    assert torch.equal(inputs["pixel_values"], expected["pixel_values"])
    assert inputs["image_grid_thw"].tolist() == [[1, 6, 4]]  # (t, h, w): 84 pixels high, 56 wide


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="transformers builds Qwen2_5_VLProcessor only with torchvision")
def test_export_loads_with_auto_processor(exported):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(exported["merged"])
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert processor.image_processor.merge_size == 2


def test_merging_a_checkpoint_without_processor_files_says_what_to_copy(exported, tmp_path, caplog):
    hf_dir = exported["huggingface"]
    preprocessor = os.path.join(hf_dir, "preprocessor_config.json")
    kept = read(preprocessor)
    os.remove(preprocessor)  # as a checkpoint written before they were copied
    try:
        with caplog.at_level(logging.WARNING, logger="verl.model_merger"):
            assert merger(["merge", "--local_dir", exported["checkpoint"], "--target_dir", str(tmp_path / "out")]) == 0
    finally:
        with open(preprocessor, "wb") as f:
            f.write(kept)
    assert "no preprocessor_config.json" in caplog.text and "actor_rollout_ref.model.path" in caplog.text
    with open(tmp_path / "out" / "config.json") as f:
        assert json.load(f)["model_type"] == "qwen2_5_vl"
