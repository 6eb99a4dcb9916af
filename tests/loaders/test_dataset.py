"""SimDataset in one process: content, order, projection, partition, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loader_helpers import commit_samples, keys_of, make_samples, open_test_shard
from simstore.loaders import SimDataset

from simstore.errors import InvalidInputError


def dataset(store, ref, **kw):
    kw.setdefault("shard_opener", open_test_shard)
    return SimDataset(store, ref, **kw)


def test_every_sample_once_with_its_content(small):
    store, ref, samples = small
    ds = dataset(store, ref)
    got = list(ds)
    assert sorted(s["__key__"] for s in got) == sorted(samples)
    for s in got:
        want = samples[s["__key__"]].fields
        assert isinstance(s["u"], torch.Tensor)
        assert np.array_equal(s["u"].numpy(), want["u"])
        assert np.array_equal(s["v"].numpy(), want["v"])
        assert int(s["step"]) == want["step"]
        assert s["name"] == want["name"]
        assert s["__pad__"] is False


def test_order_is_deterministic_in_seed_and_epoch(small):
    store, ref, _ = small
    a = [s["__key__"] for s in dataset(store, ref, seed=3)]
    b = [s["__key__"] for s in dataset(store, ref, seed=3)]
    assert a == b
    ds = dataset(store, ref, seed=3)
    ds.set_epoch(1)
    c = [s["__key__"] for s in ds]
    assert sorted(c) == sorted(a) and c != a
    d = [s["__key__"] for s in dataset(store, ref, seed=4)]
    assert d != a


def test_validation_mode_reads_in_key_order(small):
    store, ref, samples = small
    got = [s["__key__"] for s in dataset(store, ref, shuffle=False)]
    assert got == sorted(samples)


def test_projection_reads_only_requested_fields(small):
    store, ref, _ = small
    readers = []

    def opener(source):
        r = open_test_shard(source)
        readers.append(r)
        return r

    got = list(dataset(store, ref, fields=["u"], shard_opener=opener))
    assert set(got[0]) == {"u", "__key__", "__pad__"}
    assert readers and all(asked == ("u",) for r in readers for asked in r.fields_asked)
    assert sum(r.bytes_read for r in readers) == 60 * 8 * 4  # u only: 60 x 8 float32


def test_unknown_field_is_a_clear_error(small):
    store, ref, _ = small
    with pytest.raises(InvalidInputError, match="no field 'nope'"):
        dataset(store, ref, fields=["nope"])


def test_prefetch_takes_a_mapping_and_names_what_is_wrong(small):
    store, ref, samples = small
    got = list(dataset(store, ref, prefetch={"chunks": 2, "decode_threads": 1}))
    assert sorted(s["__key__"] for s in got) == sorted(samples)
    for bad, match in [
        ({"chunk": 2}, "prefetch: unknown field 'chunk'"),
        ({"chunks": "2"}, "prefetch: field 'chunks' must be an integer"),
        ({"chunks": 0}, "prefetch chunks must be at least 1"),
        ("deep", "prefetch must be a PrefetchConfig.*not str"),
        (True, "prefetch must be a PrefetchConfig.*not bool"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            dataset(store, ref, prefetch=bad)


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_ranks_split_an_epoch_exactly(store_path, world_size, remainder):
    samples = make_samples(43)
    commit_samples(store_path, "odd", samples, per_shard=7)
    per_rank = []
    real = []
    for r in range(world_size):
        ds = dataset(store_path, "odd", rank=r, world_size=world_size, remainder=remainder)
        got = list(ds)
        per_rank.append(len(got))
        assert len(ds) == len(got)
        real.extend(keys_of(got))
    assert len(set(per_rank)) == 1
    assert len(real) == len(set(real))
    if remainder == "pad":
        assert sorted(real) == sorted(s.key for s in samples)
    else:
        assert len(real) == 43 - 43 % world_size


def test_resume_in_process_across_epochs_twice(small):
    store, ref, samples = small
    ds = dataset(store, ref, seed=1)
    for epoch in range(3):
        ds.set_epoch(epoch)
        first = []
        it = iter(ds)
        for _ in range(7 + epoch):
            first.append(next(it)["__key__"])
        state = ds.state_dict()
        it.close()
        # resume in a fresh object, stop again, resume again
        ds2 = dataset(store, ref, seed=1)
        ds2.load_state_dict(state)
        it2 = iter(ds2)
        second = [next(it2)["__key__"] for _ in range(11)]
        state2 = ds2.state_dict()
        it2.close()
        ds3 = dataset(store, ref, seed=1)
        ds3.load_state_dict(state2)
        third = [s["__key__"] for s in ds3]
        seq = first + second + third
        assert sorted(seq) == sorted(samples)
        ref_ds = dataset(store, ref, seed=1)
        ref_ds.set_epoch(epoch)
        assert seq == [s["__key__"] for s in ref_ds]  # the same stream, resumed exactly
        assert ds3.state_dict()["remaining"] == []


def test_state_of_another_snapshot_is_refused(small, store_path):
    store, ref, _ = small
    state = dataset(store, ref).state_dict()
    commit_samples(store, "other", make_samples(5))
    with pytest.raises(InvalidInputError, match="snapshots"):
        dataset(store, "other").load_state_dict(state)


def test_state_of_another_shuffle_is_refused(small):
    store, ref, _ = small
    state = dataset(store, ref, window_shards=8).state_dict()
    with pytest.raises(InvalidInputError, match="order"):
        dataset(store, ref, window_shards=4).load_state_dict(state)
    with pytest.raises(InvalidInputError, match="order"):
        dataset(store, ref, shuffle_buffer_blocks=2).load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "order"}
    with pytest.raises(InvalidInputError, match="saved by a simstore before") as info:
        dataset(store, ref, window_shards=8).load_state_dict(older)
    assert "start the next epoch (set_epoch) without loading it" in str(info.value)
    dataset(store, ref, window_shards=8).load_state_dict(state)  # the same order: accepted


def test_shuffle_parameters_are_checked(small):
    store, ref, _ = small
    with pytest.raises(InvalidInputError, match="shuffle_buffer_blocks"):
        dataset(store, ref, shuffle_buffer_blocks=0)
    with pytest.raises(InvalidInputError, match="shuffle_block_bytes"):
        dataset(store, ref, shuffle_block_bytes="0MiB")


def test_set_epoch_keeps_a_resume_for_the_same_epoch(small):
    store, ref, _ = small
    ds = dataset(store, ref)
    ds.set_epoch(2)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    it.close()
    ds2 = dataset(store, ref)
    ds2.load_state_dict(state)
    ds2.set_epoch(2)  # a training loop calls this when it restarts the epoch
    assert len(list(ds2)) == 59
    ds2.set_epoch(3)
    assert len(list(ds2)) == 60


def _parts_side_by_side(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    import simstore.loaders._source as source_mod

    monkeypatch.setattr(source_mod, "_PARALLEL_PART_ROWS", 1 if on else 1 << 62)


def test_parts_read_side_by_side_give_the_same_stream(tmp_path, monkeypatch):
    store = str(tmp_path / "s")
    samples = make_samples(300, runs=6)
    commit_samples(store, "ds", samples, per_shard=25, target_rows=16)
    epochs = []
    for on in (False, True):
        _parts_side_by_side(monkeypatch, on)
        ds = SimDataset(store, "ds@main", shuffle=True, seed=4, shard_opener=open_test_shard)
        assert len(ds._sources[0].part_ids) >= 8  # groups of several parts
        ds.set_epoch(1)
        epochs.append(keys_of(ds))
    assert epochs[0] == epochs[1]
    assert sorted(epochs[1]) == sorted(s.key for s in samples)


def test_parts_read_side_by_side_name_the_first_damaged_part(tmp_path, monkeypatch):
    import os

    from simstore.errors import SimstoreError
    from simstore.hashing import object_key

    store = str(tmp_path / "s")
    commit_samples(store, "ds", make_samples(300, runs=6), per_shard=25, target_rows=16)
    _parts_side_by_side(monkeypatch, True)
    ds = SimDataset(store, "ds@main", shuffle=True, seed=4, shard_opener=open_test_shard)
    src = ds._sources[0]
    group = [src.part_ids[p].decode() for p in src.layout(0).parts_of(0)]
    assert len(group) > 2
    for part in group[1:]:  # every part but the first of the first group
        path = os.path.join(store, object_key(part))
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(SimstoreError) as info:
        next(iter(ds))
    assert group[1] in str(info.value)
    assert not any(p in str(info.value) for p in group[2:])


@pytest.mark.parametrize("batch_size", [None, 4, 5])
def test_sample_bytes_count_delivered_fields_only(small, batch_size):
    """stats()'s sample_bytes (and so mib_per_s and the run report) count the fields of
    the samples delivered: not the padding a short rank gets, not the keys."""
    from simstore.loaders import SimDataLoader
    from simstore.loaders._tensors import value_bytes

    store, ref, samples = small  # 60 samples: 7 ranks of 9, 3 of them padding on rank 6
    expected = 0
    ds = SimDataset(store, ref, rank=6, world_size=7, shard_opener=open_test_shard)
    for s in ds:
        if not s["__pad__"]:
            expected += sum(value_bytes(v) for k, v in s.items() if not k.startswith("__"))
    ds = SimDataset(store, ref, rank=6, world_size=7, shard_opener=open_test_shard)
    pads = 0
    for b in SimDataLoader(ds, batch_size=batch_size):
        pads += int(b["__pad__"].sum()) if batch_size else int(b["__pad__"])
    assert pads == ds.stats()["pad_samples"] > 0
    assert ds.report()["sample_bytes"] == expected
