"""A folder source (a Zarr group) whose arrays were renamed inside is read again.

Its journal identity was the count of its files and their latest change time: swapping two
arrays of a group (three renames of folders below the top one) changes the change time of
the folders renamed, not of the files in them, so a re-run reused the old record and the
snapshot kept the old values.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

from simstore.ingest import ingest


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_swapped_arrays_of_a_zarr_group_are_read_again(catalog, tmp_path, read, zarr_format):
    src = tmp_path / "src"
    group = zarr.open_group(str(src / "g.zarr"), mode="w", zarr_format=zarr_format)
    for name, value in (("u", 1.0), ("v", 2.0)):
        array = group.create_array(f"fields/{name}", shape=(4, 8), dtype="float32",
                                   chunks=(1, 8), compressors=None)
        array[:] = value
    ingest([src], dataset="d", store=catalog, snapshot=True)
    fields = src / "g.zarr" / "fields"
    os.rename(fields / "u", fields / "t")
    os.rename(fields / "v", fields / "u")
    os.rename(fields / "t", fields / "v")
    r = ingest([src], dataset="d", store=catalog, snapshot=True)
    assert r.files_reused == 0
    _, samples = read(catalog, f"d@{r.snapshot_id}")
    assert float(np.asarray(samples["g.zarr"]["fields/u"]).ravel()[0]) == 2.0
    assert float(np.asarray(samples["g.zarr"]["fields/v"]).ravel()[0]) == 1.0


def test_an_unchanged_zarr_group_is_still_reused(catalog, tmp_path):
    src = tmp_path / "src"
    group = zarr.open_group(str(src / "g.zarr"), mode="w", zarr_format=3)
    group.create_array("a/b", shape=(3,), dtype="int32")[:] = 7
    ingest([src], dataset="d", store=catalog, snapshot=True)
    assert ingest([src], dataset="d", store=catalog, snapshot=True).files_reused == 1
