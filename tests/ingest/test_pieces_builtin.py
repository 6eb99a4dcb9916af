"""HDF5, NetCDF-4 and Zarr runs cut in time windows: large ones are ingested in pieces."""

import h5py
import netCDF4
import numpy as np
import pytest
import zarr
from simstore.formats.adapters import HDF5Adapter, NetCDFAdapter, ZarrAdapter

from simstore.catalog import Catalog
from simstore.ingest import ingest

SHARD = 64 * 1024  # the runs below are about ten times this


def _write(kind, path, u, re):
    if kind == "hdf5":
        with h5py.File(path, "w") as f:
            f.attrs["Re"] = re
            f["time"] = np.arange(len(u), dtype=np.float64)
            f.create_dataset("u", data=u, chunks=(1, *u.shape[1:]))
    elif kind == "zarr":
        group = zarr.open_group(str(path), mode="w")
        group.attrs["Re"] = re
        group.create_array("time", data=np.arange(len(u), dtype=np.float64))
        group.create_array("u", data=u, chunks=(1, *u.shape[1:]))
    else:
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", len(u))
            ds.createDimension("y", u.shape[1])
            ds.createDimension("x", u.shape[2])
            ds.Re = re
            ds.createVariable("time", "f8", ("time",))[:] = np.arange(len(u), dtype=np.float64)
            ds.createVariable("u", "f4", ("time", "y", "x"))[:] = u


def _rows(catalog, result):
    snap = catalog.snapshot(result.snapshot_id)
    return snap.content_hash, [(x["key"], x["sample_hash"]) for x in catalog.manifest(snap).to_pylist()]


@pytest.mark.parametrize(("kind", "suffix"), [("hdf5", "h5"), ("netcdf", "nc"), ("zarr", "zarr")])
def test_a_long_run_is_ingested_in_pieces_with_the_keys_and_values_of_the_whole(
    tmp_path, kind, suffix
):
    rng = np.random.default_rng(21)
    src = tmp_path / "src"
    src.mkdir()
    runs = {f"run{i}.{suffix}": rng.standard_normal((40, 32, 64)).astype(np.float32) for i in range(2)}
    for i, (name, u) in enumerate(runs.items()):
        _write(kind, src / name, u, 100.0 + i)
    opts = {"time_window": 4, "stride": 3}
    adapter = {"hdf5": HDF5Adapter, "netcdf": NetCDFAdapter, "zarr": ZarrAdapter}[kind]()
    path = str(src / f"run0.{suffix}")
    assert adapter.count_samples(path, opts) == 13  # windows starting at 0, 3, ..., 36
    piece = list(adapter.iter_samples(path, "run0", {**opts, "sample_range": [5, 9]}))
    assert [s.key for s in piece] == ["run0/t0015", "run0/t0018", "run0/t0021", "run0/t0024"]
    np.testing.assert_array_equal(np.asarray(piece[0].fields["u"]), runs[f"run0.{suffix}"][15:19])

    whole_cat = Catalog.init(str(tmp_path / "whole"))
    cut_cat = Catalog.init(str(tmp_path / "cut"))
    whole = ingest([src], dataset="d", store=whole_cat, shard_size=SHARD, snapshot=True, **opts)
    cut = ingest(
        [src], dataset="d", store=cut_cat, shard_size=SHARD, piece_bytes=SHARD, snapshot=True,
        **opts,
    )
    # small shards alone do not cut a file: pieces are at least piece_bytes (256 MiB)
    assert [t.files for t in whole.tasks] == [1, 1]
    assert len(cut.tasks) > 4 and all(t.files == 1 for t in cut.tasks)
    assert sum(t.samples for t in cut.tasks) == cut.samples == whole.samples == 26
    assert _rows(cut_cat, cut) == _rows(whole_cat, whole)
    stats = cut_cat.snapshot(cut.snapshot_id).stats["fields"]["u"]
    values = np.concatenate([u[s : s + 4] for u in runs.values() for s in range(0, 37, 3)])
    assert stats["count"] == [values.size]
    assert stats["mean"][0] == pytest.approx(values.astype(np.float64).mean(), rel=1e-9)
    assert stats["min"] == [float(values.min())] and stats["max"] == [float(values.max())]
