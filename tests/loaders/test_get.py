"""``SimDataset.get`` / ``get_many``: one sample by key, as the stream would yield it.

Checked against the stream itself: for every shard format, with a field projection, a
transform, normalisation and a window; and that only the manifest part holding a key is
read, damage is an error naming the shard, and bad keys are one-line errors.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from loader_helpers import commit_samples, make_samples, refused
from simstore.loaders import SimDataset

import simstore
from simstore.catalog import Catalog
from simstore.errors import IntegrityError, NotFoundError
from simstore.hashing import object_key


def _stream(ds: SimDataset) -> dict[str, dict]:
    return {s["__key__"]: s for s in ds}


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name, value in a.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(b[name], torch.Tensor), name
            assert value.dtype == b[name].dtype and value.shape == b[name].shape, name
            assert torch.equal(value, b[name]), name
        else:
            assert value == b[name], name


@pytest.fixture(scope="module", params=["parquet", "zarr", "lance"])
def ingested(request, tmp_path_factory):
    """Dataset ``d`` of 12 .npz runs (a (4, 6) float32 field, an int vector, a scalar)
    ingested into several shards of one format."""
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(3)
    for i in range(12):
        np.savez(root / f"r{i:02d}.npz", u=rng.standard_normal((4, 6)).astype(np.float32),
                 n=np.arange(i + 1, dtype=np.int64), p=np.float64(i) / 7)
    path = str(tmp_path_factory.mktemp("store") / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, format=request.param,
                    snapshot=True, message="t", shard_size=600)
    return path


def test_get_equals_the_streamed_sample_in_every_format(ingested):
    ds = SimDataset(ingested, "d")
    streamed = _stream(ds)
    assert len(streamed) == 12
    for key in ["r00", "r07", "r11"]:
        _same(ds.get(key), streamed[key])
    many = ds.get_many(["r11", "r00", "r11"])
    assert [m["__key__"] for m in many] == ["r11", "r00", "r11"]
    _same(many[0], streamed["r11"])
    assert all(m["__pad__"] is False for m in many)
    assert ds.get_many([]) == []


def test_projection_and_transform_apply(ingested):
    def double(sample):
        sample["u"] = sample["u"] * 2
        return sample

    ds = SimDataset(ingested, "d", fields=["u"], transform=double)
    got = ds.get("r03")
    assert sorted(got) == ["__key__", "__pad__", "u"]
    _same(got, _stream(ds)["r03"])
    plain = SimDataset(ingested, "d").get("r03")
    assert torch.equal(got["u"], plain["u"] * 2)


def test_normalised_like_the_stream(ingested):
    ds = SimDataset(ingested, "d", fields=["u", "p"], normalise=["u"])
    got = ds.get("r05")
    _same(got, _stream(ds)["r05"])
    assert not torch.equal(got["u"], SimDataset(ingested, "d").get("r05")["u"])


def test_a_window_is_drawn_for_the_current_epoch(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.savez(root / f"r{i}.npz", u=rng.standard_normal((32, 8)).astype(np.float32))
    path = str(tmp_path / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, format="zarr", snapshot=True,
                    message="t")
    ds = SimDataset(path, "d", window={"u": 5}, seed=4)
    for epoch in (0, 3):
        ds.set_epoch(epoch)
        got = ds.get("r2")
        assert got["u"].shape == (5, 8)
        _same(got, _stream(ds)["r2"])


def test_only_the_part_holding_the_key_is_read(tmp_path):
    store = str(tmp_path / "s")
    samples = make_samples(200)
    commit_samples(store, "sim", samples, per_shard=20, target_rows=16)
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("sim"))
    assert len(snap.parts) >= 4
    ds = SimDataset(store, "sim", shard_opener=_opener())
    key = samples[137].key
    holder = next(p for p in snap.parts if p.first_key <= key <= p.last_key)
    for part in snap.parts:  # every other part gone: get must not need them
        if part.id != holder.id:
            os.remove(cat.store.local_path(object_key(part.id)))
    got = ds.get(key)
    assert got["__key__"] == key
    np.testing.assert_array_equal(got["u"].numpy(), samples[137].fields["u"])
    assert got["step"].item() == samples[137].fields["step"]
    other = next(s.key for s in samples if not holder.first_key <= s.key <= holder.last_key)
    with pytest.raises(IntegrityError, match="is missing"):
        ds.get(other)


def _opener():
    from loader_helpers import open_test_shard

    return open_test_shard


def test_missing_and_bad_keys(small):
    store, ref, samples = small
    ds = SimDataset(store, ref, shard_opener=_opener())
    with pytest.raises(NotFoundError, match=r"has no sample 'nope'$") as info:
        ds.get("nope")
    assert isinstance(info.value, LookupError)
    first = sorted(samples)[0]
    with pytest.raises(NotFoundError, match=r"has no sample 'a' \(and 1 more\)"):
        ds.get_many(["a", first, "zzz"])
    refused("a sample key is a string, got 3", ds.get, 3)
    refused("keys must be a sequence of strings", ds.get_many, "run000/t00000")
    refused("a sample key is a string, got int", ds.get_many, [first, 5])


def test_a_mixture_has_no_keys_of_its_own(small):
    store, ref, samples = small
    a = SimDataset(store, ref, shard_opener=_opener())
    b = SimDataset(store, ref, shard_opener=_opener(), seed=1)
    mix = SimDataset.mix([a, b], weights=[1, 1])
    refused("call it on a member of the mixture", mix.get, sorted(samples)[0])


def test_a_damaged_shard_is_an_error_naming_it(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(3):
        np.savez(root / f"r{i}.npz", u=np.full((64, 64), i, dtype=np.float32))
    path = str(tmp_path / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, format="zarr", snapshot=True,
                    message="t")
    cat = Catalog.open(path)
    (shard,) = {r["shard"] for r in cat.manifest(cat.snapshot(cat.resolve("d"))).to_pylist()}
    p = cat.store.local_path(object_key(shard))
    os.chmod(p, 0o644)
    with open(p, "r+b") as f:
        f.seek(os.path.getsize(p) // 3)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))
    ds = SimDataset(path, "d", verify_every_s=0)
    with pytest.raises(IntegrityError, match=shard):
        ds.get("r1")


@pytest.mark.parametrize("cached", [False, True])
def test_a_remote_store_ranged_or_through_the_cache(tmp_path, cached):
    root = tmp_path / "src"
    root.mkdir()
    rng = np.random.default_rng(5)
    for i in range(5):
        np.savez(root / f"r{i}.npz", u=rng.standard_normal((16, 16)).astype(np.float32))
    url = f"memory://get-remote-{int(cached)}"
    cat = Catalog.init(url)
    try:
        simstore.ingest([str(root)], dataset="d", store=cat, format="parquet",
                        snapshot=True, message="t", workers=1)
        cache = str(tmp_path / "cache") if cached else None
        ds = SimDataset(cat.store, "d", cache_dir=cache)
        streamed = _stream(ds)
        _same(ds.get("r4"), streamed["r4"])
        assert (tmp_path / "cache").exists() == cached
    finally:
        for key in list(cat.store.list()):
            cat.store.delete(key)


def _four_runs(tmp_path):
    """A store ``s`` of dataset ``d``: four samples ``r0``-``r3`` (``u = [i, i, i]``), in
    shards of 200 bytes; ``(sources folder, store path)``."""
    root = tmp_path / "src"
    root.mkdir()
    for i in range(4):
        np.savez(root / f"r{i}.npz", u=np.full(3, i, dtype=np.float32))
    path = str(tmp_path / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, snapshot=True, message="t",
                    shard_size=200)
    return root, path


def test_a_job_whose_snapshot_gc_collected_is_told_so_not_sent_to_look_for_damage(tmp_path):
    """Found by an audit: a job reads a snapshot whose last branch is deleted, and gc
    collects it; the job's error called the missing shard damage (as ``verify`` reports
    it), though ``verify`` of the store is clean then. It says the snapshot is gone."""
    from click.testing import CliRunner
    from simstore.cli import main

    root, path = _four_runs(tmp_path)
    run = CliRunner()
    assert run.invoke(main, ["--store", path, "branch", "d@main", "exp"]).exit_code == 0
    for i in range(4):
        np.savez(root / f"r{i}.npz", u=np.full(3, 10 + i, dtype=np.float32))
    simstore.ingest([str(root)], dataset="d", store=path, branch="exp", mode="replace",
                    snapshot=True, message="t2", shard_size=200)
    ds = SimDataset(path, "d@exp")  # pinned
    sid = ds.snapshot_id
    assert run.invoke(main, ["--store", path, "branch", "d@exp", "exp", "--delete"]).exit_code == 0
    assert run.invoke(main, ["--store", path, "gc", "--grace", "0s"]).exit_code == 0
    assert run.invoke(main, ["--store", path, "verify", "--all"]).exit_code == 0
    with pytest.raises(IntegrityError) as info:
        list(ds)
    text = str(info.value)
    assert f"referenced by snapshot {sid}, which is not in the store either" in text
    assert "gc collected it" in text and "\n" not in text


def test_a_missing_shard_is_damage_not_a_missing_key(tmp_path):
    # NotFoundError (a LookupError, exit 3) says a key or ref is unknown; a shard the
    # snapshot names but the store lacks is damage, as verify reports it (exit 6)
    from click.testing import CliRunner
    from simstore.cli import main
    from simstore.loaders import SimDataLoader

    root, path = _four_runs(tmp_path)
    cat = Catalog.open(path)
    sid = cat.resolve("d")
    rows = {r["key"]: r["shard"] for r in cat.manifest(cat.snapshot(sid)).to_pylist()}
    shard = rows["r1"]
    assert len(set(rows.values())) > 1
    os.remove(cat.store.local_path(object_key(shard)))
    want = rf"{object_key(shard)} is missing; referenced by snapshot {sid}"
    with pytest.raises(IntegrityError, match=want) as info:
        SimDataset(path, "d").get("r1")
    assert "either" not in str(info.value)  # the snapshot is there: damage
    with pytest.raises(IntegrityError, match=want):
        list(SimDataset(path, "d"))
    with pytest.raises(IntegrityError, match=want):
        list(SimDataLoader(SimDataset(path, "d"), batch_size=2, num_workers=2))
    intact = next(k for k, s in rows.items() if s != shard)
    assert SimDataset(path, "d").get(intact)["__key__"] == intact
    res = CliRunner().invoke(main, ["--store", path, "cat", "d", "r1"])
    assert res.exit_code == 6 and want.replace("\\", "") in res.output
    # a folder in the shard file's place (found by an audit): the same damage, not a
    # NotFoundError naming the store twice
    os.mkdir(os.path.join(path, object_key(shard)))
    for workers in (0, 2):
        with pytest.raises(IntegrityError, match=want):
            list(SimDataLoader(SimDataset(path, "d"), batch_size=2, num_workers=workers))
