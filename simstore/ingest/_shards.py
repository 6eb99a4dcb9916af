"""Shard options (compression, chunking, row groups) and the streaming shard-writer protocol."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from simstore._sizes import SizeError
from simstore._sizes import parse_size as _parse_size
from simstore.errors import InvalidInputError
from simstore.ingest._arrays import MiB
from simstore.protocols import ShardWriteResult, WrittenSample
from simstore.sample import Sample

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "ShardOptions",
    "ShardWriter",
    "parse_compression",
    "parse_size",
]

COMPRESSIONS = ("none", "zstd", "shuffle-zstd")
DEFAULT_COMPRESSION = "shuffle-zstd:1"


def parse_compression(text: str) -> tuple[str, int]:
    """Parse ``none``, ``zstd[:LEVEL]`` or ``shuffle-zstd[:LEVEL]`` (``blosc`` is an alias).

    ``shuffle-zstd`` byte-shuffles float fields before zstd: Parquet's BYTE_STREAM_SPLIT
    encoding, Blosc's shuffle in Zarr. Returns (codec, level); level 0 for ``none``.
    """
    name, _, level_text = text.strip().lower().partition(":")
    name = "shuffle-zstd" if name == "blosc" else name
    if name not in COMPRESSIONS:
        raise InvalidInputError(
            f"invalid compression {text!r}: expected none, zstd[:LEVEL] or shuffle-zstd[:LEVEL]"
        )
    if name == "none":
        if level_text:
            raise InvalidInputError(f"invalid compression {text!r}: 'none' takes no level")
        return name, 0
    try:
        level = int(level_text) if level_text else 3
    except ValueError:
        raise InvalidInputError(f"invalid compression level in {text!r}") from None
    if not 1 <= level <= 19:
        raise InvalidInputError(f"invalid compression level {level} in {text!r}: use 1 to 19")
    return name, level


def parse_size(text: str | int, name: str = "size") -> int:
    """Parse a byte size: ``268435456``, ``256MiB``, ``1GB``, ``64K``; at least 1.

    The rule of :mod:`simstore._sizes` (``KB`` is 1000 bytes, ``KiB`` and ``K`` 1024). An
    error names ``name``: ``invalid size '1XB': unknown unit 'XB'...`` by default.
    """
    if isinstance(text, int):
        value = text
    else:
        try:
            value = _parse_size(text)
        except SizeError as exc:
            raise InvalidInputError(f"invalid {name} {text!r}: {exc}") from None
    if value < 1:
        raise InvalidInputError(f"invalid {name} {text!r}: must be positive")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardOptions:
    """How a shard format writes: compression, Zarr chunking, Parquet row-group size.

    ``chunks`` maps a field name to a Zarr chunk shape; other dense fields get chunks of
    about ``chunk_bytes``. Every value here shapes the shard's bytes, so they are all part of
    the journal digest.
    """

    compression: str = DEFAULT_COMPRESSION
    chunk_bytes: int = 1 * MiB
    chunks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    row_group_bytes: int = 4 * MiB

    def __post_init__(self) -> None:
        parse_compression(self.compression)
        if self.chunk_bytes < 1 or self.row_group_bytes < 1:
            raise InvalidInputError("chunk_bytes and row_group_bytes must be positive")

    def to_json(self) -> dict[str, Any]:
        """JSON shape (for lineage and the journal digest)."""
        return {
            "compression": self.compression,
            "chunk_bytes": self.chunk_bytes,
            "chunks": {k: list(v) for k, v in sorted(self.chunks.items())},
            "row_group_bytes": self.row_group_bytes,
        }


class ShardWriter(Protocol):
    """An open shard being written sample by sample (the streaming side of a ShardFormat).

    Positions are assigned in ``add`` order from 0. ``close`` finishes the file at the
    path given to ``open_writer`` (``stats``: the shard's field summaries, to embed);
    ``abort`` removes whatever was written.
    """

    def add(self, sample: Sample, *, sample_hash: str, size_bytes: int) -> WrittenSample:
        """Append one sample."""
        ...

    def close(self, stats: Mapping[str, Any] | None = None) -> ShardWriteResult:
        """Finish the shard file."""
        ...

    def abort(self) -> None:
        """Discard the partial shard."""
        ...
