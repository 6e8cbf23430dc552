import pickle

import numpy as np
import pytest
import torch

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto


def make(n=4):
    return DataProto.from_dict(
        tensors={"x": torch.arange(n * 2).reshape(n, 2), "y": torch.arange(n).float()},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "rm": [{"gt": i} for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def test_from_single_dict_sorts_columns_and_keeps_dicts_whole():
    d = DataProto.from_single_dict({"ids": torch.zeros(3, 5), "gt": [{"a": 1}, {"a": 2}, {"a": 3}],
                                    "tags": [[1, 2], [3, 4], [5, 6]]})
    assert list(d.batch) == ["ids"]
    assert d.non_tensor_batch["gt"].shape == (3,) and d.non_tensor_batch["gt"][1] == {"a": 2}
    assert d.non_tensor_batch["tags"].shape == (3,) and d.non_tensor_batch["tags"][2] == [5, 6]
    assert len(d) == 3


def test_mismatched_batch_sizes_name_the_columns():
    with pytest.raises(ValueError, match=r"batch\['a'\]=3.*non_tensor_batch\['b'\]=2"):
        DataProto.from_dict({"a": torch.zeros(3)}, {"b": ["p", "q"]})
    with pytest.raises(TypeError, match="numpy array"):
        DataProto(batch={"a": torch.zeros(2)}, non_tensor_batch={"b": ["p", "q"]})


def test_getitem_int_slice_and_indices():
    d = make()
    item = d[2]
    assert item.batch["x"].tolist() == [4, 5] and item.non_tensor_batch["uid"] == "u2"
    assert d[1:3].batch["y"].tolist() == [1.0, 2.0]
    assert d[[3, 0]].non_tensor_batch["uid"].tolist() == ["u3", "u0"]
    assert d[np.array([True, False, True, False])].batch["y"].tolist() == [0.0, 2.0]
    with pytest.raises(IndexError):
        d[4]


def test_select_pop_rename_and_missing_keys():
    d = make()
    s = d.select(batch_keys=["x"], non_tensor_batch_keys=["uid"])
    assert list(s.batch) == ["x"] and list(s.non_tensor_batch) == ["uid"]
    with pytest.raises(KeyError, match=r"no key\(s\) \['z'\]; available: \['x', 'y'\]"):
        d.select(batch_keys=["z"])
    popped = d.pop(batch_keys=["y"], meta_info_keys=["temperature"])
    assert list(popped.batch) == ["y"] and "y" not in d.batch and "temperature" not in d.meta_info
    d.rename("x", "input_ids")
    assert "input_ids" in d.batch and "x" not in d.batch
    with pytest.raises(KeyError):
        d.rename("missing", "other")


def test_union_merges_and_refuses_conflicts():
    a = make()
    b = DataProto.from_dict({"x": a.batch["x"].clone(), "z": torch.ones(4)}, {"uid": list(a.non_tensor_batch["uid"])})
    a.union(b)
    assert set(a.batch) == {"x", "y", "z"}
    c = DataProto.from_dict({"z": torch.zeros(4)})
    with pytest.raises(ValueError, match=r"union conflict: batch\['z'\]"):
        a.union(c)
    with pytest.raises(ValueError, match="meta_info\\['temperature'\\]"):
        a.union(DataProto(meta_info={"temperature": 0.5}))
    with pytest.raises(ValueError, match="batch sizes 4 and 2"):
        a.union(DataProto.from_dict({"w": torch.zeros(2)}))


def test_chunk_split_concat_roundtrip_and_metric_merge():
    d = make(6)
    parts = d.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    parts[0].meta_info["metrics"] = {"loss": 1.0}
    parts[1].meta_info["metrics"] = {"loss": [2.0, 3.0]}
    parts[2].meta_info["metrics"] = {"loss": 4.0, "lr": 0.1}
    back = DataProto.concat(parts)
    assert torch.equal(back.batch["x"], d.batch["x"])
    assert back.non_tensor_batch["uid"].tolist() == d.non_tensor_batch["uid"].tolist()
    assert back.meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0, 4.0], "lr": [0.1]}
    assert [len(p) for p in d.split(4)] == [4, 2]
    with pytest.raises(ValueError, match="pad_dataproto_to_divisor"):
        d.chunk(4)


def test_pad_to_divisor_then_unpad():
    d = make(5)
    padded, pad = pad_dataproto_to_divisor(d, 4)
    assert pad == 3 and len(padded) == 8
    # padding rows cycle from the start: rows 0, 1, 2
    assert padded.non_tensor_batch["uid"][5:].tolist() == ["u0", "u1", "u2"]
    chunks = padded.chunk(4)
    restored = unpad_dataproto(DataProto.concat(chunks), pad)
    assert torch.equal(restored.batch["x"], d.batch["x"])
    same, zero = pad_dataproto_to_divisor(d, 5)
    assert zero == 0 and same is d


def test_repeat_interleaved_and_tiled():
    d = make(2)
    inter = d.repeat(3, interleave=True)
    assert inter.non_tensor_batch["uid"].tolist() == ["u0"] * 3 + ["u1"] * 3
    assert inter.batch["x"][:, 0].tolist() == [0, 0, 0, 2, 2, 2]
    tiled = d.repeat(2, interleave=False)
    assert tiled.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1"]
    assert tiled.batch["x"][:, 0].tolist() == [0, 2, 0, 2]
    assert tiled.non_tensor_batch["rm"][2] == {"gt": 0}


def test_reorder_in_place():
    d = make()
    d.reorder([3, 2, 1, 0])
    assert d.batch["y"].tolist() == [3.0, 2.0, 1.0, 0.0]
    assert d.non_tensor_batch["uid"].tolist() == ["u3", "u2", "u1", "u0"]


def test_make_iterator_epochs_and_seeded_shuffle():
    d = make(8)
    plain = [mb.batch["y"].tolist() for mb in d.make_iterator(4, epochs=2)]
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    run1 = [mb.batch["y"].tolist() for mb in d.make_iterator(2, epochs=2, shuffle=True, seed=7)]
    run2 = [mb.batch["y"].tolist() for mb in d.make_iterator(2, epochs=2, shuffle=True, seed=7)]
    assert run1 == run2
    first, second = run1[:4], run1[4:]
    assert sorted(sum(first, [])) == list(range(8)) and sorted(sum(second, [])) == list(range(8))
    assert first != second  # each epoch draws a new permutation
    with pytest.raises(ValueError, match="not a multiple"):
        next(d.make_iterator(3))


def test_pickle_roundtrip_ships_only_the_chunk():
    d = DataProto.from_dict({"big": torch.zeros(1000, 100)}, {"uid": list(range(1000))})
    chunk = d.chunk(10)[3]
    blob = pickle.dumps(chunk)
    full = pickle.dumps(d)
    assert len(blob) < len(full) / 5
    back = pickle.loads(blob)
    assert len(back) == 100 and back.non_tensor_batch["uid"][0] == 300


def test_save_and_load_from_disk(tmp_path):
    d = make()
    path = tmp_path / "sub" / "batch.pt"
    d.save_to_disk(str(path))
    back = DataProto.load_from_disk(str(path))
    assert torch.equal(back.batch["x"], d.batch["x"])
    assert back.non_tensor_batch["rm"][3] == {"gt": 3}
    assert back.meta_info == {"temperature": 1.0}
    assert [p.name for p in path.parent.iterdir()] == ["batch.pt"]  # no temporary file left


def test_concat_refuses_different_columns():
    with pytest.raises(KeyError, match="part 1"):
        DataProto.concat([make(2), make(2).select(batch_keys=["x"])])
