"""The values that travel between the driver and the workers of an ingest.

A task is a pure function of a :class:`TaskContext` and a run of :class:`SourceFile`
entries; it returns a :class:`TaskResult`. Everything here pickles (the store pickles as
its URL and options), so a process pool or a dask.distributed worker can run a task, and
nothing here holds a live client, file handle or lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from simstore.ingest._config import IngestConfig
from simstore.sample import FieldSpec
from simstore.storage import ObjectStore

__all__ = [
    "FileResult", "Piece", "ResultPacker", "Row", "SourceFile", "TaskContext", "TaskResult",
]

Row = tuple[str, str, str, int, int]
"""One manifest row: key, sample hash, shard id, position in the shard, logical size."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Samples ``[start, stop)`` of a file cut into ``count`` pieces; this is number ``index``."""

    index: int
    count: int
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A discovered source: its path, its key (path relative to the ingest root), size, mtime.

    A very large file whose adapter reads sample ranges is planned as several pieces, each
    its own task: then ``piece`` says which samples, and ``size`` is the piece's share of
    the file's bytes (so the shares add up to the file's size).
    """

    path: str
    key: str
    size: int
    mtime_ns: int
    piece: Piece | None = None
    identity: str = ""
    """What else tells this file from another with the same key, size and mtime (a copy
    unpacked with its times kept, another folder's file of the same name): its device,
    inode and change time, which no program sets (see ``_sources._stat``)."""
    file_size: int | None = None
    """The whole file's size as listed (``size`` is a piece's share of it); None: ``size``.
    A task checks the file against its listing (size, mtime, identity) when it opens it
    and after reading it (see ``_sources.ListedSource``)."""
    companions: tuple[tuple[str, int, int, str], ...] = ()
    """The files its adapter reads with it (a ``.pvd``'s steps, an XDMF's HDF5 data), each
    as listed: path, size, mtime, identity (size -1: missing). They key the journal and
    are checked after reading, as the file itself is: a step rewritten under an unchanged
    ``.pvd`` is read again."""

    @property
    def listed_size(self) -> int:
        """The whole file's size when it was listed."""
        return self.size if self.file_size is None else self.file_size

    @property
    def completes_file(self) -> bool:
        """Whether finishing this entry finishes its file (a whole file, or the last piece)."""
        return self.piece is None or self.piece.index == self.piece.count - 1


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What every task needs besides its files: the store, the dataset and the options.

    ``base_schema`` is the branch head's schema (a task checks field types against it);
    ``params_digest`` is the digest of every output parameter (it keys the journal);
    ``listed_on``: the machine that listed the sources (``_sources.host_token``), where a
    task may compare their device and inode numbers too (elsewhere those are another
    machine's numbers for the same file).
    """

    store: ObjectStore
    dataset: str
    config: IngestConfig
    base_schema: tuple[FieldSpec, ...]
    params_digest: str
    listed_on: str = ""


@dataclass(slots=True)
class FileResult:
    """One file's outcome: its manifest rows, schema and statistics, or why it failed."""

    path: str
    key: str
    size_bytes: int
    source_hash: str = ""
    adapter: str = ""
    adapter_version: str = ""
    rows: list[Row] = field(default_factory=list)
    schema: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    reused: bool = False
    source_object: str | None = None
    new_bytes: int = 0
    software: dict[str, str] = field(default_factory=dict)
    """The versions the file was read and its shards written with (see ``_software``);
    empty for a journal record written before records kept them."""
    packed_stats: bytes = b""
    """``stats`` as JSON text, once the driver has packed the result (see :meth:`pack`);
    read them with :meth:`field_stats`."""

    def field_stats(self) -> dict[str, Any]:
        """The file's statistics, ``{field: summary}``, whether packed or not."""
        return json.loads(self.packed_stats) if self.packed_stats else self.stats

    def pack(self, shared: dict[Any, Any]) -> None:
        """Shrink what the driver holds of this result until it stages the run.

        The statistics become JSON text (a fifth of their size as Python objects; floats
        round-trip exactly through their shortest repr), and a schema or version set equal
        to one already seen (``shared``, kept for the run) becomes that same object.
        """
        if self.stats:
            self.packed_stats = json.dumps(self.stats, separators=(",", ":")).encode()
            self.stats = {}
        self.schema = shared.setdefault(json.dumps(self.schema, sort_keys=True), self.schema)
        self.software = shared.setdefault(tuple(sorted(self.software.items())), self.software)


@dataclass(slots=True)
class TaskResult:
    """One task's outcome: its files in order, the shards it stored (id: size), new bytes.

    ``worker`` and ``seconds`` say where and how long it ran (set by the engine);
    ``failed``: the task itself failed (its files carry the error and were skipped).
    """

    files: list[FileResult]
    shards: dict[str, int]
    new_bytes: int
    worker: str = ""
    seconds: float = 0.0
    failed: bool = False


class ResultPacker:
    """Packs each task result as the driver collects it (see :meth:`FileResult.pack`).

    The driver keeps every file's result until it stages the run: with many small files
    that is most of its memory (about 4.8 KB a file unpacked, with three fields).
    """

    def __init__(self) -> None:
        self._shared: dict[Any, Any] = {}

    def __call__(self, res: TaskResult) -> TaskResult:
        for fr in res.files:
            fr.pack(self._shared)
        return res
