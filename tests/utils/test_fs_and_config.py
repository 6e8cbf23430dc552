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


def test_copy_to_local_returns_a_local_path_as_it_is(tmp_path):
    from verl.utils.fs import copy_to_local

    assert copy_to_local(str(tmp_path)) == str(tmp_path)
    assert copy_to_local("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # names are left to the loader


def test_copy_to_local_into_shared_memory_copies_once(tmp_path, monkeypatch):
    from verl.utils import fs

    monkeypatch.setattr(fs, "_SHM_ROOT", str(tmp_path / "shm"))
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "w.bin").write_bytes(b"1234")
    copy = fs.copy_to_local(str(model), use_shm=True)
    assert copy.startswith(str(tmp_path / "shm")) and os.path.basename(copy) == "model"
    assert (open(os.path.join(copy, "sub", "w.bin"), "rb").read()) == b"1234"
    marker = os.path.join(copy, "config.json")
    os.utime(marker, (0, 0))
    assert fs.copy_to_local(str(model), use_shm=True) == copy and os.path.getmtime(marker) == 0  # reused
    (model / "sub" / "w.bin").write_bytes(b"123456")  # changed size: copied again
    fs.copy_to_local(str(model), use_shm=True)
    assert open(os.path.join(copy, "sub", "w.bin"), "rb").read() == b"123456"


def test_copy_to_local_from_hdfs_copies_once_with_the_hdfs_command(tmp_path, monkeypatch):
    from verl.utils.fs import copy_to_local

    remote = tmp_path / "remote" / "model"
    remote.mkdir(parents=True)
    (remote / "config.json").write_text("{}")
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    hdfs = bin_dir / "hdfs"  # `hdfs dfs -get hdfs://<path> <dest>`: copies <path> and logs the call
    hdfs.write_text(f'#!/bin/sh\necho "$@" >> {log}\ncp -r "${{3#hdfs://}}" "$4"\n')
    hdfs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    src, cache = f"hdfs://{remote}", str(tmp_path / "cache")
    local = copy_to_local(src, cache_dir=cache)
    assert local.startswith(cache) and os.path.basename(local) == "model"
    assert open(os.path.join(local, "config.json")).read() == "{}"
    assert copy_to_local(src, cache_dir=cache) == local and len(log.read_text().splitlines()) == 1  # reused
    os.remove(os.path.join(local, "config.json"))  # an incomplete copy is made again
    copy_to_local(src, cache_dir=cache)
    copy_to_local(src, cache_dir=cache, always_recopy=True)
    assert len(log.read_text().splitlines()) == 3 and log.read_text().startswith("dfs -get hdfs://")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="hdfs"):
        copy_to_local("hdfs://elsewhere/model", cache_dir=cache)
