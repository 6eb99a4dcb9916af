"""The worker side of an ingest: one task's files to samples to stored shards.

Per file: hash its bytes (lineage), let the adapter yield samples, check each sample's
field types, hash and summarise it, and hand it to a shard writer (Zarr for big dense
fields, else the chosen format); a shard closes at ``shard_size``, is hashed and stored
under its id (an existing object is not written again). When the task's shards are
stored, each finished file gets a journal record.

A task is a pure function of its context and files: shards are deterministic, so running
a task twice (a retry, a duplicate) stores nothing new the second time.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from simstore.errors import (
    InvalidInputError,
    NotFoundError,
    NotWritableError,
    SourceError,
    StorageError,
    exhausted,
    one_line,
    write_refused,
)
from simstore.hashing import object_key
from simstore.ingest._ahead import HashAhead
from simstore.ingest._arrays import (
    hash_sample_blocks,
    is_array_source,
    sample_nbytes,
    spec_of_value,
)
from simstore.ingest._builders import ShardBuilder, ShardBuilders
from simstore.ingest._config import printable_text
from simstore.ingest._fieldgroups import FieldGroups, group_clash_message
from simstore.ingest._filehash import crc_ranges, hash_file_checked
from simstore.ingest._guard import as_bad_file, owned_sample
from simstore.ingest._journal import (
    journal_key,
    read_journal,
    task_digest,
    write_journal,
    write_task_record,
)
from simstore.ingest._plugins import Plugins, plugins_for
from simstore.ingest._records import FileResult, Row, SourceFile, TaskContext, TaskResult
from simstore.ingest._software import libraries_of, software
from simstore.ingest._sources import (
    ListedSource,
    SourceGone,
    check_key,
    hash_source,
    listed_here,
    read_head,
    resolve_adapter,
)
from simstore.ingest._writes import (
    HANDOFF_BYTES,
    _add,
    _WriterThread,
    task_cores,
    writer_thread_wanted,
)
from simstore.sample import FieldSpec, Sample
from simstore.stats import StatsAccumulator
from simstore.storage import Scratch, SupportsMoveFile, sweep_scratch

__all__ = ["TaskRunner", "run_task", "warm_up"]

_log = logging.getLogger("simstore.ingest")


class _WriteFailed(SourceError):
    """A sample's read failed while it was written, after its first read (the hash) passed.

    The shard in progress holds part of it (a Zarr shard writes a sample's entries as it
    reads them), so the file cannot be passed over: the next sample would take the same
    place in the shard. The task is aborted and the run fails, even with ``--on-error
    skip``; a re-run resumes from the files before it.
    """


_PART_WRITTEN = (
    "while its sample was written to a shard, after a first read of it passed: the shard "
    "holds part of it, so the file cannot be skipped and the run stops"
)

_MISSING_MARKERS = ("._FillValue", ".missing_value")
"""Attribute fields that name the value standing for missing data (CF conventions): a
NaN there is what xarray writes for every float variable, not a NaN in the data."""


COLUMNAR_VALUE_BYTES = (1 << 31) - (64 << 20)
"""The largest array a Parquet or Lance shard holds as one value: the rest go to Zarr
shards whatever ``zarr_threshold`` and ``dense_threshold`` say (Parquet takes values
under 2 GiB; the margin covers a value's framing)."""


@dataclass(slots=True)
class _Deferred:
    """A file read whole but for its last add, on the writer thread: its check waits."""

    listed: ListedSource
    res: FileResult
    raw: list[tuple[int, int, Row]]
    path: str
    specs: dict[str, FieldSpec]
    before: dict[str, tuple[FieldSpec | None, bool]]
    """What ``run_specs`` held for each of its fields before it, and whether
    ``spec_from`` named a file for it: restored if the file turns out changed."""


_SWEEP_EVERY_S = 60.0
_SWEPT: dict[str, float] = {}
"""When this process last swept each scratch parent of dead ingests' folders (monotonic)."""


class TaskRunner(ShardBuilders):
    """Turns one task's files into shards; owns the open shard writers and temp files."""

    def __init__(
        self,
        ctx: TaskContext,
        progress: Callable[[SourceFile, int], None] | None = None,
        plugins: Plugins | None = None,
        since: float | None = None,
        missing_fails: bool = False,
        writer_pool: ThreadPoolExecutor | None = None,
        writer_thread: bool | None = None,
        encode_threads: int | None = None,
    ):
        """A runner of one task; see :meth:`read` and :meth:`finish`.

        ``writer_pool``: a pool of one thread to write shards on, shared with the tasks
        that run before and after this one in this process (else the task has a thread of
        its own where ``writer_thread`` says so, by default where
        :func:`writer_thread_wanted` does for the configured workers). ``encode_threads``:
        threads that compress a field's chunks side by side in writers that can (by
        default the task's share of the cores, :func:`task_cores`).
        """
        self.started = time.perf_counter()
        self.ctx = ctx
        self.missing_fails = missing_fails
        """A listed source missing at its path when a task opens it fails the task
        (:class:`SourceGone`), whatever ``on_error`` says: on a dask worker that is a
        worker that cannot see the sources, not a bad file to skip."""
        self.same_host = listed_here(ctx.listed_on)
        """Whether this process runs on the machine that listed the sources (device and
        inode numbers are compared only there)."""
        self.since = since
        """When the run started (epoch seconds; the dask engine, whose tasks may run
        again). A shard this task finds already stored but last modified after that was
        stored by this run (an earlier attempt of this task, on a worker that died), so
        it counts in ``new_bytes``; a journal record written after that is this run's too,
        and its file is read again rather than reused."""
        self.cfg = ctx.config
        self.progress = progress
        self.adapter, self.formats = plugins or plugins_for(self.cfg)
        self._adapter_versions: dict[str, str] | None = None
        scratch = self.cfg.tmp_dir
        if scratch is None and isinstance(ctx.store, SupportsMoveFile):
            # build shards on the store's filesystem so storing one is a link, not a copy
            scratch = ctx.store.scratch_dir()
        # the scratch folders of killed ingests (here or in any process on this machine)
        # go first; a live one's is locked by its owner and stays. A sweep lists the
        # folder (0.4 ms with 1,300 entries in the temp dir), so a process sweeps a folder
        # at most once a minute, not before each of thousands of small tasks
        parent = scratch or tempfile.gettempdir()
        now = time.monotonic()
        if now - _SWEPT.get(parent, -_SWEEP_EVERY_S) >= _SWEEP_EVERY_S:
            _SWEPT[parent] = now
            sweep_scratch(parent)
        try:
            self._scratch = Scratch(scratch)
            self.tmp = self._scratch.path
        except OSError as exc:  # a read-only store, a full disk, a missing --tmp-dir
            where = scratch or tempfile.gettempdir()
            why = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror or exc
            if self.cfg.tmp_dir is None and scratch is not None and write_refused(exc):
                # the store's own folder
                raise NotWritableError(
                    f"{where}: cannot create the ingest's scratch folder: {why} (this "
                    "process may read the store but not write it)"
                ) from exc
            raise StorageError(
                f"{where}: cannot create the ingest's scratch folder: {why}"
            ) from exc
        self.open: dict[str, ShardBuilder] = {}
        self.shard_of: dict[int, str] = {}
        self.shards: dict[str, int] = {}
        self.new_bytes = 0
        self._seq = 0
        self.run_specs: dict[str, FieldSpec] = {}
        self.spec_from: dict[str, str] = {}
        """The file of this task that first had each field of ``run_specs``."""
        self._head_fields = frozenset(s.name for s in ctx.base_schema)
        self._present: dict[str, bool] = {}  # objects the journal's records need (re-runs)
        self._shared: dict[Any, Any] = {}  # what files' packed results share (schemas)
        self.wrote = False
        """Whether the last :meth:`_store` wrote the object (rather than finding it)."""
        self._writes = _WriterThread(writer_pool)
        self._closing: list[ShardBuilder] = []
        """Shards queued on the writer thread to be closed and stored, until they are."""
        if writer_thread is None:
            writer_thread = writer_thread_wanted(self.cfg.workers)
        self._threaded = writer_pool is not None or writer_thread
        self._encode_threads = (
            task_cores(self.cfg.workers) if encode_threads is None else max(1, encode_threads)
        )
        self._deferred: _Deferred | None = None
        """The file whose last add is still on the writer thread, its check not yet done."""
        self._ahead: HashAhead | None = None
        """The source hashes taken in the waits for the writer thread (see ``_ahead``)."""
        self._owns_ahead = False

    def abort(self) -> None:
        self._writes.close()
        self._drop_ahead()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            deferred.listed.close()
        try:
            for b in [*self._closing, *self.open.values()]:
                try:
                    b.writer.abort()
                except Exception as exc:  # a plugin format's: the scratch goes anyway
                    _log.warning("aborting a shard writer of %s: %s", b.writer, exc)
        finally:
            self._closing.clear()
            self.open.clear()
            self._scratch.remove()

    # -- files -------------------------------------------------------------------------
    def run(self, files: Sequence[SourceFile]) -> TaskResult:
        """Turn ``files`` into stored shards and journal records: :meth:`read`, :meth:`finish`."""
        self.read(files)
        return self.finish()

    def read(self, files: Sequence[SourceFile], ahead: HashAhead | None = None) -> None:
        """Read the task's files into shards; :meth:`finish` completes the task.

        The last writes may still be on the writer thread, and the check of the last
        file waits for them. A bad file under ``on_error="fail"`` finishes what the
        files before it produced and raises; any other error aborts the task and raises.
        ``ahead``: source hashes taken ahead, shared with the tasks after this one (by
        default, with a writer thread, the task's own).
        """
        self._files = files
        if ahead is None and self._threaded:
            ahead = HashAhead(files, self.same_host)
            self._owns_ahead = True
        self._ahead = ahead
        self._results: list[FileResult] = []
        self._slots: list[list[tuple[int, int, Row]]] = []
        try:
            for src in files:
                res, raw = self._file(src)
                # a task of many small files holds every file's result until its end:
                # packed, a file's statistics are a fifth of their size as objects
                res.pack(self._shared)
                self._results.append(res)
                self._slots.append(raw)
                if self.progress is not None:
                    self.progress(src, len(raw) or len(res.rows))
        except SourceError as exc:
            if isinstance(exc, _WriteFailed):
                self.abort()  # the shard in progress holds part of a sample
                raise
            try:
                self._finish_kept()
            finally:
                self._writes.close()
                self._drop_ahead()
            raise
        except BaseException:
            self.abort()
            raise

    def finish(self) -> TaskResult:
        """After :meth:`read`: wait for the writes, check the last file, store, journal.

        The last file found changed under ``on_error="fail"`` raises once the files
        before it are stored and journaled, as :meth:`read` does for a bad file.
        """
        try:
            try:
                self._settle()
            except SourceError:
                self._finish_kept()
                raise
            except BaseException:
                self.abort()
                raise
            self._finish()
        finally:
            self._writes.close()
            self._drop_ahead()
        return TaskResult(self._results, self.shards, self.new_bytes)

    def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and self._owns_ahead:
            ahead.close()

    def _hash_step(self) -> bool:
        """One step of the next file's source hash (while the writer thread is busy)."""
        return self._ahead is not None and self._ahead.step(self._plain_hash)

    def _plain_hash(self, src: SourceFile) -> bool:
        """Whether :meth:`_read` takes ``src``'s plain hash (no CRC-32s ride on it)."""
        try:
            adapter = resolve_adapter(self.adapter, src.path, read_head(src.path))
        except Exception:  # the read says what is wrong
            return False
        return adapter is not None and not callable(getattr(adapter, "crc_ranges", None))

    def _finish_kept(self) -> None:
        """Keep what the files before a bad one produced (``on_error="fail"``).

        Their shards are stored and their records journaled, so the re-run after the fix
        redoes none of them; the task is aborted if that fails.
        """
        try:
            self._finish()
        except BaseException:
            self.abort()

    def _finish(self) -> None:
        """Close the open shards, give finished files their rows, journal them."""
        try:
            self._settle()
            for kind in list(self.open):
                self._close(kind)
        except BaseException:
            self.abort()
            raise
        self._scratch.remove()
        done = [
            (src, res, raw)
            for src, res, raw in zip(self._files, self._results, self._slots, strict=False)
            if not (res.error or res.reused)
        ]
        for _, res, raw in done:
            res.rows = [
                (k, h, self.shard_of[seq], pos, size) for seq, _, (k, h, _s, pos, size) in raw
            ]
        if done and self.ctx.config.resume:
            # the records count once the task's own record follows them: a task stopped
            # among them is redone whole (see _journal)
            task = task_digest(self.ctx, [src for src, _, _ in done])
            for src, res, _ in done:
                write_journal(self.ctx, src, res, task)
            write_task_record(self.ctx, task, len(done))

    def _file(self, src: SourceFile) -> tuple[FileResult, list[tuple[int, int, Row]]]:
        res = FileResult(path=src.path, key=src.key, size_bytes=src.size)
        if self.cfg.resume and self._may_reuse(src):
            reused = read_journal(self.ctx, src, self._present, self._versions())
            if reused is not None:
                if self._ahead is not None:
                    self._ahead.reach(src, take=False)  # not read: not hashed either
                # the schema of the task's later files, as if this one were read again
                for spec in reused.schema:
                    found = FieldSpec.from_json(spec)
                    self.run_specs[found.name] = found
                    self.spec_from.setdefault(found.name, src.path)
                return reused, []
        early = self._ahead.reach(src) if self._ahead is not None else None
        try:
            return self._ingest(src, res, early)
        except SourceError as exc:
            if isinstance(exc, _WriteFailed):
                raise
            self._bad_file(res, exc)
            return res, []

    def _versions(self) -> dict[str, str]:
        """The version of every adapter this task may read a file with, by name.

        ``auto``'s are those of the adapters it picks from; a dispatcher that does not
        list them leaves its records' versions unchecked.
        """
        if self._adapter_versions is None:
            found: dict[str, str] = {}
            listed = getattr(self.adapter, "_candidates", None)
            for a in [self.adapter, *(listed() if callable(listed) else [])]:
                with contextlib.suppress(Exception):
                    found[str(a.name)] = str(a.version)
            self._adapter_versions = found
        return self._adapter_versions

    def _bad_file(self, res: FileResult, exc: SourceError) -> None:
        """Give ``res`` the one-line message of ``exc``; raise unless ``on_error`` skips it."""
        # one line, whatever a library put in its message, and printable: a path that
        # is not UTF-8 (a source root named so) shows its bytes as escapes, a line
        # break (in a library's message, or in a file's name) as \n
        out_of = exhausted(exc)
        if out_of is not None:
            # the process's limit, not the file: every file after it would be "skipped" too
            raise StorageError(one_line(printable_text(
                f"{exc.message} (out of {out_of}: raise the limit, or ingest with fewer "
                "--workers)"))) from exc
        message = one_line(printable_text(exc.message))
        res.error = message  # a result already listed (a deferred check) is not journaled
        if self.missing_fails and isinstance(exc, SourceGone):
            raise exc
        if self.cfg.on_error == "fail":
            if message == exc.message:
                raise exc
            raise SourceError(message) from exc

    def _base(self) -> dict[str, FieldSpec]:
        """The schema a file is checked against: the dataset's and the task's files'."""
        base = {s.name: s for s in self.ctx.base_schema}
        base.update(self.run_specs)
        return base


    def _settle(self) -> None:
        """Wait for the writer thread, then check the file its last add was of.

        A file that changed while it was read (or while its last sample was written) is
        a bad file after all, though the task has gone on to the next: its result says
        so and its rows and fields are dropped, as they are for a check that fails at
        once (``on_error="fail"`` raises here).
        """
        deferred, self._deferred = self._deferred, None
        try:
            self._writes.wait(self._hash_step if self._ahead is not None else None)
        except BaseException:
            if deferred is not None:
                deferred.listed.close()
            raise
        if deferred is None:
            return
        try:
            deferred.listed.check()
        except SourceError as exc:
            res = deferred.res
            res.schema, res.stats, res.packed_stats = [], {}, b""
            deferred.raw.clear()
            for name, (spec, named) in deferred.before.items():
                if self.run_specs.get(name) is deferred.specs[name]:  # no later file's since
                    if spec is None:
                        del self.run_specs[name]
                    else:
                        self.run_specs[name] = spec
                if not named and self.spec_from.get(name) == deferred.path:
                    del self.spec_from[name]
            self._bad_file(res, exc)
        finally:
            deferred.listed.close()

    def _may_reuse(self, src: SourceFile) -> bool:
        """Whether the file's journal record may be reused: not one this run wrote.

        Without ``since``, any record. With it, a record last written after the run
        started was written by an earlier attempt of this task whose result was lost
        with its worker: the file is read again (its shards, stored then, are found and
        count as new), so the summary counts it as ingested, not reused. No record:
        one stat instead of the read that would miss.
        """
        if self.since is None:
            return True
        key = journal_key(self.ctx, src)
        try:
            written = self.ctx.store.info(key).mtime
        except NotFoundError:
            return False
        except StorageError:
            return True  # let the read say what is wrong, or find nothing
        return written < self._cutoff()

    def _ingest(
        self, src: SourceFile, res: FileResult, early: tuple[str, int] | None = None
    ) -> tuple[FileResult, list[tuple[int, int, Row]]]:
        """Read one file (or piece), checked against its listing before and after.

        A file that changed since discovery listed it (rewritten in place, replaced,
        removed) is a bad file, whatever else went wrong while reading it: its samples
        would mix two versions of it, or its lineage name another file than was read.
        """
        check_key(src.path, src.key)  # the part under the root; the root's own name may be any
        listed = ListedSource(src, self.same_host)
        deferred = False
        try:
            listed.open()
            try:
                res, raw, adapter, specs = self._read(src, res, early)
            except SourceError as exc:
                self._settle()  # this file's own last add
                try:
                    listed.check()  # a file that changed meanwhile: say that, not what broke
                except SourceError as changed:
                    if isinstance(exc, _WriteFailed):  # and still none to skip
                        raise _WriteFailed(f"{changed.message} ({_PART_WRITTEN})") from exc
                    raise
                raise
            first = src.piece is None or src.piece.index == 0
            path = src.path
            stores = first and getattr(adapter, "stores_source", False) and not os.path.isdir(path)
            if raw and self._writes.pending and not stores:
                # its last add is still being written (each add waits for the one before,
                # so what is queued is this file's): the next file is read meanwhile, and
                # this one is checked once the add is done (see _settle)
                assert self._deferred is None
                before = {n: (self.run_specs.get(n), n in self.spec_from) for n in specs}
                self._deferred = _Deferred(listed, res, raw, path, specs, before)
                deferred = True
                self._add_specs(path, specs)
                return res, raw
            self._settle()
            listed.check()
            if stores:
                key = object_key(res.source_hash)
                new = self._store(key, path, consume=False)
                try:
                    listed.check()  # changed while copied: its bytes are not this hash's
                except SourceError:
                    if self.wrote:  # the copy this call made, not an object found there
                        with contextlib.suppress(Exception):
                            self.ctx.store.delete(key)
                    raise
                if new:
                    res.new_bytes += res.size_bytes
                res.source_object = res.source_hash
        finally:
            if not deferred:
                listed.close()
        # a file that changed while read is none of the schema
        self._add_specs(path, specs)
        return res, raw

    def _add_specs(self, path: str, specs: Mapping[str, FieldSpec]) -> None:
        """File ``path``'s fields: the schema of the task's later files (they share shards)."""
        self.run_specs.update(specs)
        for name in specs:
            self.spec_from.setdefault(name, path)

    def _read(
        self, src: SourceFile, res: FileResult, early: tuple[str, int] | None = None
    ) -> tuple[FileResult, list[tuple[int, int, Row]], Any, dict[str, FieldSpec]]:
        """The adapter's samples of the file into shards; its result, rows, adapter, specs.

        ``early``: the file's plain hash and size, taken ahead (see ``_ahead``).
        """
        path = src.path
        try:
            adapter = resolve_adapter(self.adapter, path, read_head(path))
        except OSError as exc:
            raise SourceError(f"{path}: unreadable: {exc}") from exc
        if adapter is None:
            raise SourceError(f"{path}: no installed adapter reads this file")
        res.adapter, res.adapter_version = adapter.name, str(adapter.version)
        res.software = software(libraries_of(adapter, *self.formats.values()))
        options = self.cfg.adapter_params()
        if src.piece is None:
            ranges = crc_ranges(adapter, path)
            if ranges:
                # the adapter's CRC-32 checks of parts of the file ride on the hash's pass
                oid, res.size_bytes, crcs = hash_file_checked(path, ranges)
                res.source_hash = str(oid)
                options["checked_crcs"] = {
                    r: c for r, c in zip(ranges, crcs, strict=True) if c is not None
                }
            else:
                res.source_hash, res.size_bytes = early or hash_source(path)
        else:
            # a piece reads its own samples; only the first hashes the file (for lineage)
            if src.piece.index == 0:
                res.source_hash = (early or hash_source(path))[0]
            options["sample_range"] = [src.piece.start, src.piece.stop]
        options["source_hash"] = res.source_hash
        options["tmp_dir"] = self.tmp
        specs: dict[str, FieldSpec] = {}
        base = self._base()
        file_stats = StatsAccumulator()
        try:
            samples = iter(adapter.iter_samples(path, src.key, options))
        except BaseException as exc:  # an adapter failing on a file means a bad file
            raised = as_bad_file(exc, path)
            if raised is exc:
                raise
            raise raised from exc
        fresh = getattr(adapter, "fresh_arrays", False) is True
        raw = self._samples(path, samples, specs, base, file_stats, fresh)
        if src.piece is not None and len(raw) != src.piece.stop - src.piece.start:
            raise SourceError(
                f"{path}: the adapter gave {len(raw)} samples for samples {src.piece.start} "
                f"to {src.piece.stop - 1} of the file (it must honour sample_range)"
            )
        res.schema = [specs[n].to_json() for n in sorted(specs)]  # type: ignore[misc]
        res.stats = file_stats.to_json()
        return res, raw, adapter, specs

    def _samples(
        self,
        path: str,
        samples: Iterator[Sample],
        specs: dict[str, FieldSpec],
        base: dict[str, FieldSpec],
        file_stats: StatsAccumulator,
        fresh: bool = False,
    ) -> list[tuple[int, int, Row]]:
        """The adapter's samples of file ``path`` checked, hashed, summarised and added.

        Their rows: ``(shard sequence, position, row)``. The last add may still be running
        on the writer thread (see :class:`_WriterThread`). ``fresh``: the adapter's arrays
        are its samples' own (``fresh_arrays``), not copied (see ``_guard``).
        """
        raw: list[tuple[int, int, Row]] = []
        keys: set[str] = set()
        while True:
            try:
                sample = next(samples)
            except StopIteration:
                break
            except BaseException as exc:  # an adapter failing on a file means a bad file
                raised = as_bad_file(exc, path)
                if raised is exc:
                    raise
                raise raised from exc
            if not isinstance(sample, Sample):
                raise SourceError(
                    f"{path}: the adapter gave a {type(sample).__name__} where a "
                    "simstore.sample.Sample is due"
                )
            sample = owned_sample(sample, path, fresh)
            if not isinstance(sample.key, str) or not sample.key or sample.key in keys:
                raise SourceError(
                    f"{path}: the adapter gave a missing or repeated key {sample.key!r}"
                )
            keys.add(sample.key)
            try:
                self._check_fields(path, sample, specs, base)
            except SourceError:
                if self._deferred is None:
                    raise
                # the refusal may come from the fields of the file before, not yet
                # checked: check it now (a changed file's fields are none of the schema)
                self._settle()
                base.clear()
                base.update(self._base())
                self._check_fields(path, sample, specs, base)
            sample_stats = StatsAccumulator()
            try:
                digest = hash_sample_blocks(
                    sample,
                    self.cfg.block_bytes,
                    on_block=sample_stats.add_array,
                    on_scalar=sample_stats.add_scalar,  # type: ignore[arg-type]
                )
            except SourceError:
                raise
            except (InvalidInputError, ValueError, TypeError) as exc:
                raise SourceError(f"{path}: sample {sample.key!r}: {exc}") from exc
            fields_stats = sample_stats.to_json()
            if self.cfg.nan == "error":
                for name, s in fields_stats.items():
                    if name.endswith(_MISSING_MARKERS):
                        continue  # a NaN there marks missing values; it is no value itself
                    nan, inf = sum(s["nan_count"]), sum(s.get("inf_count", [0]))
                    if nan or inf:
                        raise SourceError(
                            f"{path}: field {name!r}: {nan} NaN and {inf} Inf values in sample "
                            f"{sample.key!r} (--nan error)"
                        )
            size = sample_nbytes(sample)
            kind = self._route(sample)
            b = self._builder(kind)
            new = [n for n in sample.fields if n not in b.specs]
            groups = FieldGroups(b.specs) if new else None
            if any(b.specs.get(n, s) != s for n, s in specs.items() if n in sample.fields) or (
                groups is not None and any(groups.clash(n) is not None for n in new)
            ):
                # an accepted type change (allow_schema_change) starts a new shard, and so
                # does a field that is a group of one of the shard's (or lies under one),
                # which a Zarr shard cannot hold: a dataset that has both from before they
                # were refused, or a sample left in the shard by a file skipped part way
                self._close(kind)
                b = self._builder(kind)
            b.specs.update({n: specs[n] for n in sample.fields})
            position = b.count
            self._settle()  # the add before this one, and the check of its file if that is done
            if (
                self._threaded
                and size >= HANDOFF_BYTES
                and getattr(b.writer, "writes_in_add", False)
                and not any(is_array_source(v) for v in sample.fields.values())
            ):
                # the sample's arrays are in memory (pooled, or mapped from its file, which
                # is checked once they are written): the next one is read meanwhile
                self._writes.submit(_add, b.writer, sample, str(digest), size, position)
            else:
                try:
                    position = b.writer.add(sample, sample_hash=digest,
                                            size_bytes=size).position
                except SourceError as exc:
                    raise _WriteFailed(f"{exc.message} ({_PART_WRITTEN})") from exc
            raw.append((b.seq, position, (sample.key, str(digest), "", position, size)))
            b.stats.merge(fields_stats)
            file_stats.merge(fields_stats)
            b.size_bytes += size
            b.count += 1
            if b.size_bytes >= self.cfg.shard_size:
                self._close(kind)
        return raw

    def _route(self, sample: Sample) -> str:
        if self.cfg.format == "zarr":
            return "zarr"
        # an array too large for one columnar value goes to Zarr whatever the thresholds:
        # Parquet refuses a value of 2 GiB or more (with a raw error after the whole row
        # was encoded), and a Lance file of one over 4 GiB was written but could not be read
        limit = min(self.cfg.zarr_threshold, self.cfg.dense_threshold, COLUMNAR_VALUE_BYTES)
        for value in sample.fields.values():
            if is_array_source(value) or (
                isinstance(value, np.ndarray) and value.nbytes > limit
            ):
                return "zarr"
        return self.cfg.format

    def _check_fields(
        self, path: str, sample: Sample, specs: dict[str, FieldSpec], base: Mapping[str, FieldSpec]
    ) -> None:
        names = set(sample.fields)
        odd = next((n for n in names if not isinstance(n, str)), None)
        if odd is not None:  # sorted() below failed on it, with a traceback
            raise SourceError(
                f"{path}: a field name must be text, not {type(odd).__name__} ({odd!r:.60})")
        known: FieldGroups | None = None  # specs and base, built at the first new field
        for name in sorted(names):
            parts = name.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in names:
                    raise SourceError(
                        f"{path}: field {name!r} lies under field {'/'.join(parts[:i])!r}; a "
                        "field cannot also be a group of fields"
                    )
            if name not in specs and name not in base:
                # a new field: neither a group of nor under a field of earlier samples (of
                # this file, of the task's earlier files, of the dataset)
                if known is None:
                    known = FieldGroups(specs.keys() | base.keys())
                other = known.clash(name)
                if other is not None:
                    if other in specs:
                        where = "this file"
                    elif other in self._head_fields:
                        where = f"dataset {self.ctx.dataset!r}"
                    else:
                        where = self.spec_from.get(other, "an earlier file")
                    raise SourceError(group_clash_message(path, name, other, where))
            try:
                spec = spec_of_value(name, sample.fields[name])
            except InvalidInputError as exc:
                raise SourceError(f"{path}: field {name!r}: {exc}") from exc
            prev = specs.get(name) or base.get(name)
            if prev is not None and prev != spec and not self.cfg.allow_schema_change:
                raise SourceError(
                    f"{path}: field {name!r} changes type from {prev.describe()} to "
                    f"{spec.describe()} (use --allow-schema-change to accept)"
                )
            specs[name] = spec
            if known is not None:
                known.add(name)


def run_task(
    ctx: TaskContext, files: Sequence[SourceFile], plugins: Plugins, worker: str = ""
) -> TaskResult:
    """Run one task (in this process) and time it.

    The adapter and formats travel pickled with the task, so a worker process does not
    scan the installed packages' entry points again.
    """
    t0 = time.perf_counter()
    result = TaskRunner(ctx, plugins=plugins).run(files)
    result.seconds = time.perf_counter() - t0
    result.worker = worker or f"pid {os.getpid()}"
    return result


def warm_up(plugins: Plugins) -> int:
    """Nothing but arriving: a worker process that ran this has imported what tasks need.

    (Unpickling ``plugins`` imports the adapter's and the formats' modules.)
    """
    return os.getpid()
