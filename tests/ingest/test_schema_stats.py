"""Schema evolution across snapshots, and exact field statistics versioned with the data."""

import numpy as np
import pytest

from simstore.catalog import Catalog
from simstore.ingest import ingest
from simstore.stats import (
    StatsAccumulator,
    field_table,
    merge_field_stats,
    normalisation,
    std_of,
    summarise_array,
)


def test_new_fields_and_kinds_in_later_snapshots_read_as_missing_in_older_samples(
    catalog, tmp_path, read
):
    first = tmp_path / "v1"
    first.mkdir()
    np.savez(first / "a.npz", u=np.ones((3, 3), np.float32))
    ingest([first], dataset="d", store=catalog, snapshot=True)
    second = tmp_path / "v2"
    second.mkdir()
    np.savez(second / "b.npz", u=np.zeros((3, 3), np.float32), v=np.arange(4), label=np.array("hi"))
    r = ingest([second], dataset="d", store=catalog, snapshot=True)
    snap, got = read(catalog, "d")
    assert {s.name: s.kind for s in snap.schema} == {
        "u": "tensor",
        "v": "tensor",
        "label": "string",
    }
    assert sorted(got["a"]) == ["u"]  # older sample: the new fields are missing
    assert sorted(got["b"]) == ["label", "u", "v"] and got["b"]["label"] == "hi"
    assert catalog.snapshot(r.snapshot_id).stats["exact"] is True


def test_allowed_type_change_within_one_run_starts_a_new_shard(catalog, tmp_path, read):
    root = tmp_path / "src"
    root.mkdir()
    np.savez(root / "a.npz", u=np.ones(4, np.float32))
    np.savez(root / "b.npz", u=np.ones(4, np.float64))
    r = ingest([root], dataset="d", store=catalog, snapshot=True, allow_schema_change=True)
    snap, got = read(catalog, "d")
    assert got["a"]["u"].dtype == np.float32 and got["b"]["u"].dtype == np.float64
    assert len(set(catalog.manifest(snap).column("shard").to_pylist())) == 2
    assert {s.name: s.dtype for s in r.schema}["u"] == "float64"


def test_snapshot_statistics_are_exact_over_the_whole_revision(catalog, npz_dir):
    root, arrays = npz_dir
    r = ingest([root], dataset="d", store=catalog, snapshot=True, shard_size=4096)
    snap = catalog.snapshot(r.snapshot_id)
    assert snap.stats["exact"] is True
    u = np.concatenate([a["u"].astype(np.float64).ravel() for a in arrays.values()])
    s = snap.stats["fields"]["u"]
    assert s["count"] == [u.size]
    assert s["mean"][0] == pytest.approx(u.mean(), rel=1e-12)
    assert std_of(s)[0] == pytest.approx(u.std(), rel=1e-12)
    assert (s["min"][0], s["max"][0]) == (pytest.approx(u.min()), pytest.approx(u.max()))
    # fortran (3 x 4) is not a vector field (4 > 3? no: 4 components); check per component
    f = np.stack([a["fortran"] for a in arrays.values()])  # (6, 3, 4)
    fs = snap.stats["fields"]["fortran"]
    assert fs["components"] == 4
    np.testing.assert_allclose(fs["mean"], f.reshape(-1, 4).mean(axis=0), rtol=1e-12)
    mean, std = normalisation(snap)["fortran"]
    np.testing.assert_allclose(std, f.reshape(-1, 4).std(axis=0), rtol=1e-12)
    assert mean.shape == std.shape == (4,)


def test_adding_files_merges_statistics_without_reading_old_shards(tmp_path, npz_dir):
    root, arrays = npz_dir

    class Recording:
        """An ObjectStore wrapper recording the keys read."""

        def __init__(self, inner):
            self.inner, self.gets = inner, []

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def get(self, key, byte_range=None):
            self.gets.append(key)
            return self.inner.get(key, byte_range)

        def local_path(self, key):
            self.gets.append(key)
            return self.inner.local_path(key)

    store = Recording(Catalog.init(str(tmp_path / "s")).store)
    cat = Catalog(store)
    first = ingest([root / "sub"], dataset="d", store=cat, snapshot=True)
    old_shards = set(cat.manifest(cat.snapshot(first.snapshot_id)).column("shard").to_pylist())
    store.gets.clear()
    more = tmp_path / "more"
    more.mkdir()
    for name in ("run0", "run1"):
        np.savez(more / f"{name}.npz", **arrays[name])
    second = ingest([more], dataset="d", store=cat, snapshot=True)
    assert not {k.rsplit("/", 1)[-1] for k in store.gets} & old_shards
    snap = cat.snapshot(second.snapshot_id)
    assert snap.stats["exact"] is True
    u = np.concatenate(
        [
            arrays[k]["u"].astype(np.float64).ravel()
            for k in ("sub/run4", "sub/run5", "run0", "run1")
        ]
    )
    s = snap.stats["fields"]["u"]
    assert s["count"] == [u.size] and s["mean"][0] == pytest.approx(u.mean(), rel=1e-12)


