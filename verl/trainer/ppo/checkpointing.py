"""Where trainer checkpoints live, which one to resume from, and how old ones are rotated.

Layout under ``trainer.default_local_dir``::

    global_step_N/actor/        the actor's shards (written by every actor rank)
    global_step_N/critic/       the critic's shards, when a critic is used
    global_step_N/data.pt       the dataloader position and the driver's own state
    latest_checkpointed_iteration.txt   "N", written last

The tracker file is written only after every part of step N is on disk, and atomically; a crash
while saving therefore leaves the tracker pointing at the previous, complete checkpoint.
"""

from __future__ import annotations

import logging
import os
import re
import shutil

import torch

from verl.utils.fs import atomic_torch_save, atomic_write

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def step_of(path: str) -> int:
    """The N of a ``.../global_step_N`` folder; a clear error for anything else."""
    match = _STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    if match is None:
        raise ValueError(f"trainer.resume_from_path={path!r} must be a checkpoint folder named "
                         "global_step_<N> (e.g. checkpoints/my_project/my_run/global_step_20)")
    return int(match.group(1))


def latest_checkpoint(root: str) -> str | None:
    """The folder the tracker file points at, or None when there is no finished checkpoint."""
    tracker = os.path.join(root, TRACKER_FILE)
    if not os.path.isfile(tracker):
        return None
    with open(tracker) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise ValueError(f"{tracker} should hold a step number, found {text!r}; delete it to start fresh "
                         "or set trainer.resume_mode=disable")
    path = step_dir(root, int(text))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{tracker} points at step {text} but {path} does not exist; set "
                                "trainer.resume_mode=disable to start fresh")
    return path


def resume_checkpoint(trainer_config) -> str | None:
    """The checkpoint folder to resume from under ``trainer.resume_mode``, or None to start fresh."""
    mode = trainer_config.resume_mode
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = trainer_config.resume_from_path
        step_of(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"trainer.resume_from_path={path!r} does not exist")
        return path
    return latest_checkpoint(trainer_config.default_local_dir)


def earlier_checkpoints(root: str, before: int) -> list[str]:
    """Step folders under ``root`` older than step ``before`` that hold an actor and the driver state,
    newest first: where auto-resume falls back when the newest checkpoint cannot be read."""
    if not os.path.isdir(root):
        return []
    steps = sorted((int(m.group(1)) for name in os.listdir(root) if (m := _STEP_DIR.match(name))), reverse=True)
    return [step_dir(root, s) for s in steps if s < before and os.path.isdir(os.path.join(step_dir(root, s), "actor"))
            and os.path.isfile(os.path.join(step_dir(root, s), "data.pt"))]


def save_driver_state(path: str, state: dict) -> None:
    atomic_torch_save(state, os.path.join(path, "data.pt"))


def load_driver_state(path: str) -> dict:
    file = os.path.join(path, "data.pt")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} is missing: the checkpoint at {path} is incomplete")
    return torch.load(file, weights_only=False)


def mark_complete(root: str, step: int) -> None:
    """Point the tracker at ``step``: call only after every part of the step is written."""
    with atomic_write(os.path.join(root, TRACKER_FILE), "w") as f:
        f.write(str(step))


def rotate(root: str, role: str | None, keep: int | None) -> None:
    """Delete the ``role`` folders of all but the newest ``keep`` checkpoints (None or <= 0: keep all); with
    ``role=None`` whole step folders (the SFT trainer writes its shards straight into them).

    A step folder left with nothing in it is removed too.
    """
    if not keep or keep <= 0 or not os.path.isdir(root):
        return
    steps = sorted(int(m.group(1)) for name in os.listdir(root) if (m := _STEP_DIR.match(name))
                   and (role is None or os.path.isdir(os.path.join(root, name, role))))
    for step in steps[:-keep]:
        folder = step_dir(root, step)
        if role is not None:
            shutil.rmtree(os.path.join(folder, role), ignore_errors=True)
        if role is None or not set(os.listdir(folder)) - {"data.pt"}:
            shutil.rmtree(folder, ignore_errors=True)
        logger.info("removed old checkpoint %s", folder if role is None else os.path.join(folder, role))
