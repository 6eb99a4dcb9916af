"""End to end: data ingested by simstore.ingest into real Parquet, Lance and Zarr shards."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from loader_helpers import RemoteLikeStore, corrupt_object, keys_of
from simstore.loaders import PrefetchConfig, SimDataLoader, SimDataset
from simstore.loaders._normalise import Normalise

import simstore
from simstore.catalog import Catalog
from simstore.errors import IntegrityError, InvalidInputError


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """24 .npz files in 3 runs: u is (16, 32, 32) float32 (64 KiB), p a scalar."""
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(0)
    arrays = {}
    for r in range(3):
        (root / f"run{r}").mkdir()
        for t in range(8):
            u = rng.standard_normal((16, 32, 32)).astype(np.float32)
            np.savez(root / f"run{r}" / f"t{t:03d}.npz", u=u, p=np.float64(t))
            arrays[f"run{r}/t{t:03d}"] = u
    return str(root), arrays


def ingested(tmp_path, sources, fmt, **options):
    root, arrays = sources
    store = str(tmp_path / f"store-{fmt}")
    Catalog.init(store)
    simstore.ingest([root], dataset="cfd", store=store, format=fmt, snapshot=True,
                    message="test", shard_size=600_000, **options)
    return store, arrays


@pytest.mark.parametrize("fmt", ["parquet", "lance", "zarr"])
def test_every_format_streams_exactly_with_its_content(tmp_path, sources, fmt):
    store, arrays = ingested(tmp_path, sources, fmt)
    loader = SimDataLoader(SimDataset(store, "cfd", rank=1, world_size=2), batch_size=4)
    other = SimDataLoader(SimDataset(store, "cfd", rank=0, world_size=2), batch_size=4)
    seen = {}
    for batch in [*loader, *other]:
        assert batch["u"].shape[1:] == (16, 32, 32) and batch["u"].dtype == torch.float32
        for k, u in zip(batch["__key__"], batch["u"], strict=True):
            seen[k] = u.numpy()
    assert sorted(seen) == sorted(arrays)
    for k, u in seen.items():
        assert np.array_equal(u, arrays[k])


def test_parquet_projection_reads_only_the_requested_column(tmp_path, sources):
    store, _ = ingested(tmp_path, sources, "parquet")
    remote = RemoteLikeStore(store)
    block = PrefetchConfig(range_block_bytes=4096)
    full = SimDataset(remote, "cfd", prefetch=block)
    list(full)
    only_p = SimDataset(remote, "cfd", fields=["p"], prefetch=block)
    got = list(only_p)
    assert set(got[0]) == {"p", "__key__", "__pad__"}
    full_bytes = full.stats()["tiers"]["fake-remote"]["bytes"]
    p_bytes = only_p.stats()["tiers"]["fake-remote"]["bytes"]
    assert p_bytes < 0.2 * full_bytes


def test_zarr_crops_and_windows_read_only_their_chunks(tmp_path, sources):
    store, arrays = ingested(tmp_path, sources, "zarr", chunks={"u": (4, 32, 32)},
                             compression="none")
    remote = RemoteLikeStore(store)
    block = PrefetchConfig(range_block_bytes=1024)
    crop = SimDataset(remote, "cfd", fields=["u"], crop={"u": (4, 8)}, prefetch=block)
    whole = SimDataset(remote, "cfd", fields=["u"], prefetch=block)
    for s in crop:
        assert np.array_equal(s["u"].numpy(), arrays[s["__key__"]][4:8])
    list(whole)
    crop_bytes = crop.stats()["tiers"]["fake-remote"]["bytes"]
    whole_bytes = whole.stats()["tiers"]["fake-remote"]["bytes"]
    assert crop_bytes < 0.6 * whole_bytes
    win = SimDataset(store, "cfd", window={"u": (5, None, 4)}, seed=3)
    first = {s["__key__"]: s["u"].numpy() for s in win}
    again = {s["__key__"]: s["u"].numpy() for s in SimDataset(store, "cfd",
                                                              window={"u": (5, None, 4)}, seed=3)}
    offsets = set()
    for k, u in first.items():
        assert u.shape == (5, 32, 4) and np.array_equal(u, again[k])
        src = arrays[k]
        hits = [(t, x) for t in range(12) for x in range(29)
                if np.array_equal(src[t : t + 5, :, x : x + 4], u)]
        assert hits
        offsets.add(hits[0])
    assert len(offsets) > 1  # windows move from sample to sample


def test_regions_and_fields_that_do_not_fit_are_refused(tmp_path, sources):
    store, arrays = ingested(tmp_path, sources, "zarr", chunks={"u": (4, 32, 32)},
                             compression="none")
    with pytest.raises(InvalidInputError, match="'u', which fields= does not read"):
        SimDataset(store, "cfd", fields=["p"], window={"u": 3})
    with pytest.raises(InvalidInputError, match="'u', which fields= does not read"):
        SimDataset(store, "cfd", fields=["p"], crop={"u": (0, 2)})
    with pytest.raises(InvalidInputError, match="not the string 'up'"):
        SimDataset(store, "cfd", fields="up")
    for crop in [(10, 20), slice(16, None), slice(-17, None)]:  # the arrays have 16 rows
        with pytest.raises(InvalidInputError, match="crop of 'u' .* runs past the array of "
                                                    "sample 'run0/t000' \\(shape \\(16, 32, 32"):
            list(SimDataset(store, "cfd", fields=["u"], crop={"u": crop}, shuffle=False))
    whole = [s["u"].numpy() for s in SimDataset(store, "cfd", fields=["u"], shuffle=False,
                                                crop={"u": [(0, 16), (-32, None)]})]
    assert np.array_equal(whole[0], arrays["run0/t000"])  # the whole extent is in bounds


def test_regions_need_a_format_with_region_reads(tmp_path, sources):
    store, _ = ingested(tmp_path, sources, "parquet")
    with pytest.raises(InvalidInputError, match=r"crop= and window= \(of 'u'\) need .* region"):
        list(SimDataset(store, "cfd", crop={"u": (0, 2)}))  # the field named (an audit)
    with pytest.raises(InvalidInputError, match="not an array field"):
        SimDataset(store, "cfd", crop={"nope": (0, 2)})


def test_corrupt_parquet_shard_names_the_object(tmp_path, sources):
    store, _ = ingested(tmp_path, sources, "parquet")
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("cfd"))
    shard = next(iter(cat.iter_parts(snap))).column("shard")[0].as_py()
    corrupt_object(store, shard)
    with pytest.raises(IntegrityError, match=shard):
        list(SimDataset(store, "cfd"))
    cache = str(tmp_path / "cache")
    with pytest.raises(IntegrityError, match=shard):
        list(SimDataset(RemoteLikeStore(store), "cfd", cache_dir=cache, cache_limit="64MiB"))
    assert not os.path.exists(os.path.join(cache, "objects", shard[:2], shard))


def test_cached_remote_parquet_matches_local(tmp_path, sources):
    store, arrays = ingested(tmp_path, sources, "parquet")
    ds = SimDataset(RemoteLikeStore(store), "cfd", cache_dir=str(tmp_path / "c"),
                    cache_limit="64MiB")
    got = {s["__key__"]: s["u"].numpy() for s in ds}
    assert sorted(keys_of([{"__key__": k, "__pad__": False} for k in got])) == sorted(arrays)
    assert all(np.array_equal(v, arrays[k]) for k, v in got.items())


def test_normalise_uses_the_pinned_snapshots_statistics(tmp_path):
    """SimDataset(normalise=...) applies (x - mean) / std from the snapshot's exact merged
    statistics: per component on a vector field, the same with workers, and refused where
    it cannot be right."""
    root = tmp_path / "src"
    root.mkdir()
    rng = np.random.default_rng(3)
    vel, re = {}, {}
    for i in range(12):
        v = (rng.standard_normal((20, 3)) * [1.0, 10.0, 100.0] + [5.0, -3.0, 0.5])
        vel[f"r{i:02d}"], re[f"r{i:02d}"] = v.astype(np.float32), 100 * (i + 1)
        np.savez(root / f"r{i:02d}.npz", v=vel[f"r{i:02d}"], re=np.int64(100 * (i + 1)),
                 name=np.str_(f"run{i}"))
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([str(root)], dataset="d", store=store, snapshot=True, message="m")
    allv = np.concatenate(list(vel.values())).astype(np.float64)
    mean, std = allv.mean(axis=0), allv.std(axis=0)
    re_all = np.array(list(re.values()), dtype=np.float64)

    def check(samples):
        assert len(samples) == 12
        for s in samples:
            k = s["__key__"]
            assert s["v"].dtype == torch.float32 and s["re"].dtype == torch.float32
            expect = ((vel[k].astype(np.float64) - mean) / std).astype(np.float32)
            np.testing.assert_allclose(s["v"].numpy(), expect, rtol=2e-5, atol=2e-5)
            assert float(s["re"]) == pytest.approx((re[k] - re_all.mean()) / re_all.std(),
                                                   rel=1e-6)
            assert s["name"] == f"run{int(k[1:3])}"  # not numeric: untouched

    check(list(SimDataset(store, "d", normalise=True)))
    loader = SimDataLoader(SimDataset(store, "d", normalise=["v", "re"]), batch_size=None,
                           num_workers=2, multiprocessing_context="fork")
    check(list(loader))
    given = SimDataset(store, "d", normalise={"re": (100.0, 2.0)}, shuffle=False)
    first = next(iter(given))
    assert float(first["re"]) == 0.0 and first["v"].dtype == torch.float32
    assert np.array_equal(first["v"].numpy(), vel["r00"])  # not named: untouched
    with pytest.raises(InvalidInputError, match="'name', which is not a numeric field"):
        SimDataset(store, "d", normalise=["name"])
    with pytest.raises(InvalidInputError, match="'v', which fields= does not read"):
        SimDataset(store, "d", fields=["re"], normalise=["v"])
    with pytest.raises(InvalidInputError, match="not 'v'"):
        SimDataset(store, "d", normalise="v")
    np.savez(root / "r00.npz", v=vel["r00"] * 2, re=np.int64(1), name=np.str_("run0"))
    simstore.ingest([str(root)], dataset="d", store=store, snapshot=True, message="m2")
    with pytest.raises(InvalidInputError, match="statistics are not exact") as refused:
        SimDataset(store, "d", normalise=True)
    # its advice is one SimDataset takes (not normalisation()'s own argument)
    assert "normalise={field: (mean, std)}" in str(refused.value)
    assert "pass allow_inexact" not in str(refused.value)
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("d"))
    constants = simstore.stats.normalisation(snap, ["re"], allow_inexact=True)
    assert len(list(SimDataset(store, "d", normalise=constants))) == 12


def test_normalise_passes_an_empty_sample_and_names_a_sample_of_other_components(tmp_path):
    """Statistics of a vector field count its non-empty samples: an empty sample of
    another last axis has nothing to scale; a non-empty one is refused, naming it."""
    root = tmp_path / "src"
    root.mkdir()
    np.savez(root / "a.npz", U=np.arange(30.0).reshape(10, 3))
    np.savez(root / "b.npz", U=np.zeros((0, 5)))
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([str(root)], dataset="d", store=store, snapshot=True, message="m")
    got = {s["__key__"]: s["U"] for s in SimDataset(store, "d", normalise=True)}
    assert tuple(got["b"].shape) == (0, 5) and got["b"].dtype == torch.float64
    u = np.arange(30.0).reshape(10, 3)
    np.testing.assert_allclose(got["a"].numpy(), (u - u.mean(0)) / u.std(0))
    # statistics of mixed last axes collapse to one component, so a non-empty sample
    # never meets constants of another count through SimDataset; the transform still
    # refuses one with an error that names it, not a raw broadcasting error
    scale = Normalise({"U": (np.zeros(3), np.ones(3))})
    with pytest.raises(InvalidInputError, match=r"'U' of sample 'c' has shape \(2, 5\)"):
        scale({"__key__": "c", "U": torch.ones(2, 5)})
    with pytest.raises(InvalidInputError, match=r"'U' of sample 'd' has shape \(\)"):
        scale({"__key__": "d", "U": torch.tensor(1.0)})


def test_normalise_fits_crops_of_the_components_and_keeps_batches_types(tmp_path):
    """A crop of a vector field's last axis takes those components' constants (all of
    them were applied, broadcast or failing); a window of it is refused; a normalised
    integer parameter is float32 in a batch as in a sample (a batch gave float64)."""
    root = tmp_path / "src"
    root.mkdir()
    rng = np.random.default_rng(11)
    vel = {}
    for i in range(4):
        vel[f"k{i}"] = (rng.standard_normal((10, 3)) * [1, 10, 100] + [0, 50, 500]).astype(
            np.float32)
        np.savez(root / f"k{i}.npz", vel=vel[f"k{i}"], steps=np.int64(10 * i))
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([str(root)], dataset="d", store=store, snapshot=True, message="m",
                    format="zarr")
    allv = np.concatenate(list(vel.values())).astype(np.float64)
    mean, std = allv.mean(axis=0), allv.std(axis=0)
    for region, comps in (([None, (2, 3)], [2]), ([None, (1, 3)], [1, 2]),
                          ([(0, 4), (0, 1)], [0]), ([None, (-2, None)], [1, 2])):
        for s in SimDataset(store, "d", shuffle=False, crop={"vel": region},
                            normalise=["vel"]):
            rows = slice(*region[0]) if region[0] else slice(None)
            expect = (vel[s["__key__"]][rows][:, comps] - mean[comps]) / std[comps]
            assert tuple(s["vel"].shape) == expect.shape, region
            np.testing.assert_allclose(s["vel"].numpy(), expect, rtol=2e-5, atol=2e-5)
    with pytest.raises(InvalidInputError, match="window of 'vel' covers its last axis"):
        SimDataset(store, "d", window={"vel": [4, 2]}, normalise=["vel"])
    rows_only = next(iter(SimDataset(store, "d", window={"vel": [4, None]},
                                     normalise=["vel"])))
    assert tuple(rows_only["vel"].shape) == (4, 3)
    # a window as long as the last axis keeps every component in order: allowed, and the
    # same as None for that axis
    whole = next(iter(SimDataset(store, "d", window={"vel": [4, 3]}, normalise=["vel"])))
    assert torch.equal(whole["vel"], rows_only["vel"]) and whole["__key__"] == rows_only["__key__"]
    batch = next(iter(SimDataLoader(SimDataset(store, "d", normalise=["steps"]),
                                    batch_size=4)))
    assert batch["steps"].dtype == torch.float32
    one = next(iter(SimDataset(store, "d", normalise=["steps"])))
    assert one["steps"].dtype == torch.float32


def test_a_transform_sees_scalars_as_0d_tensors_in_batches_too(tmp_path):
    # sample by sample it got 0-d tensors; in a batch of a DataLoader, Python numbers
    root = tmp_path / "src"
    root.mkdir()
    import h5py

    for i in range(4):
        with h5py.File(root / f"r{i}.h5", "w") as f:
            f["x"] = np.arange(4, dtype=np.int32) + i
            f.attrs["steps"] = np.int64(10 * i)
            f.attrs["re"] = 100.0 + i
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([str(root)], dataset="d", store=store, snapshot=True, message="m")
    seen = []

    def note(sample):
        seen.append({k: (type(v).__name__, getattr(v, "dtype", None))
                     for k, v in sample.items() if k in ("steps", "re")})
        return sample

    batch = next(iter(SimDataLoader(SimDataset(store, "d", transform=note), batch_size=4)))
    assert seen and all(s == {"steps": ("Tensor", torch.int64), "re": ("Tensor", torch.float64)}
                        for s in seen)
    assert batch["steps"].dtype == torch.int64 and tuple(batch["steps"].shape) == (4,)
    assert batch["re"].dtype == torch.float64


def test_numpy_values_a_transform_returns_are_collated_as_torch_collates_them(tmp_path):
    """A NumPy-based transform (albumentations, scipy) returns arrays: stacked into one
    tensor per field, as torch's default_collate does (they came back as a list)."""
    root = tmp_path / "src"
    root.mkdir()
    for i in range(4):
        np.savez(root / f"r{i}.npz", u=np.full((4, 5), i, np.float32))
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([str(root)], dataset="d", store=store, snapshot=True, message="m")

    def to_numpy(sample):
        assert "__key__" not in sample  # the fields only (loader.md)
        return {"u": sample["u"].numpy() * 2, "scale": np.float64(2.0), "tag": "x"}

    loader = SimDataLoader(SimDataset(store, "d", transform=to_numpy, shuffle=False),
                           batch_size=4)
    batch = next(iter(loader))
    expected = torch.utils.data.default_collate(
        [{"u": np.full((4, 5), 2 * i, np.float32), "scale": np.float64(2.0)} for i in range(4)])
    assert isinstance(batch["u"], torch.Tensor) and torch.equal(batch["u"], expected["u"])
    assert torch.equal(batch["scale"], expected["scale"])
    assert batch["tag"] == ["x"] * 4
    assert batch["__key__"] == [f"r{i}" for i in range(4)]