def test_vector_fields_get_per_component_statistics():
    acc = StatsAccumulator()
    v = np.stack([np.arange(10.0), -np.arange(10.0), np.full(10, 3.0)], axis=-1)
    acc.add_array("points", v[:4])
    acc.add_array("points", v[4:])
    s = acc.to_json()["points"]
    assert s["components"] == 3 and s["count"] == [10, 10, 10]
    assert s["mean"] == pytest.approx([4.5, -4.5, 3.0])
    assert s["min"] == [0.0, -9.0, 3.0] and s["max"] == [9.0, 0.0, 3.0]
    assert std_of(s)[2] == 0.0


def test_merge_is_exact_in_any_split_and_counts_nan_and_inf_apart():
    rng = np.random.default_rng(3)
    x = rng.normal(5, 2, 1000)
    x[[3, 50]] = np.nan
    x[7] = np.inf
    whole = summarise_array(x.reshape(-1, 1), components=1)
    parts = [summarise_array(p.reshape(-1, 1), components=1) for p in np.array_split(x, 7)]
    merged = parts[0]
    for p in parts[1:]:
        merged = merge_field_stats(merged, p)
    finite = x[np.isfinite(x)]
    for s in (whole, merged):
        assert s["count"] == [finite.size] and s["nan_count"] == [2] and s["inf_count"] == [1]
        assert s["mean"][0] == pytest.approx(finite.mean(), rel=1e-12)
        assert std_of(s)[0] == pytest.approx(finite.std(), rel=1e-10)


def test_mismatched_components_collapse_exactly():
    a = summarise_array(np.arange(6.0).reshape(3, 2))
    b = summarise_array(np.arange(4.0).reshape(4, 1), components=1)
    m = merge_field_stats(a, b)
    allv = np.concatenate([np.arange(6.0), np.arange(4.0)])
    assert m["components"] == 1 and m["count"] == [10]
    assert m["mean"][0] == pytest.approx(allv.mean())


def test_normalisation_guards_zero_std_and_empty_components():
    stats = {
        "fields": {
            "c": summarise_array(np.full((4, 1), 2.0), components=1),
            "e": summarise_array(np.full((2, 1), np.nan), components=1),
        }
    }
    norm = normalisation(stats)
    assert norm["c"][0].tolist() == [2.0] and norm["c"][1].tolist() == [1.0]
    assert norm["e"][0].tolist() == [0.0] and norm["e"][1].tolist() == [1.0]
    rows = field_table(stats)
    assert [r["field"] for r in rows] == ["c", "e"] and rows[1]["mean"] is None


def test_scalar_parameters_have_statistics(catalog, h5_dir):
    root, _ = h5_dir
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    s = catalog.snapshot(r.snapshot_id).stats["fields"]["Re"]
    assert s["count"] == [3] and s["mean"] == [250.0]


def test_interleaved_new_keys_keep_statistics_exact(catalog, tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    for name in ("run0", "run2", "run4"):
        np.savez(a / f"{name}.npz", u=np.ones(3, np.float32))
    ingest([a], dataset="d", store=catalog, snapshot=True)
    b = tmp_path / "b"
    b.mkdir()
    for name in ("run1", "run3"):  # between existing keys, inside the part's key range
        np.savez(b / f"{name}.npz", u=np.full(3, 2.0, np.float32))
    r = ingest([b], dataset="d", store=catalog, snapshot=True)
    snap = catalog.snapshot(r.snapshot_id)
    assert snap.stats["exact"] is True
    assert snap.stats["fields"]["u"]["count"] == [15]
    assert snap.stats["fields"]["u"]["mean"] == [pytest.approx(1.4)]
