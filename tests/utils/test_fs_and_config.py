import os
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from verl.trainer.config import KLControlConfig
from verl.utils.fs import atomic_torch_save, atomic_write


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "state.txt"
    with atomic_write(str(path), "w") as f:
        f.write("step 1")
    with pytest.raises(RuntimeError):
        with atomic_write(str(path), "w") as f:
            f.write("half of step 2")
            raise RuntimeError("crash mid-write")
    assert path.read_text() == "step 1"
    assert os.listdir(tmp_path) == ["state.txt"]  # no temporary file left behind


def test_atomic_torch_save_creates_folders(tmp_path):
    import torch

    path = tmp_path / "a" / "b" / "x.pt"
    atomic_torch_save({"x": torch.ones(2)}, str(path))
    assert torch.equal(torch.load(path)["x"], torch.ones(2))


@pytest.mark.parametrize("make", [dict, OmegaConf.create, lambda d: SimpleNamespace(**d)])
def test_a_config_section_reads_every_config_flavour(make):
    kl = KLControlConfig.from_config(make({"kl_coef": 0.5, "type": "adaptive"}))
    assert (kl.type, kl.kl_coef, kl.target_kl, kl.horizon) == ("adaptive", 0.5, 0.1, 10000)  # the rest: the yaml's
    assert KLControlConfig.from_config(kl) is kl and KLControlConfig.from_config(None) == KLControlConfig()


def test_atomic_write_gives_the_file_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        with atomic_write(str(tmp_path / "out.json"), "w") as f:
            f.write("{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "out.json").stat().st_mode & 0o777 == 0o644  # 0o666 less the umask, as open() makes it
