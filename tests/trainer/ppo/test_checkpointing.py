import os
from types import SimpleNamespace

import pytest

from verl.trainer.ppo import checkpointing


def make_step(root, step, roles=("actor", "critic")):
    folder = checkpointing.step_dir(str(root), step)
    for role in roles:
        os.makedirs(os.path.join(folder, role))
    checkpointing.save_driver_state(folder, {"global_step": step})
    return folder


def trainer_config(root, mode="auto", path=None):
    return SimpleNamespace(resume_mode=mode, resume_from_path=path, default_local_dir=str(root))


def test_a_crash_while_saving_leaves_the_previous_checkpoint_in_use(tmp_path):
    make_step(tmp_path, 1)
    checkpointing.mark_complete(str(tmp_path), 1)
    make_step(tmp_path, 2)  # step 2 was being written when the run died: the tracker still says 1
    assert checkpointing.resume_checkpoint(trainer_config(tmp_path)) == checkpointing.step_dir(str(tmp_path), 1)
    checkpointing.mark_complete(str(tmp_path), 2)
    assert checkpointing.resume_checkpoint(trainer_config(tmp_path)).endswith("global_step_2")


def test_resume_modes(tmp_path):
    assert checkpointing.resume_checkpoint(trainer_config(tmp_path)) is None  # nothing saved yet
    folder = make_step(tmp_path, 3)
    checkpointing.mark_complete(str(tmp_path), 3)
    assert checkpointing.resume_checkpoint(trainer_config(tmp_path, "disable")) is None
    assert checkpointing.resume_checkpoint(trainer_config(tmp_path, "resume_path", folder)) == folder
    assert checkpointing.step_of(folder) == 3
    with pytest.raises(ValueError, match="global_step_<N>"):
        checkpointing.resume_checkpoint(trainer_config(tmp_path, "resume_path", str(tmp_path)))
    (tmp_path / checkpointing.TRACKER_FILE).write_text("7")
    with pytest.raises(FileNotFoundError, match="resume_mode=disable"):
        checkpointing.resume_checkpoint(trainer_config(tmp_path))


def test_rotation_keeps_the_newest(tmp_path):
    for step in (1, 2, 3):
        make_step(tmp_path, step)
    make_step(tmp_path, 4, roles=("actor",))
    checkpointing.rotate(str(tmp_path), "actor", keep=2)
    checkpointing.rotate(str(tmp_path), "critic", keep=2)
    left = {step: sorted(os.listdir(tmp_path / f"global_step_{step}")) for step in (2, 3, 4)
            if (tmp_path / f"global_step_{step}").exists()}
    # actor kept for 3 and 4; critic kept for 2 and 3; step 1 lost both, so it is gone entirely
    assert not (tmp_path / "global_step_1").exists()
    assert left == {2: ["critic", "data.pt"], 3: ["actor", "critic", "data.pt"], 4: ["actor", "data.pt"]}
    checkpointing.rotate(str(tmp_path), "actor", keep=None)  # keep all
    assert (tmp_path / "global_step_3" / "actor").exists()
