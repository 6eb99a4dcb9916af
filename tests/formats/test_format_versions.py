"""Data of a later format version is an UnsupportedFormatError; other versions are damage."""

import gc
import warnings

import numpy as np
import pytest
import simstore.formats._arrow as arrow
import simstore.formats._zarr_write as zarr_write
from simstore.formats import ParquetFormat, ZarrFormat

from simstore.errors import FormatError, UnsupportedFormatError, version_error
from simstore.ingest import ShardOptions
from simstore.sample import Sample


@pytest.mark.parametrize("found", [2, 17])
def test_a_later_version_is_unsupported_and_says_so(found):
    exc = version_error("x has shard", found, 1)
    assert isinstance(exc, UnsupportedFormatError)
    assert str(exc) == (f"x has shard format_version {found}, this simstore reads 1: "
                        "written by a newer simstore, upgrade to read it")


@pytest.mark.parametrize("found", [0, -3, None, "2", True, 2.0, [2]])
def test_an_earlier_missing_or_odd_version_is_a_plain_format_error(found):
    exc = version_error("x has shard", found, 1)
    assert type(exc) is FormatError
    assert str(exc) == f"x has shard format_version {found!r}, this simstore reads 1"


@pytest.mark.parametrize("fmt", [ParquetFormat, ZarrFormat])
def test_a_shard_of_a_later_version_is_refused_and_not_held_open(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(arrow, "SHARD_FORMAT_VERSION", 2)
    monkeypatch.setattr(zarr_write, "SHARD_FORMAT_VERSION", 2)
    path = str(tmp_path / "shard")
    fmt(ShardOptions(compression="none")).write([Sample("a", {"x": np.arange(4.0)})], path)
    monkeypatch.undo()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for source in (path, open(path, "rb")):
            with pytest.raises(UnsupportedFormatError, match="format_version 2, this simstore reads 1"):
                fmt().open(source)
            if not isinstance(source, str):
                source.close()
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)]
