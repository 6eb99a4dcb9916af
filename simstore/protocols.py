"""Protocols that core defines and ``simstore.formats`` implements.

Core (the ingest pipeline, verify) works only through these, so it never imports formats,
and a pipeline can add a source type or shard format without touching simstore: adapters
and shard formats are discovered through the entry-point groups ``simstore.adapters`` and
``simstore.shard_formats``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol, runtime_checkable

from simstore.sample import FieldValue, Sample, Schema

__all__ = [
    "ShardFormat",
    "ShardReader",
    "ShardWriteResult",
    "SourceAdapter",
    "WrittenSample",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class WrittenSample:
    """One sample as a shard writer placed it: key, content hash, row position, size."""

    key: str
    sample_hash: str
    position: int
    size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardWriteResult:
    """What writing one shard file produced (before it is hashed and stored)."""

    path: str
    samples: tuple[WrittenSample, ...]
    schema: Schema
    stats: Mapping[str, Any] = field(default_factory=dict)
    object_id: str | None = None
    """The file's object id when the writer hashed its bytes as it wrote them (the caller
    then need not read the file again to hash it); None: the caller hashes the file."""


@runtime_checkable
class SourceAdapter(Protocol):
    """Reads one kind of source file and yields samples.

    Implementers keep memory bounded (read large arrays in slices), name the file in
    every error (``SourceError``), and never execute code from the file (no pickle).
    """

    name: str
    version: str
    extensions: tuple[str, ...]

    def can_read(self, path: str, head: bytes) -> bool:
        """Whether this adapter reads the file, judged by its name and first bytes."""
        ...

    def iter_samples(self, path: str, key: str, options: Mapping[str, Any]) -> Iterator[Sample]:
        """Samples of one source file; ``key`` is its path relative to the ingest root."""
        ...


@runtime_checkable
class ShardReader(Protocol):
    """An open shard: reads samples by row position, optionally only some fields."""

    def read(
        self, positions: Sequence[int], fields: Sequence[str] | None = None
    ) -> Iterator[dict[str, FieldValue]]:
        """Field values of the samples at ``positions``, in the order given."""
        ...

    def close(self) -> None:
        """Release file handles."""
        ...


@runtime_checkable
class ShardFormat(Protocol):
    """A shard format (Parquet, Lance, Zarr): a deterministic writer and a reader."""

    name: str

    def write(self, samples: Iterable[Sample], path: str) -> ShardWriteResult:
        """Write samples to one local file; equal samples in equal order give equal bytes."""
        ...

    supports_file_objects: bool

    def open(self, source: str | BinaryIO) -> ShardReader:
        """Open a shard from a local path or a seekable binary file object.

        File objects (such as a ranged reader over a remote object) are accepted when
        ``supports_file_objects`` is true.
        """
        ...

    def sniff(self, head: bytes, tail: bytes) -> bool:
        """Whether a file with these first and last bytes is a shard of this format."""
        ...
