import copy
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import (DataProto, DataProtoConfig, DataProtoError, DataProtoItem, pad_dataproto_to_divisor,
                           unpad_dataproto)


def make(n=4):
    return DataProto.from_dict(
        tensors={"x": torch.arange(n * 2).reshape(n, 2), "y": torch.arange(n).float()},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "rm": [{"gt": i} for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def test_from_single_dict_sorts_columns_and_keeps_dicts_whole():
    d = DataProto.from_single_dict({"ids": torch.zeros(3, 5), "gt": [{"a": 1}, {"a": 2}, {"a": 3}],
                                    "tags": [[1, 2], [3, 4], [5, 6]]})
    assert list(d.batch.keys()) == ["ids"]
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
    assert list(s.batch.keys()) == ["x"] and list(s.non_tensor_batch) == ["uid"]
    with pytest.raises(KeyError, match=r"no key\(s\) \['z'\]; available: \['x', 'y'\]"):
        d.select(batch_keys=["z"])
    popped = d.pop(batch_keys=["y"], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["y"] and "y" not in d.batch and "temperature" not in d.meta_info
    d.rename("x", "input_ids")
    assert "input_ids" in d.batch and "x" not in d.batch
    with pytest.raises(KeyError):
        d.rename("missing", "other")


def test_union_merges_and_refuses_conflicts():
    a = make()
    b = DataProto.from_dict({"x": a.batch["x"].clone(), "z": torch.ones(4)}, {"uid": list(a.non_tensor_batch["uid"])})
    a.union(b)
    assert set(a.batch.keys()) == {"x", "y", "z"}
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


# ------------------------------------------------------------------ the TensorDict batch, as the original's
def test_batch_is_a_tensordict_or_none():
    d = make()
    assert isinstance(d.batch, TensorDict) and d.batch.batch_size == torch.Size([4])
    from_dict_batch = DataProto(batch={"a": torch.zeros(3, 2)})
    assert isinstance(from_dict_batch.batch, TensorDict) and len(from_dict_batch) == 3
    only_strings = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"]})
    assert only_strings.batch is None and len(only_strings) == 3
    assert DataProto().batch is None and len(DataProto()) == 0
    assert DataProto(batch={}).batch is None


def test_built_from_a_tensordict():
    td = TensorDict({"a": torch.arange(3), "b": torch.ones(3, 2)}, batch_size=[3])
    d = DataProto(batch=td, non_tensor_batch={"uid": np.array(["p", "q", "r"], dtype=object)})
    assert d.batch is td and len(d) == 3
    assert d[1:].batch["a"].tolist() == [1, 2]
    assert [p.non_tensor_batch["uid"].tolist() for p in d.chunk(3)] == [["p"], ["q"], ["r"]]
    assert DataProto.concat(d.chunk(3)).batch["a"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"batch_size=\[rows\]"):
        DataProto(batch=TensorDict({"a": torch.arange(3)}, batch_size=[]))
    with pytest.raises(TypeError, match="tensordict.TensorDict"):
        DataProto(batch=[torch.arange(3)])
    with pytest.raises(ValueError, match=r"batch\['a'\]=3, batch\['b'\]=2"):
        DataProto.from_dict({"a": torch.zeros(3), "b": torch.zeros(2)})


def test_int_index_gives_an_item_with_a_tensordict_row():
    d = make()
    item = d[-1]
    assert isinstance(item, DataProtoItem)
    assert isinstance(item.batch, TensorDict) and item.batch.batch_size == torch.Size([])
    assert item.batch["x"].tolist() == [6, 7] and item.batch["y"].item() == 3.0
    assert item.non_tensor_batch == {"uid": "u3", "rm": {"gt": 3}} and item.meta_info == {"temperature": 1.0}
    assert d[np.int64(1)].non_tensor_batch["uid"] == "u1"
    assert [row.non_tensor_batch["uid"] for row in d] == ["u0", "u1", "u2", "u3"]
    no_tensors = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    assert no_tensors[1].batch is None and no_tensors[1].non_tensor_batch == {"uid": "b"}


def test_getitem_tensor_indices_and_unsupported_types():
    d = make()
    assert d[torch.tensor([3, 0])].batch["y"].tolist() == [3.0, 0.0]
    assert d[torch.tensor([False, True, True, False])].non_tensor_batch["uid"].tolist() == ["u1", "u2"]
    assert d[np.array([2])].batch["x"].tolist() == [[4, 5]]
    selected = d[[]]
    assert len(selected) == 0 and selected.batch.batch_size == torch.Size([0])
    for bad in ("x", 1.5, (0, 1)):
        with pytest.raises(TypeError, match="indices are"):
            d[bad]


def test_slice_select_idxs_and_reorder():
    d = make()
    assert d.slice(1, 4, 2).batch["y"].tolist() == [1.0, 3.0]
    assert d.slice(1, 4, 2).batch.batch_size == torch.Size([2])
    assert d.select_idxs(np.array([1, 1])).non_tensor_batch["rm"].tolist() == [{"gt": 1}, {"gt": 1}]
    assert d.select_idxs([True, False, False, True]).batch["x"].tolist() == [[0, 1], [6, 7]]
    with pytest.raises(ValueError, match="mask of shape"):
        d.select_idxs([True, False])
    d.reorder(torch.tensor([1, 0, 3, 2]))
    assert d.batch["x"][:, 0].tolist() == [2, 0, 6, 4]
    assert d.non_tensor_batch["uid"].tolist() == ["u1", "u0", "u3", "u2"]
    with pytest.raises(ValueError, match="reorder needs 4 indices, got 2"):
        d.reorder([0, 1])


def test_select_shares_tensors_not_the_container():
    d = make()
    s = d.select()
    assert s.batch["x"] is d.batch["x"]
    s.batch["new"] = torch.zeros(4)
    assert "new" not in d.batch.keys()
    deep = d.select(batch_keys=["x"], non_tensor_batch_keys=["rm"], deepcopy=True)
    deep.batch["x"][0, 0] = 100
    deep.non_tensor_batch["rm"][0]["gt"] = 100
    assert d.batch["x"][0, 0].item() == 0 and d.non_tensor_batch["rm"][0] == {"gt": 0}
    assert list(d.select(batch_keys=[]).batch.keys()) == [] and len(d.select(batch_keys=[])) == 4
    with pytest.raises(KeyError, match=r"non_tensor_batch has no key\(s\) \['gt'\]; available: \['rm', 'uid'\]"):
        d.select(non_tensor_batch_keys=["gt"])
    with pytest.raises(KeyError, match=r"meta_info has no key\(s\) \['seed'\]"):
        d.select(meta_info_keys=["seed"])
    with pytest.raises(KeyError, match=r"available: \[\]"):
        DataProto.from_dict(non_tensors={"uid": ["a"]}).select(batch_keys=["x"])


def test_pop_rename_errors_are_key_and_assertion_errors():
    d = make()
    popped = d.pop(batch_keys=["x", "y"], non_tensor_batch_keys=["rm"])
    assert popped.batch["y"].tolist() == [0.0, 1.0, 2.0, 3.0] and popped.non_tensor_batch["rm"][2] == {"gt": 2}
    # as the original: the emptied TensorDict stays, with its batch size
    assert d.batch is not None and list(d.batch.keys()) == [] and len(d) == 4
    with pytest.raises(KeyError) as missing:
        d.pop(batch_keys=["x"])
    assert isinstance(missing.value, AssertionError) and str(missing.value).startswith("DataProto.batch has no")
    e = make()
    e.rename(["x", "y"], ["y", "x"])
    assert e.batch["y"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]] and e.batch["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(KeyError, match=r"overwrite existing batch key\(s\) \['y'\]"):
        e.rename("x", "y")
    with pytest.raises(ValueError, match="as many new keys"):
        e.rename(["x"], ["a", "b"])


def test_union_with_no_tensors_keeps_own_equal_tensors_and_nan_is_equal():
    a = DataProto.from_dict(non_tensors={"uid": ["a", "b"]}, meta_info={"step": 1})
    a.union(DataProto.from_dict({"z": torch.tensor([1, 2])}, {"score": np.array([0.5, np.nan])}, {"step": 1}))
    assert a.batch["z"].tolist() == [1, 2] and a.non_tensor_batch["score"][0] == 0.5
    own = a.batch["z"]
    a.union(DataProto.from_dict({"z": torch.tensor([1, 2])}, {"score": np.array([0.5, np.nan])}))
    assert a.batch["z"] is own  # equal tensors: this one's is kept, as the original's union_tensor_dict does
    with pytest.raises(ValueError, match=r"union conflict: non_tensor_batch\['uid'\]") as conflict:
        a.union(DataProto.from_dict(non_tensors={"uid": ["a", "c"]}))
    assert isinstance(conflict.value, AssertionError)


def test_chunk_error_is_value_and_assertion_error():
    d = make(5)
    with pytest.raises(ValueError):
        d.chunk(2)
    with pytest.raises(AssertionError):
        d.chunk(2)
    with pytest.raises(DataProtoError, match="chunks must be a positive int"):
        d.chunk(0)
    assert [len(p) for p in DataProto.from_dict(non_tensors={"u": list("abcd")}).chunk(2)] == [2, 2]
    assert [len(p) for p in DataProto().chunk(2)] == [0, 0]


def test_auto_padding_lets_chunk_split_unevenly(monkeypatch):
    assert not make(5).is_padding_enabled()
    monkeypatch.setattr(DataProtoConfig, "auto_padding", True)
    assert DataProtoConfig.auto_padding and make(5).is_padding_enabled()
    # as torch.chunk: parts of ceil(5 / 2) = 3 rows; ceil(5 / 4) = 2 rows gives 3 parts and one empty part
    assert [p.batch["y"].tolist() for p in make(5).chunk(2)] == [[0.0, 1.0, 2.0], [3.0, 4.0]]
    assert [len(p) for p in make(5).chunk(4)] == [2, 2, 1, 0]
    monkeypatch.setattr(DataProtoConfig, "auto_padding", False)
    one = DataProto.from_dict({"y": torch.arange(3)}, auto_padding=True)
    assert one.meta_info == {DataProtoConfig.auto_padding_key: True}
    assert [len(p) for p in one.chunk(2)] == [2, 1]
    monkeypatch.setenv("VERL_AUTO_PADDING", "1")
    assert make(3).is_padding_enabled()


def test_padding_appends_copies_of_the_last_or_first_row():
    d = make(3)
    d.padding(2)
    assert d.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u2", "u2"]
    assert d.batch["x"][:, 0].tolist() == [0, 2, 4, 4, 4] and d.batch.batch_size == torch.Size([5])
    d.padding(1, padding_candidate="first")
    assert d.batch["y"].tolist() == [0.0, 1.0, 2.0, 2.0, 2.0, 0.0]
    d.padding(0)
    assert len(d) == 6
    with pytest.raises(ValueError, match="empty"):
        DataProto().padding(1)


def test_pad_to_a_divisor_larger_than_the_batch_cycles_rows():
    d = make(2)
    padded, pad = pad_dataproto_to_divisor(d, 5)
    assert pad == 3 and padded.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1", "u0"]
    assert padded.batch["y"].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert unpad_dataproto(padded, pad).batch["y"].tolist() == [0.0, 1.0]
    assert unpad_dataproto(padded, 0) is padded
    empty, zero = pad_dataproto_to_divisor(DataProto(), 4)
    assert zero == 0 and len(empty) == 0


def test_repeat_without_tensors_and_tiled_tensors():
    d = make(2)
    assert d.repeat(2, interleave=False).batch["y"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert d.repeat(2).batch.batch_size == torch.Size([4])
    strings = DataProto.from_dict(non_tensors={"u": ["a", "b"]})
    assert strings.repeat(2).non_tensor_batch["u"].tolist() == ["a", "a", "b", "b"]
    assert strings.repeat(2).batch is None


@pytest.mark.parametrize("counts", [[2, 0, 1, 3], (2, 0, 1, 3), np.array([2, 0, 1, 3]), torch.tensor([2, 0, 1, 3])])
def test_sample_level_repeat(counts):
    out = make(4).sample_level_repeat(counts)
    assert out.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u2", "u3", "u3", "u3"]
    assert out.batch["x"][:, 0].tolist() == [0, 0, 4, 6, 6, 6]
    assert out.batch.batch_size == torch.Size([6]) and out.meta_info == {"temperature": 1.0}


def test_sample_level_repeat_checks_its_counts():
    with pytest.raises(ValueError, match=r"one count >= 0 per row \(4 rows\)"):
        make(4).sample_level_repeat([1, 2])
    with pytest.raises(ValueError):
        make(2).sample_level_repeat([1, -1])
    with pytest.raises(TypeError, match="list, tuple"):
        make(2).sample_level_repeat(2)
    assert DataProto.from_dict(non_tensors={"u": ["a", "b"]}).sample_level_repeat([0, 2]).non_tensor_batch[
        "u"].tolist() == ["b", "b"]


def test_concat_merges_meta_info_of_every_part_and_metric_lists():
    parts = make(4).chunk(2)
    parts[0].meta_info.update({"a": 1, "metrics": {"loss": 1.0}})
    parts[1].meta_info.update({"b": [2], "nan": float("nan"), "metrics": [{"loss": 2.0}, {"loss": 3.0, "acc": 0.5}]})
    parts[0].meta_info["nan"] = float("nan")
    out = DataProto.concat(parts)
    assert out.meta_info == {"temperature": 1.0, "a": 1, "nan": out.meta_info["nan"], "b": [2],
                             "metrics": {"loss": [1.0, 2.0, 3.0], "acc": [0.5]}}
    assert out.batch.batch_size == torch.Size([4]) and out.batch["y"].tolist() == [0.0, 1.0, 2.0, 3.0]
    parts[1].meta_info["temperature"] = 0.7
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] is 1.0 in an earlier part but 0.7 in part 1") \
            as conflict:
        DataProto.concat(parts)
    assert isinstance(conflict.value, AssertionError)


def test_concat_of_metric_only_parts_has_no_batch():
    out = DataProto.concat([DataProto(meta_info={"metrics": {"actor/pg_loss": [0.5, 0.25]}}),
                            DataProto(meta_info={"metrics": {"actor/pg_loss": [0.75]}})])
    assert out.batch is None and len(out) == 0
    assert out.meta_info == {"metrics": {"actor/pg_loss": [0.5, 0.25, 0.75]}}
    with pytest.raises(KeyError, match="part 1"):
        DataProto.concat([DataProto(), make(2)])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


def test_make_iterator_shuffles_each_epoch_from_the_seed():
    d = make(8)
    generator = torch.Generator().manual_seed(7)
    orders = [torch.randperm(8, generator=generator).tolist() for _ in range(3)]  # one permutation per epoch
    expected = [order[i:i + 2] for order in orders for i in range(0, 8, 2)]
    rows = [[int(y) for y in mb.batch["y"]] for mb in d.make_iterator(2, 3, 7, {"shuffle": True})]
    assert rows == expected
    assert [[int(y) for y in mb.batch["y"]] for mb in d.make_iterator(2, epochs=3, shuffle=True, seed=7)] == expected
    assert [[int(y) for y in mb.batch["y"]] for mb in d.make_iterator(4, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    with pytest.raises(TypeError, match=r"'shuffle' and 'drop_last', got \['num_workers'\]"):
        d.make_iterator(2, 1, dataloader_kwargs={"num_workers": 2})
    with pytest.raises(AssertionError, match="not a multiple"):
        d.make_iterator(3, 1)


def test_make_iterator_mini_batches_have_their_own_meta_info():
    batches = list(make(4).make_iterator(2, epochs=1))
    batches[0].meta_info["loss_scale"] = 0.5
    assert batches[1].meta_info == {"temperature": 1.0}
    assert [mb.batch.batch_size for mb in batches] == [torch.Size([2])] * 2


def test_get_data_info():
    d = make(2)
    d.meta_info["metrics"] = {"loss": [0.5]}
    assert d.get_data_info() == "\n".join([
        "batch",
        "  x: (2, 2) (torch.int64) cpu",
        "  y: (2,) (torch.float32) cpu",
        "non_tensor_batch",
        "  uid: ndarray(2,) (object)",
        "  rm: ndarray(2,) (object)",
        "meta_info",
        "  temperature: float",
        "  metrics: dict[str: list[float]]",
    ])
    assert DataProto.from_dict(non_tensors={"u": ["a"]}).get_data_info() == \
        "batch\nnon_tensor_batch\n  u: ndarray(1,) (object)\nmeta_info"


def test_to_and_from_tensordict():
    td = make(3).to_tensordict()
    assert td.batch_size == torch.Size([3]) and td["x"].tolist() == [[0, 1], [2, 3], [4, 5]]
    back = DataProto.from_tensordict(td)
    assert back.batch["y"].tolist() == [0.0, 1.0, 2.0] and list(back.batch.keys()) == ["x", "y"]
    assert back.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2"] and back.non_tensor_batch["rm"][1] == {"gt": 1}
    assert back.meta_info == {"temperature": 1.0}
    clash = make(2)
    clash.meta_info["x"] = 1
    with pytest.raises(ValueError, match=r"\['x'\]"):
        clash.to_tensordict()


def test_to_device_and_pickle_keep_the_tensordict():
    d = make(4)
    assert d.to("cpu") is d and d.batch.device in (None, torch.device("cpu"))
    back = pickle.loads(pickle.dumps(d.chunk(2)[1]))
    assert isinstance(back.batch, TensorDict) and back.batch.batch_size == torch.Size([2])
    assert back.batch["x"].untyped_storage().nbytes() == 2 * 2 * 8  # the chunk's rows only, not the parent's
    assert back.non_tensor_batch["uid"].tolist() == ["u2", "u3"] and back.meta_info == {"temperature": 1.0}
    strings = pickle.loads(pickle.dumps(DataProto.from_dict(non_tensors={"u": ["a"]})))
    assert strings.batch is None and len(strings) == 1
    emptied = make(2)
    emptied.pop(batch_keys=["x", "y"])
    assert len(pickle.loads(pickle.dumps(emptied))) == 2
    copied = copy.deepcopy(d)
    assert torch.equal(copied.batch["x"], d.batch["x"]) and copied.batch["x"] is not d.batch["x"]


def test_load_a_file_saved_before_the_tensordict(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"batch": {"x": torch.arange(3)}, "non_tensor_batch": {"u": np.array(["a", "b", "c"], dtype=object)},
                "meta_info": {"step": 2}}, path)
    back = DataProto.load_from_disk(str(path))
    assert isinstance(back.batch, TensorDict) and back.batch["x"].tolist() == [0, 1, 2]
    assert back.meta_info == {"step": 2} and back.non_tensor_batch["u"].tolist() == ["a", "b", "c"]


def test_concat_meta_info_rules_of_the_original():
    a, b, c = make(6).chunk(3)
    a.meta_info.update(metrics=None, eos=torch.tensor([2, 3]))  # the first part has no metrics
    b.meta_info.update(metrics=[{"pg_loss": 0.5}, {"pg_loss": 0.25, "lr": 1e-6}], eos=torch.tensor([2, 3]))
    c.meta_info.update(metrics={"pg_loss": [0.75, 1.0], "kl": [0.1]}, only_here="c")
    out = DataProto.concat([a, b, c])
    assert list(out.meta_info) == ["temperature", "eos", "only_here", "metrics"]
    assert torch.equal(out.meta_info["eos"], torch.tensor([2, 3])) and out.meta_info["only_here"] == "c"
    # list-of-dict and dict-of-list metrics of every part flattened into one list per key, in part order
    assert out.meta_info["metrics"] == {"pg_loss": [0.5, 0.25, 0.75, 1.0], "lr": [1e-6], "kl": [0.1]}
    assert "metrics" not in DataProto.concat([make(2), make(2)]).meta_info
    c.meta_info["eos"] = torch.tensor([2, 4])
    with pytest.raises(AssertionError, match=r"meta_info\['eos'\]"):
        DataProto.concat([a, b, c])


def test_an_uneven_chunk_raises_the_originals_assertion_error_with_the_fixes():
    with pytest.raises(AssertionError) as error:
        make(5).chunk(2)
    assert str(error.value) == ("cannot chunk a batch of 5 rows into 2 equal parts: pad it with "
                                "pad_dataproto_to_divisor(data, 2) first (unpad_dataproto after), or allow "
                                "unequal parts with DataProtoConfig.auto_padding = True")
