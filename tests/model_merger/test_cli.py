"""Errors of the model merger CLI. Merging itself is tested end to end on a 2-rank PPO checkpoint in
tests/trainer/test_main_ppo_e2e.py."""

from verl.model_merger.__main__ import main


def test_a_folder_that_is_not_a_checkpoint_is_named(tmp_path, capsys):
    assert main(["merge", "--backend", "fsdp", "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "out")]) == 1
    assert "huggingface/config.json not found" in capsys.readouterr().err


def test_an_existing_target_is_not_overwritten_by_accident(tmp_path, capsys):
    (tmp_path / "ckpt" / "huggingface").mkdir(parents=True)
    (tmp_path / "ckpt" / "huggingface" / "config.json").write_text("{}")
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    assert main(["merge", "--local_dir", str(tmp_path / "ckpt"), "--target_dir", str(target)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert (target / "keep.txt").read_text() == "mine"


def test_megatron_and_upload_say_what_to_do_instead(tmp_path, capsys):
    assert main(["merge", "--backend", "megatron", "--local_dir", str(tmp_path), "--target_dir", "x"]) == 2
    assert "use --backend fsdp" in capsys.readouterr().err
    assert main(["merge", "--local_dir", str(tmp_path), "--target_dir", "x", "--hf_upload_path", "me/model"]) == 2
    assert "huggingface-cli upload" in capsys.readouterr().err
