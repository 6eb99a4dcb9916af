"""Bool tensors of every length write to Lance shards and read back.

Lance 14 bit-packs a ``fixed_size_list<bool>`` in miniblocks of at most 8,186 bytes and
refused the whole file at ``close`` for a list of 4,093 bools or more (unless a multiple
of 8, up to 32,736): a 256 x 256 mask, 64 KiB and so a fixed-shape column by the size
rule, failed every ``--format lance`` ingest of it with a traceback. Such a tensor is a
blob now; the lengths Lance writes stay fixed columns, with the bytes they had.
"""

from __future__ import annotations

import json

import lance.file
import numpy as np
import pytest
from simstore.formats import open_shard
from simstore.formats._lance import LanceFormat

from simstore.ingest import ShardOptions
from simstore.sample import Sample


def _encoding(path: str, field: str) -> str:
    schema = lance.file.LanceFileReader(path).metadata().schema
    meta = json.loads(schema.metadata[b"simstore"])
    return {c["name"]: c for c in meta["columns"]}[field]["encoding"]


@pytest.mark.parametrize(
    ("shape", "encoding"),
    [
        ((4092,), "fixed"),
        ((4093,), "blob"),
        ((64, 64), "fixed"),
        ((4097,), "blob"),
        ((32736,), "fixed"),
        ((32744,), "blob"),
        ((256, 256), "blob"),
        ((2, 3, 100, 100), "blob"),
    ],
)
@pytest.mark.parametrize("compression", ["none", "shuffle-zstd:1"])
def test_bool_tensors_of_any_length_write_and_read_back(tmp_path, shape, encoding, compression):
    rng = np.random.default_rng(sum(shape))
    samples = [
        Sample(f"k{i}", {"mask": rng.random(shape) > 0.5} if i != 1 else {"other": i})
        for i in range(4)
    ]
    path = str(tmp_path / "shard.lance")
    LanceFormat(ShardOptions(compression=compression)).write(samples, path)
    assert _encoding(path, "mask") == encoding
    reader = open_shard(path)
    try:
        got = list(reader.read([3, 0, 1, 2]))
    finally:
        reader.close()
    for g, s in zip(got, [samples[3], samples[0], samples[1], samples[2]], strict=True):
        assert sorted(g) == sorted(s.fields)
        if "mask" in s.fields:
            assert g["mask"].dtype == np.bool_
            np.testing.assert_array_equal(g["mask"], s.fields["mask"])
