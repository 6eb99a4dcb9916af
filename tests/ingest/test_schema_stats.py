"""Schema evolution across snapshots, and exact field statistics versioned with the data."""

import numpy as np
import pytest

import simstore.stats as stats_module
from simstore.catalog import Catalog
from simstore.errors import InvalidInputError, SourceError
from simstore.ingest import ingest
from simstore.stats import (
    StatsAccumulator,
    field_table,
    merge_field_stats,
    normalisation,
    std_of,
    summarise_array,
    summarise_scalar,
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

        def get(self, key, byte_range=None, *, max_bytes=None):
            self.gets.append(key)
            return self.inner.get(key, byte_range, max_bytes=max_bytes)

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


def test_a_constant_normalises_to_zero_though_its_mean_and_std_are_rounded():
    # the mean of 0.1 taken 1,000 times is 0.10000000000000002 and its std 1.4e-17:
    # applied, they made the constant -1; its exact bounds say it is one
    parts = [summarise_array(np.full((1000, 1), 0.1), components=1) for _ in range(3)]
    merged = merge_field_stats(merge_field_stats(parts[0], parts[1]), parts[2])
    assert merged["min"] == merged["max"] == [0.1]
    assert std_of(merged)[0] != 0.0  # rounding left a spread
    vec = summarise_array(np.stack([np.full(10, 0.3), np.arange(10.0)], axis=1))
    norm = normalisation({"fields": {"m": merged, "v": vec}})
    assert norm["m"][0].tolist() == [0.1] and norm["m"][1].tolist() == [1.0]
    assert ((np.full(5, 0.1) - norm["m"][0]) / norm["m"][1]).tolist() == [0.0] * 5
    assert norm["v"][0][0] == 0.3 and norm["v"][1][0] == 1.0  # per component
    assert norm["v"][1][1] == pytest.approx(np.arange(10.0).std())


def test_merged_spread_saturates_only_where_the_true_one_does():
    # two parts 1e150 apart: delta**2 * ca * cb overflowed before the division by n
    a = summarise_array(np.full((20_000, 1), 0.0), components=1)
    b = summarise_array(np.full((20_000, 1), 1e150), components=1)
    merged = merge_field_stats(a, b)
    true_m2 = np.concatenate([np.zeros(20_000), np.full(20_000, 1e150)]).var() * 40_000
    assert merged["m2"][0] == pytest.approx(true_m2, rel=1e-12)
    # and the usual case is computed as it always was (the stored bytes do not change)
    c = summarise_array(np.arange(7.0).reshape(-1, 1), components=1)
    d = summarise_array(np.arange(7.0, 19.0).reshape(-1, 1), components=1)
    delta = d["mean"][0] - c["mean"][0]
    assert merge_field_stats(c, d)["m2"][0] == c["m2"][0] + d["m2"][0] + delta * delta * 7 * 12 / 19


def test_a_negative_zero_scalar_is_written_as_a_positive_zero():
    s = summarise_scalar(-0.0)
    assert str(s["min"][0]) == "0.0" and str(s["max"][0]) == "0.0"
    assert str(summarise_scalar(np.float32(-0.0))["min"][0]) == "0.0"


def test_a_field_with_only_empty_arrays_normalises_to_zero_and_one(catalog, tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for name in ("a", "b"):
        np.savez(root / f"{name}.npz", e=np.zeros(0, np.float32), x=np.full(3, 5.0))
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    snap = catalog.snapshot(r.snapshot_id)
    assert {s.name for s in snap.schema} == {"e", "x"}
    norm = normalisation(snap)
    assert norm["e"][0].tolist() == [0.0] and norm["e"][1].tolist() == [1.0]
    assert normalisation(snap, ["e"]).keys() == {"e"}
    # zero spread: std 1, and the mean is kept, so (x - mean) / std is 0, not x
    assert norm["x"][0].tolist() == [5.0] and norm["x"][1].tolist() == [1.0]
    assert ((np.full(3, 5.0) - norm["x"][0]) / norm["x"][1]).tolist() == [0.0] * 3


def test_normalisation_refuses_inexact_statistics_unless_asked(catalog, tmp_path):
    """An overwrite leaves the old sample's values in the merged statistics: constants
    from them would silently include a run the snapshot no longer has."""
    root = tmp_path / "src"
    root.mkdir()
    np.savez(root / "a.npz", u=np.full(100, 1000.0))
    np.savez(root / "b.npz", u=np.full(100, 1.0))
    ingest([root], dataset="d", store=catalog, snapshot=True)
    np.savez(root / "a.npz", u=np.full(100, 1.0))  # the bad run, fixed
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    snap = catalog.snapshot(r.snapshot_id)
    assert snap.stats["exact"] is False
    with pytest.raises(InvalidInputError, match=f"snapshot {r.snapshot_id}: statistics are "
                                                "not exact .* --mode replace"):
        normalisation(snap)
    assert normalisation(snap, allow_inexact=True)["u"][0].tolist() == [334.0]
    r = ingest([root], dataset="d", store=catalog, snapshot=True, mode="replace")
    assert normalisation(catalog.snapshot(r.snapshot_id))["u"][0].tolist() == [1.0]


def test_a_file_that_breaks_a_staged_entrys_types_is_refused_at_ingest(catalog, tmp_path):
    """Two ingests staged without --snapshot, the second changing a field's dtype: it
    was accepted, and the commit of both then failed naming only a staged entry."""
    for name, dtype in (("a", np.float32), ("b", np.int64)):
        (tmp_path / name).mkdir()
        np.savez(tmp_path / name / f"{name}.npz", n=np.ones(4, dtype=dtype))
    ingest([tmp_path / "a"], dataset="d", store=catalog)  # staged only
    with pytest.raises(SourceError, match="b.npz: field 'n' changes type from tensor "
                                          "float32 rank 1 to tensor int64 rank 1"):
        ingest([tmp_path / "b"], dataset="d", store=catalog)
    assert len(catalog.staged("d")) == 1
    ingest([tmp_path / "b"], dataset="d", store=catalog, allow_schema_change=True)
    sid = catalog.commit("d", message="both", allow_schema_change=True).snapshot_id
    assert {s.name: s.dtype for s in catalog.snapshot(sid).schema} == {"n": "int64"}


def test_a_field_no_longer_numeric_has_no_constants(catalog, tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    np.savez(root / "a.npz", u=np.ones(3), w=np.float64(0.5))
    ingest([root], dataset="d", store=catalog, snapshot=True)
    (root / "a.npz").unlink()
    np.savez(root / "b.npz", u=np.ones(3), w=np.str_("laminar"))
    r = ingest([root], dataset="d", store=catalog, snapshot=True, allow_schema_change=True)
    snap = catalog.snapshot(r.snapshot_id)
    assert {s.name: s.kind for s in snap.schema}["w"] == "string"
    assert normalisation(snap).keys() == {"u"}
    assert [row["field"] for row in field_table(snap)] == ["u"]


def test_scalar_parameters_have_statistics(catalog, h5_dir):
    root, _ = h5_dir
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    s = catalog.snapshot(r.snapshot_id).stats["fields"]["Re"]
    assert s["count"] == [3] and s["mean"] == [250.0]


H5_NON_FINITE = {  # HDF5 attribute: (little-endian bytes, dtype)
    "drag": ("000000000000f8ff", "float64"),  # 0.0 / 0.0 on x86: the sign bit set
    "lift": ("0000c0ff", "float32"),  # np.float32(-np.nan)
    "tag": ("2100c07f", "float32"),  # a NaN with a payload
    "top": ("000000000000f07f", "float64"),
    "bottom": ("000080ff", "float32"),
}


@pytest.mark.parametrize("fmt", ["zarr", "parquet"])
def test_non_finite_scalar_parameters_read_back_bit_for_bit(catalog, tmp_path, read, fmt):
    """A NaN's sign and payload and the infinities of HDF5 attributes come back exactly,
    through the shard reader and SimDataset, and the read samples hash to the manifest's
    sample_hash (a Zarr shard gave back float("nan") for every NaN)."""
    import h5py
    import torch
    from simstore.loaders import SimDataset

    from simstore.sample import Sample, hash_sample

    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        with h5py.File(src / f"run{i}.h5", "w") as f:
            for name, (raw, dtype) in H5_NON_FINITE.items():
                f.attrs[name] = np.frombuffer(bytes.fromhex(raw), dtype=dtype)[0]
            f.create_dataset("u", data=np.full((3, 4), i, np.float32))
    r = ingest([src], dataset="d", store=catalog, snapshot=True, format=fmt)
    snap, samples = read(catalog, f"d@{r.snapshot_id}")
    hashes = {row["key"]: row["sample_hash"].hex() for row in catalog.manifest(snap).to_pylist()}
    assert sorted(samples) == ["run0.h5", "run1.h5"]
    for key, fields in samples.items():
        for name, (raw, dtype) in H5_NON_FINITE.items():
            assert np.asarray(fields[name], dtype=dtype).tobytes().hex() == raw, (key, name)
        assert hash_sample(Sample(key, fields)) == hashes[key]
    items = list(SimDataset(catalog.store.url, f"d@{r.snapshot_id}", shuffle=False))
    assert len(items) == 2
    for item in items:
        for name, (raw, dtype) in H5_NON_FINITE.items():
            value = item[name]
            assert isinstance(value, torch.Tensor) and str(value.dtype) == f"torch.{dtype}"
            assert value.numpy().tobytes().hex() == raw, (item["__key__"], name)


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


def _reference(values, k):
    """Summary fields computed plainly in float64 over finite values, per component."""
    cols = np.asarray(values).astype(np.float64).reshape(-1, k)
    out = []
    for j in range(k):
        c = cols[:, j]
        fin = c[np.isfinite(c)]
        out.append((fin.size, int(np.isnan(c).sum()), int(np.isinf(c).sum()), fin))
    return out


@pytest.fixture(params=["default", "small"])
def sub_blocks(request, monkeypatch):
    """Summaries with the default sub-blocks and with small ones (many sub-blocks per
    array: their moments merge at the end, and a NaN lands in a sub-block of its own)."""
    if request.param == "small":
        monkeypatch.setattr(stats_module, "_SUB_BLOCK_ELEMENTS", 1 << 14)
    return request.param


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        (np.float32, (600_003,)),  # sub-blocks and a ragged tail with either size  # several sub-blocks and a ragged tail, one component
        (np.float32, (70_001, 3)),  # vector field: per-component sums over a transposed copy
        (np.float64, (9_000, 2, 2)),
        (np.float16, (40_000, 9)),
        (np.int64, (150_000,)),  # min/max beyond float64's exact integers stay exact
        (np.uint8, (100_000, 4)),
        (np.bool_, (123_457,)),
    ],
)
def test_summaries_equal_a_plain_float64_computation(dtype, shape, sub_blocks):
    rng = np.random.default_rng(7)
    if dtype == np.int64:
        x = rng.integers(-(2**62), 2**62, size=shape, dtype=np.int64)
        x[5] = 2**63 - 1  # not representable in float64: min/max must stay exact
    elif dtype == np.uint8:
        x = rng.integers(0, 256, size=shape, dtype=np.uint8)
    elif dtype == np.bool_:
        x = rng.random(shape) < 0.3
    else:
        x = (rng.standard_normal(shape) * 3 + 300).astype(dtype)
    s = summarise_array(x)
    k = s["components"]
    assert k == (shape[-1] if len(shape) >= 2 and 2 <= shape[-1] <= 9 else 1)
    flat = x.reshape(-1, k)
    for j, (count, nan, inf, fin) in enumerate(_reference(x, k)):
        assert (s["count"][j], s["nan_count"][j], s["inf_count"][j]) == (count, nan, inf)
        assert s["mean"][j] == pytest.approx(fin.mean(), rel=1e-12, abs=1e-12)
        assert s["m2"][j] == pytest.approx(((fin - fin.mean()) ** 2).sum(), rel=1e-10, abs=1e-9)
        lo, hi = flat[:, j].min(), flat[:, j].max()
        assert s["min"][j] == (int(lo) if x.dtype.kind in "biu" else lo)
        assert s["max"][j] == (int(hi) if x.dtype.kind in "biu" else hi)
        assert type(s["min"][j]) is (int if x.dtype.kind in "biu" else float)


def test_non_finite_and_overflowing_sub_blocks_are_summarised_the_careful_way(sub_blocks):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((150_000, 2))
    x[70_000, 1] = np.nan  # a NaN in the second sub-block
    x[140_000, 0] = -np.inf  # an Inf in the third
    s = summarise_array(x)
    ref = _reference(x, 2)
    assert s["nan_count"] == [0, 1] and s["inf_count"] == [1, 0]
    assert s["count"] == [ref[0][0], ref[1][0]]
    for j in range(2):
        assert s["mean"][j] == pytest.approx(ref[j][3].mean(), rel=1e-12)
        assert std_of(s)[j] == pytest.approx(ref[j][3].std(), rel=1e-10)
    # finite values whose moments overflow float64 saturate instead of giving inf/NaN
    big = np.full(100_000, 1e308)
    big[::2] = -1e308
    b = summarise_array(big)
    assert b["count"] == [100_000] and b["mean"][0] == pytest.approx(0.0, abs=1e296)
    assert np.isfinite(b["m2"][0]) and b["min"] == [-1e308] and b["max"] == [1e308]


@pytest.mark.parametrize(
    "value",
    [True, np.bool_(False), 7, -(2**63), np.int32(-4), np.uint64(2**64 - 1), 2.5, np.float32(0.1)],
)
def test_scalar_summaries_keep_the_value_and_its_type(value):
    s = summarise_scalar(value)
    want = int(value) if isinstance(value, bool | int | np.integer | np.bool_) else float(value)
    assert s["count"] == [1] and s["m2"] == [0.0] and s["mean"] == [float(want)]
    assert s["min"] == [want] and s["max"] == [want] and type(s["min"][0]) is type(want)
    nan = summarise_scalar(float("nan"))
    assert nan["count"] == [0] and nan["nan_count"] == [1] and nan["min"] == [None]


def test_a_signalling_nan_is_counted_without_a_warning():
    import warnings

    values = np.array([1.0, 2.0, 3.0], np.float32)
    values.view(np.uint32)[1] = 0x7F800001  # a signalling NaN: its cast to float64 sets "invalid"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = summarise_array(values)
    assert summary["nan_count"] == [1] and summary["count"] == [2]
    assert summary["mean"] == [2.0]
