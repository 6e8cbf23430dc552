import os
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from verl.utils.config import config_get
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


@pytest.mark.parametrize("make", [
    lambda d: d,
    lambda d: OmegaConf.create(d),
    lambda d: SimpleNamespace(kl_ctrl=SimpleNamespace(**d["kl_ctrl"]), gamma=d["gamma"], lam=d["lam"]),
])
def test_config_get_reads_every_config_flavour(make):
    cfg = make({"kl_ctrl": {"kl_coef": 0.5, "target_kl": None}, "gamma": 0.9, "lam": None})
    assert config_get(cfg, "gamma") == 0.9
    assert config_get(cfg, "kl_ctrl.kl_coef") == 0.5
    assert config_get(cfg, "kl_ctrl.target_kl", 0.1) == 0.1  # None means "use the default"
    assert config_get(cfg, "lam", 1.0) == 1.0
    assert config_get(cfg, "missing.deeper", "d") == "d"
    assert config_get(None, "x", 3) == 3
