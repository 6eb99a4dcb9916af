"""Hypothesis strategies for the pure model: manifest rows, tables and change sets."""

from __future__ import annotations

import hypothesis.strategies as st
import pyarrow as pa

from simstore.manifest import ManifestRow, rows_from_list, sort_rows

__all__ = ["keys", "manifest_rows", "manifest_tables", "object_ids"]

object_ids = st.binary(min_size=16, max_size=16).map(bytes.hex)
keys = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_characters="\x7f"),
    min_size=1,
    max_size=24,
)


@st.composite
def manifest_rows(draw: st.DrawFn, key: str | None = None) -> ManifestRow:
    """One row with random content."""
    return ManifestRow(
        key=key if key is not None else draw(keys),
        sample_hash=draw(object_ids),
        shard=draw(st.sampled_from(["a" * 32, "b" * 32, "c" * 32])),
        position=draw(st.integers(0, 10_000)),
        size_bytes=draw(st.integers(0, 1 << 30)),
    )


@st.composite
def manifest_tables(draw: st.DrawFn, max_rows: int = 200) -> pa.Table:
    """A sorted manifest table with unique keys."""
    ks = draw(st.lists(keys, max_size=max_rows, unique=True))
    rows = [draw(manifest_rows(key=k)) for k in ks]
    return sort_rows(rows_from_list(rows))
