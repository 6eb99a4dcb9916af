"""A task's open shards: their writers, their closing, and objects stored under their ids.

:class:`ShardBuilders` is the part of the task runner (``TaskRunner`` in
:mod:`._worker`, which inherits it) that opens a shard per kind (format) as samples
come, closes it (on the writer thread when that one still has its last adds), hashes
it and stores it; :meth:`ShardBuilders._store` also stores the task's other objects
(packed file results). Storing is a put-if-absent; with ``since`` (the dask engine's
runs) an object found stored counts as this run's when it was stored after the run
began.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simstore.errors import NotFoundError
from simstore.hashing import ObjectId, object_key
from simstore.ingest._arrays import is_array_source
from simstore.ingest._filehash import hash_file
from simstore.ingest._records import TaskContext
from simstore.ingest._writes import _WriterThread
from simstore.protocols import ShardFormat, ShardWriteResult, WrittenSample
from simstore.sample import FieldSpec, Sample
from simstore.stats import StatsAccumulator
from simstore.storage import SupportsMoveFile

__all__ = ["BufferedWriter", "ShardBuilder", "ShardBuilders"]


class BufferedWriter:
    """A ShardWriter over a format that only has ``write``: buffers, then writes."""

    def __init__(self, fmt: ShardFormat, path: str) -> None:
        self._fmt, self._path = fmt, path
        self._samples: list[Sample] = []
        self._written: list[WrittenSample] = []

    def add(self, sample: Sample, *, sample_hash: str, size_bytes: int) -> WrittenSample:
        values: Mapping[str, Any] = sample.fields
        fields = {
            n: (np.asarray(v[tuple(slice(0, d) for d in v.shape)]) if is_array_source(v) else v)
            for n, v in values.items()
        }
        self._samples.append(Sample(sample.key, fields))
        ws = WrittenSample(
            key=sample.key,
            sample_hash=sample_hash,
            position=len(self._written),
            size_bytes=size_bytes,
        )
        self._written.append(ws)
        return ws

    def close(self, stats: Mapping[str, Any] | None = None) -> ShardWriteResult:
        return self._fmt.write(self._samples, self._path)

    def abort(self) -> None:
        self._samples = []
        if os.path.exists(self._path):
            os.unlink(self._path)


@dataclass(slots=True, eq=False)  # compared by identity (``_closing``)
class ShardBuilder:
    """A shard a task is writing: its writer, its scratch file and what it holds so far."""

    seq: int
    format: str
    path: str
    writer: Any
    stats: StatsAccumulator
    specs: dict[str, FieldSpec] = field(default_factory=dict)
    size_bytes: int = 0
    count: int = 0


class ShardBuilders:
    """The open shards of a task runner, one per kind, and the storing of finished objects.

    The runner sets the attributes below in its ``__init__``.
    """

    ctx: TaskContext
    formats: Mapping[str, ShardFormat]
    tmp: str
    since: float | None
    open: dict[str, ShardBuilder]
    shard_of: dict[int, str]
    shards: dict[str, int]
    new_bytes: int
    wrote: bool
    _seq: int
    _writes: _WriterThread
    _closing: list[ShardBuilder]
    _encode_threads: int

    def _builder(self, kind: str) -> ShardBuilder:
        b = self.open.get(kind)
        if b is None:
            fmt = self.formats[kind]
            path = os.path.join(self.tmp, f"{self._seq}.{kind}")
            opener = getattr(fmt, "open_writer", None)
            writer = opener(path) if callable(opener) else BufferedWriter(fmt, path)
            if hasattr(writer, "encode_threads"):
                writer.encode_threads = self._encode_threads
            b = ShardBuilder(self._seq, kind, path, writer, StatsAccumulator())
            self._seq += 1
            self.open[kind] = b
        return b

    def _close(self, kind: str) -> None:
        b = self.open.pop(kind)
        if self._writes.pending:  # behind its last add, on the writer thread
            self._closing.append(b)
            self._writes.submit(self._finish_shard, b)
        else:
            self._finish_shard(b)

    def _finish_shard(self, b: ShardBuilder) -> None:
        """Close ``b``'s shard and store it under its hash."""
        written = b.writer.close(stats=b.stats.to_json())
        known = getattr(written, "object_id", None)  # hashed on the way out (Zarr)
        if known is not None:
            oid, size = ObjectId(known), os.path.getsize(b.path)
        else:
            oid, size = hash_file(b.path)
        if self._store(object_key(oid), b.path):
            self.new_bytes += size
        self.shard_of[b.seq] = str(oid)
        self.shards[str(oid)] = size
        if b in self._closing:
            self._closing.remove(b)

    def _store(self, key: str, path: str, *, consume: bool = True) -> bool:
        """Store the file at ``path`` under ``key`` unless present; ``consume``: remove it.

        True when the object is new to the store in this run: written now, or (with
        ``since``) found with a modification time after the run started, which only this
        run's earlier attempt of the task (or a run alongside) can have given it. That
        takes one stat (a HEAD on S3) before the store's own put-if-absent; the time is
        read before the put refreshes it.
        """
        store = self.ctx.store
        self.wrote = False
        stored_at = self._stored_at(key) if self.since is not None else None
        if stored_at is not None:
            refresh = getattr(store, "refresh", None)
            if callable(refresh) and refresh(key):  # gc's grace, as a put would
                if consume:
                    os.unlink(path)
                return stored_at >= self._cutoff()
            # gone since the stat (gc): store it again, below
        if consume and isinstance(store, SupportsMoveFile):
            wrote = store.move_file(key, path)  # consumes path
        else:
            wrote = store.put_file(key, path)
            if consume:
                os.unlink(path)
        self.wrote = wrote
        if wrote or self.since is None:
            return wrote
        # absent at the stat, present at the put: stored meanwhile, by a duplicate of this
        # task (or a run alongside); or present at both, the time says whose
        return stored_at is None or stored_at >= self._cutoff()

    def _cutoff(self) -> float:
        # No margin: an object of a run that ended a moment before this one must not
        # count as this run's (a journal record would be redone). S3 keeps whole seconds,
        # so what this run stores in its first second may count as earlier (as before).
        assert self.since is not None
        return self.since

    def _stored_at(self, key: str) -> float | None:
        """The object's modification time, or None when it is absent."""
        try:
            return self.ctx.store.info(key).mtime
        except NotFoundError:
            return None
