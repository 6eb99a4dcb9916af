"""A stream's manifest rows: the columns it reads, and shard codes numbered as before.

``group_order`` numbers a group's pieces by their shard codes, so the codes are part of
the stream order a checkpoint records: reading the parts' shard column dictionary-encoded,
coding each part's shards alone and combining the parts (also after a round trip through
the node's cache of decoded rows) must give the codes that dictionary-encoding the
combined strings gave.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from simstore.loaders._partrows import PartRows, combine
from simstore.loaders._source import STREAM_COLUMNS

from simstore.errors import FormatError
from simstore.hashing import hash_bytes
from simstore.manifest import MANIFEST_SCHEMA, decode_part, encode_part


def _part(keys: list[str], shards: list[str]) -> bytes:
    n = len(keys)
    table = pa.table({
        "key": pa.array(keys, pa.string()),
        "sample_hash": pa.array([bytes(16)] * n, pa.binary(16)),
        "shard": pa.array(shards, pa.string()),
        "position": pa.array(range(n), pa.int64()),
        "size_bytes": pa.array([8] * n, pa.int64()),
    }, schema=MANIFEST_SCHEMA)
    return encode_part(table)


def _ids(k: int) -> list[str]:
    return [hash_bytes(str(i).encode()) for i in range(k)]


def _before(parts: list[bytes]) -> tuple[list[str], np.ndarray]:
    """What the stream made of the parts before: whole parts, strings combined, encoded."""
    tables = [decode_part(p).select(list(STREAM_COLUMNS)) for p in parts]
    encoded = pa.concat_tables(tables).combine_chunks().column("shard").combine_chunks()
    encoded = encoded.dictionary_encode()
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy().astype(np.int64)


def _after(parts: list[bytes], *, cached: bool = False) -> tuple[list[str], np.ndarray]:
    rows = [PartRows.from_table(decode_part(p, columns=STREAM_COLUMNS)) for p in parts]
    if cached:  # as a later job loads them from the node's cache
        rows = [PartRows.from_bytes(r.to_bytes(f"p{i}"), f"p{i}", len(r))
                for i, r in enumerate(rows)]
    group = combine(rows)
    # the other columns come through in the parts' order
    whole = pa.concat_tables([decode_part(p) for p in parts])
    assert group.position.tolist() == whole.column("position").to_pylist()
    assert [group.key(i) for i in range(len(group))] == whole.column("key").to_pylist()
    return list(group.shard_ids), np.asarray(group.shard, dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=60), min_size=1, max_size=5))
def test_shard_codes_are_numbered_as_dictionary_encoding_numbered_them(parts_of_codes):
    ids = _ids(12)
    parts = []
    row = 0
    for codes in parts_of_codes:
        keys = [f"k{row + i:06d}" for i in range(len(codes))]
        row += len(codes)
        parts.append(_part(keys, [ids[c] for c in codes]))
    want_ids, want_codes = _before(parts)
    for cached in (False, True):
        got_ids, got_codes = _after(parts, cached=cached)
        assert got_ids == want_ids
        assert np.array_equal(got_codes, want_codes)


def test_shard_codes_when_a_part_outgrows_its_dictionary():
    # 40,000 distinct ids are over a Parquet dictionary page's 1 MiB: the writer falls
    # back to plain pages part-way, and the reader encodes those itself
    rng = np.random.default_rng(1)
    ids = _ids(40_000)
    parts = []
    for p in range(3):
        picks = np.concatenate([rng.permutation(len(ids))[:36_000], rng.integers(0, 40, 4000)])
        parts.append(_part([f"p{p}k{i:06d}" for i in range(len(picks))], [ids[c] for c in picks]))
    import io

    import pyarrow.parquet as pq

    chunk = pq.ParquetFile(io.BytesIO(parts[0])).metadata.row_group(0).column(2)
    assert chunk.path_in_schema == "shard" and "PLAIN" in chunk.encodings  # fell back
    want_ids, want_codes = _before(parts)
    got_ids, got_codes = _after(parts)
    assert got_ids == want_ids
    assert np.array_equal(got_codes, want_codes)


def test_a_column_subset_is_checked_as_the_whole_part_is():
    ids = _ids(2)
    good = _part(["a", "b"], ids)
    table = decode_part(good, columns=STREAM_COLUMNS)
    assert table.column_names == list(STREAM_COLUMNS)
    assert pa.types.is_dictionary(table.schema.field("shard").type)
    with pytest.raises(FormatError, match="keys out of order"):
        decode_part(_part(["b", "a"], ids), object_id="x1", columns=STREAM_COLUMNS)
    with pytest.raises(FormatError, match="manifest part x2 names an invalid shard id 'nope'"):
        decode_part(_part(["a", "b"], [ids[0], "nope"]), object_id="x2", columns=STREAM_COLUMNS)
    with pytest.raises(ValueError, match="no column 'shards'"):
        decode_part(good, columns=["shards"])


def _raw_part(columns: dict[str, pa.Array]) -> bytes:
    """A part written with nullable columns and the part's metadata, as a forger could."""
    import io

    import pyarrow.parquet as pq

    table = pa.table(columns).replace_schema_metadata(MANIFEST_SCHEMA.metadata)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


@pytest.mark.parametrize("columns", [None, STREAM_COLUMNS])
@pytest.mark.parametrize("null_in", ["key", "shard", "position", "size_bytes"])
def test_a_null_in_a_required_column_is_refused(columns, null_in):
    ids = _ids(2)
    values = {
        "key": pa.array(["a", "b"], pa.string()),
        "sample_hash": pa.array([bytes(16)] * 2, pa.binary(16)),
        "shard": pa.array(ids, pa.string()),
        "position": pa.array([0, 1], pa.int64()),
        "size_bytes": pa.array([8, 8], pa.int64()),
    }
    typ = values[null_in].type
    values[null_in] = pa.array([values[null_in][0].as_py(), None], typ)
    with pytest.raises(FormatError, match=f"manifest part n1 has a null {null_in}"):
        decode_part(_raw_part(values), object_id="n1", columns=columns)


def test_parts_decode_to_the_manifest_types_and_metadata():
    ids = _ids(3)
    whole = decode_part(_part(["a", "b", "c"], ids))
    assert whole.schema.equals(MANIFEST_SCHEMA, check_metadata=True)
    some = decode_part(_part(["a", "b", "c"], ids), columns=STREAM_COLUMNS)
    assert some.schema.metadata == MANIFEST_SCHEMA.metadata
    assert [f.type for f in some.schema] == [
        pa.string(), pa.dictionary(pa.int32(), pa.string()), pa.int64(), pa.int64()]
    # a part stored with other (castable) types still decodes to the manifest's
    other = _raw_part({
        "key": pa.array(["a", "b"], pa.large_string()),
        "sample_hash": pa.array([bytes(16)] * 2, pa.binary(16)),
        "shard": pa.array(ids[:2], pa.string()),
        "position": pa.array([0, 1], pa.int32()),
        "size_bytes": pa.array([8, 8], pa.int32()),
    })
    table = decode_part(other)
    assert [f.type for f in table.schema] == [f.type for f in MANIFEST_SCHEMA]
    assert table.column("position").to_pylist() == [0, 1]
