"""The driver of an ingest: discover, plan, run the tasks on an engine, check, stage, commit.

Staging happens once, after every task succeeded (or was skipped under
``on_error="skip"``): a failed or killed run stages nothing, so no snapshot or staging
entry references what it wrote (gc reclaims it; the journal speeds up the re-run).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Unpack

from simstore import _buffers
from simstore._env import is_utf8
from simstore.catalog import Catalog, read_gc_state
from simstore.errors import InvalidInputError, SourceError
from simstore.hashing import hash_bytes
from simstore.ingest._config import (
    IngestConfig,
    IngestOptions,
    IngestProgress,
    IngestResult,
    SkippedFile,
    TaskTiming,
    printable_text,
)
from simstore.ingest._engine import EngineRun, run_local
from simstore.ingest._fieldgroups import FieldGroups, group_clash_message
from simstore.ingest._plugins import plugins_for
from simstore.ingest._records import FileResult, SourceFile, TaskContext, TaskResult
from simstore.ingest._sources import discover, host_token, plan_tasks, sample_counter
from simstore.ingest._stage import stage
from simstore.names import check_name
from simstore.sample import FieldSpec, Schema, canonical_json, merge_schema
from simstore.stats import merge_stats
from simstore.storage import ObjectStore

__all__ = ["ingest"]

log = logging.getLogger("simstore.ingest")


def _head_hashes(catalog: Catalog, snap: Any, keys: Sequence[str]) -> dict[str, str]:
    """Sample hashes the snapshot holds for sorted ``keys``; reads only the parts they fall in."""
    parts = snap.parts
    firsts = [p.first_key for p in parts]
    needed = set()
    for key in keys:
        i = bisect.bisect_right(firsts, key) - 1
        if i >= 0 and key <= parts[i].last_key:
            needed.add(i)
    wanted = set(keys)
    out: dict[str, str] = {}
    for i in sorted(needed):
        table = catalog.read_part(parts[i], snapshot=snap.id)
        for k, h in zip(
            table.column("key").to_pylist(), table.column("sample_hash").to_pylist(), strict=True
        ):
            if k in wanted:
                out[k] = h.hex()
    return out


def _source_paths(sources: object) -> list[str]:
    """``sources`` as a list of path strings, or an :class:`InvalidInputError` naming it.

    A bare path is one source. An empty path is refused, not read as the working
    folder: ``simstore ingest "$RUNS"`` with ``RUNS`` unset must not ingest ``.``.
    """
    if isinstance(sources, str | os.PathLike):
        items: list[object] = [sources]
    elif isinstance(sources, bytes | bytearray | memoryview) or not isinstance(
        sources, Iterable
    ):
        raise InvalidInputError(
            f"invalid sources {sources!r}: give a path, or a list of paths (str or os.PathLike)"
        )
    else:
        items = list(sources)
    if not items:
        raise InvalidInputError("no sources given")
    out = []
    for item in items:
        if not isinstance(item, str | os.PathLike):
            raise InvalidInputError(
                f"invalid source {item!r}: a source is a path (str or os.PathLike)"
            )
        path = os.fspath(item)
        if not isinstance(path, str):
            raise InvalidInputError(
                f"invalid source {item!r}: a source is a path (str or os.PathLike)"
            )
        if not path:
            raise InvalidInputError(
                "invalid source '': an empty path (an unset variable?); "
                "name the folder, '.' for the current one"
            )
        out.append(path)
    return out


def _warn_unless_utf8_names() -> None:
    """Say, once, that this process reads file names in another encoding than UTF-8.

    Keys are read from file names' bytes whatever the locale; the names inside a Zarr
    folder, the files a ``.pvd`` or ``.xdmf`` lists and CAD paths go through Python's
    own decoding, so under a Latin-1 locale they differ from a UTF-8 run's, or are not
    found. The command line runs in UTF-8 mode itself; a pipeline should too.
    """
    encoding = sys.getfilesystemencoding()
    if not is_utf8(encoding) and not _WARNED:
        _WARNED.append(encoding)
        log.warning(
            "this process reads file names as %s, not UTF-8: run Python in UTF-8 mode "
            "(python -X utf8, or PYTHONUTF8=1) so that names with other than ASCII "
            "characters give the same keys and fields as elsewhere", encoding)


_WARNED: list[str] = []


def ingest(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    dataset: str,
    store: str | os.PathLike[str] | ObjectStore | Catalog,
    config: IngestConfig | None = None,
    progress: Callable[[IngestProgress], None] | None = None,
    **options: Unpack[IngestOptions],
) -> IngestResult:
    """Ingest source files or folders into ``dataset``; stage the change, optionally commit.

    ``options`` override fields of ``config`` (see :class:`IngestConfig`), so a pipeline
    writes ``simstore.ingest(["runs/"], dataset="cfd", store="s3://b/p", workers=8,
    snapshot=True, message="nightly")``. Call it under ``if __name__ == "__main__":`` when
    ``workers > 1`` or ``engine="dask"``: a ``LocalCluster``, and the process pool while
    other Python threads run, start workers with ``spawn``.

    With ``engine="dask"`` the tasks run on the dask.distributed scheduler at ``address``
    (or a ``LocalCluster`` on 127.0.0.1): workers open the store from its URL and options,
    write shards and journal records, and return manifest rows; this process stages them
    and commits once. Same sources, same content and shards, whatever the engine.

    Raises :class:`SourceError` for a bad file (naming file and field) unless
    ``on_error="skip"``, :class:`InvalidInputError` for bad options; a failed run stages
    nothing. Re-running after a failure or a finished run redoes no finished file.
    """
    t0 = time.perf_counter()
    if config is not None and not isinstance(config, IngestConfig):
        raise InvalidInputError(
            f"invalid config {config!r}: an IngestConfig (or give its fields as keywords)"
        )
    if progress is not None and not callable(progress):
        raise InvalidInputError(f"invalid progress {progress!r}: a callable or None")
    try:
        cfg = dataclasses.replace(config or IngestConfig(), **options)
    except TypeError as exc:
        raise InvalidInputError(f"invalid ingest option: {exc}") from None
    check_name(dataset, "dataset name")
    srcs = _source_paths(sources)
    _warn_unless_utf8_names()
    catalog = store if isinstance(store, Catalog) else Catalog.open(store)
    if catalog.store.url.startswith("memory://"):
        if cfg.engine == "dask":
            raise InvalidInputError(
                "a memory:// store lives in one process, so dask workers cannot reach it: "
                "use a store every worker reaches (s3://bucket/prefix, or a path on a "
                "shared filesystem)"
            )
        if cfg.workers > 1:
            raise InvalidInputError("a memory:// store lives in one process: use workers=1")
    if cfg.snapshot:
        catalog.check_commit_branch(dataset, cfg.branch)  # before anything is read
    else:
        # a staged run dedups against the branch, and a later snapshot commits onto it: a
        # name the dataset has no branch of is refused here too
        catalog.require_branch(dataset, cfg.branch)
    plugins = plugins_for(cfg)
    cfg.check_adapter_options(plugins[0])
    files, ignored = discover(srcs, plugins[0])
    if not files:
        raise InvalidInputError(
            printable_text(f"no source files found in {', '.join(srcs)}")
            + (f" ({len(ignored)} files no adapter reads)" if ignored else "")
        )
    head_id, _ = catalog.branches(dataset).get_versioned(cfg.branch)
    head = (catalog.snapshot(head_id, named_by=f"branch {dataset}@{cfg.branch}",
                             dataset=dataset) if head_id else None)
    # what the next commit's schema will be before this run's files: the head's, then
    # each staged entry's (a commit applies them in that order, and one accepted with
    # --allow-schema-change wins), so a file that breaks a staged entry's types is
    # refused here, naming it, not at the commit that would meet both
    base: Schema = tuple(head.schema) if head else ()
    # what the commit of an --snapshot ingest merges this run's entry into, whatever else
    # it takes: the head's schema, or the last staged replace's (always taken, as it
    # changes every key). Entries staged with --allow-schema-change that the commit does
    # not take do not count: a file must agree with this as well, unless this run allows
    # the change too (the commit would refuse it, with this run's entry staged)
    committed: Schema = tuple(head.schema) if head else ()
    for entry in catalog.staged(dataset):
        base = merge_schema(base, tuple(entry.schema), allow_change=True)
        if entry.mode == "replace":
            committed = tuple(entry.schema)
    strict = cfg.snapshot and cfg.mode == "upsert" and not cfg.allow_schema_change
    ctx = TaskContext(
        store=catalog.store,
        dataset=dataset,
        config=cfg,
        base_schema=base,
        params_digest=hash_bytes(canonical_json(cfg.output_params())),
        listed_on=host_token(),
    )
    tasks = plan_tasks(
        files, cfg.shard_size, sample_counter(plugins[0], cfg.adapter_params()), cfg.piece_bytes
    )
    # before anything is stored: a gc that runs from now until staging is seen (``_stage.stage``)
    gc_before = read_gc_state(catalog.store)
    totals = {"files": 0, "bytes": 0, "samples": 0}
    bytes_total = sum(f.size for f in files)

    def report(n_files: int, n_bytes: int, n_samples: int) -> None:
        totals["files"] += n_files
        totals["bytes"] += n_bytes
        totals["samples"] += n_samples
        if progress is not None:
            progress(
                IngestProgress(
                    files_done=totals["files"],
                    files_total=len(files),
                    samples=totals["samples"],
                    bytes_done=totals["bytes"],
                    bytes_total=bytes_total,
                    elapsed_s=time.perf_counter() - t0,
                )
            )

    if cfg.engine == "dask":
        from simstore.ingest._dask import run_dask  # dask is an optional extra

        run = run_dask(ctx, tasks, plugins, report)
    else:
        try:
            run = run_local(ctx, tasks, plugins, report)
        finally:
            # this process read sources into its pool of memory: give the idle part back
            _buffers.POOL.release()
    return _finish(
        catalog, ctx, files, ignored, run, tasks, head, committed if strict else (), t0,
        gc_before,
    )


def _whole_files(
    results: Sequence[TaskResult], tasks: Sequence[Sequence[SourceFile]], cfg: IngestConfig
) -> list[FileResult]:
    """Every file's result in plan order, the pieces of a file cut into pieces joined."""
    out: list[FileResult] = []
    pieces: list[FileResult] = []
    for res, task in zip(results, tasks, strict=True):
        for src, fr in zip(task, res.files, strict=True):
            if src.piece is None:
                out.append(fr)
                continue
            pieces.append(fr)
            if src.completes_file:
                out.append(_join(pieces, cfg))
                pieces = []
    return out


def _bytes_read(results: Sequence[TaskResult]) -> int:
    """Source bytes this run read: files and pieces not taken from the journal.

    Counted per planned entry, before pieces are joined: a file of which only some
    pieces were redone counts those pieces' shares of its bytes (a piece's share is an
    estimate, the file's size split in proportion to its samples), not the whole file.
    The first piece also hashes the whole file, as a whole file is hashed as well as
    read: that pass is not counted again, for pieces as for whole files.
    """
    return sum(fr.size_bytes for res in results for fr in res.files if not fr.reused)


def _join(pieces: Sequence[FileResult], cfg: IngestConfig) -> FileResult:
    """One file's result from its pieces' (in order): rows, schema and exact statistics.

    Pieces that disagree (a key in two of them, a field whose type changes) make the file
    a bad file: an error, or skipped under ``on_error="skip"``.
    """
    first = pieces[0]
    whole = FileResult(
        path=first.path,
        key=first.key,
        size_bytes=sum(p.size_bytes for p in pieces),
        source_hash=first.source_hash,  # only the first piece hashes the file
        adapter=first.adapter,
        adapter_version=first.adapter_version,
        reused=all(p.reused for p in pieces),
        source_object=first.source_object,
        new_bytes=sum(p.new_bytes for p in pieces),
        software=_joined_software(pieces),
    )
    whole.error = next((p.error for p in pieces if p.error is not None), None)
    if whole.error is not None:
        return whole
    rows = [row for p in pieces for row in p.rows]
    schema: Schema = ()
    try:
        if len({r[0] for r in rows}) != len(rows):
            raise SourceError(f"{first.path}: the adapter gave one key in two pieces of the file")
        for p in pieces:
            specs = tuple(FieldSpec.from_json(s) for s in p.schema)
            schema = merge_schema(
                schema, specs, source=first.path, allow_change=cfg.allow_schema_change
            )
    except (SourceError, InvalidInputError) as exc:
        if cfg.on_error == "fail":
            raise SourceError(printable_text(str(exc))) from exc
        whole.error = printable_text(str(exc))
        return whole
    whole.rows = rows
    whole.schema = [s.to_json() for s in schema]  # type: ignore[misc]
    whole.stats = merge_stats(p.field_stats() for p in pieces)
    return whole


def _group_clash(
    path: str, specs: Sequence[FieldSpec], field_from: Mapping[str, str]
) -> str | None:
    """The error for a field of file ``path`` that is a group of another field, or None.

    The other field is one of the run's merged schema (``field_from``: the head
    snapshot's fields and the accepted files', each with where it came from) or of the
    file itself (its pieces, read on different workers, or its samples): ``a`` and
    ``a/b`` cannot both be fields of a dataset, in any order and on any worker.
    """
    own = {s.name for s in specs}
    fresh = sorted(own - field_from.keys())  # fields already merged were checked
    if not fresh:
        return None
    known = FieldGroups(own | field_from.keys())
    for name in fresh:
        other = known.clash(name)
        if other is not None:
            where = "this file" if other not in field_from else field_from[other]
            return group_clash_message(path, name, other, where)
    return None


def _timings(run: EngineRun, tasks: Sequence[Sequence[SourceFile]]) -> tuple[TaskTiming, ...]:
    return tuple(
        TaskTiming(
            task=i,
            worker=res.worker,
            files=len(task),
            bytes_in=sum(f.size for f in task),
            samples=sum(len(f.rows) for f in res.files),
            shards=len(res.shards),
            seconds=res.seconds,
            failed=res.failed,
        )
        for i, (res, task) in enumerate(zip(run.results, tasks, strict=True))
    )


def _finish(
    catalog: Catalog,
    ctx: TaskContext,
    files: Sequence[SourceFile],
    ignored: Sequence[str],
    run: EngineRun,
    tasks: Sequence[Sequence[SourceFile]],
    head: Any,
    committed: Schema,
    t0: float,
    gc_before: bytes | None = None,
) -> IngestResult:
    """Check the run as a whole (schema across files, unique keys), then stage and commit.

    ``gc_before``: the store's gc record when the run started (see :func:`._stage.stage`).

    ``committed``: the schema the commit will merge the staged entry into, for a
    ``--snapshot`` run that does not allow schema changes (else empty): a file that
    changes a field type of it is a bad file, as one that breaks the run's schema.
    """
    cfg = ctx.config
    results: Sequence[TaskResult] = run.results
    schema: dict[str, FieldSpec] = {s.name: s for s in ctx.base_schema}
    skipped: list[SkippedFile] = []
    accepted: list[FileResult] = []
    owner: dict[str, str] = {}
    # where each field of the merged schema comes from: the head snapshot or a file
    field_from = dict.fromkeys(schema, f"dataset {ctx.dataset!r}")
    commit_schema = {s.name: s for s in committed}
    head_schema = {s.name: s for s in head.schema} if head is not None else {}
    reranked: set[str] = set()
    file_results = _whole_files(results, tasks, cfg)
    parsed: dict[int, list[FieldSpec]] = {}  # files of one schema share its list (packed)

    def parse(res: FileResult) -> list[FieldSpec]:
        if id(res.schema) not in parsed:
            parsed[id(res.schema)] = [FieldSpec.from_json(s) for s in res.schema]
        return parsed[id(res.schema)]

    specs_of = {res.path: parse(res) for res in file_results if res.error is None}
    run_ranks: dict[str, set[int]] = {}  # the ranks this run's files give each tensor
    for specs in specs_of.values():
        for spec in specs:
            if spec.kind == "tensor":
                run_ranks.setdefault(spec.name, set()).add(spec.ndim)

    def reject(res: FileResult, message: str) -> None:
        message = printable_text(message)  # a path that is not UTF-8: its bytes escaped
        if cfg.on_error == "fail":
            raise SourceError(message)
        skipped.append(SkippedFile(path=res.path, reason=message))

    for res in file_results:
        if res.error is not None:
            skipped.append(SkippedFile(path=res.path, reason=printable_text(res.error)))
            continue
        specs = specs_of[res.path]
        if any(_reranked(s, head_schema, run_ranks) for s in specs):
            reranked.add(res.path)
        bad = None
        for known_types in (schema, commit_schema):
            bad = next((s for s in specs if known_types.get(s.name, s) != s), None)
            if bad is not None:
                break
        if bad is not None and not cfg.allow_schema_change:
            reject(
                res,
                f"{res.path}: field {bad.name!r} changes type from "
                f"{known_types[bad.name].describe()} to {bad.describe()} "
                "(use --allow-schema-change to accept)",
            )
            continue
        clash = _group_clash(res.path, specs, field_from)
        if clash is not None:
            reject(res, clash)
            continue
        dup = next((r[0] for r in res.rows if r[0] in owner), None)
        if dup is not None:
            reject(res, f"{res.path}: sample key {dup!r} is also produced by {owner[dup]}")
            continue
        for r in res.rows:
            owner[r[0]] = res.path
        schema = {
            s.name: s
            for s in merge_schema(
                tuple(schema.values()),
                tuple(specs),
                source=res.path,
                allow_change=cfg.allow_schema_change,
            )
        }
        for spec in specs:
            field_from.setdefault(spec.name, res.path)
        accepted.append(res)
    if accepted and cfg.chunks:
        _check_chunks(cfg, accepted)
    unchanged: set[str] = set()
    known: dict[str, str] = {}
    pending = catalog.staged_keys(ctx.dataset) if accepted else {}
    if head is not None and cfg.mode == "upsert" and accepted:
        known = _head_hashes(catalog, head, sorted(owner))
        # a key a staged entry changes is not the head's any more: its file is staged
        # again, so this ingest's samples are the last change when the entries commit
        touched: set[str] = set()
        for keys in pending.values():
            touched.update(keys if keys is not None else owner)
        for res in accepted:
            if res.path in reranked:
                continue
            if res.rows and all(known.get(k) == h and k not in touched for k, h, *_ in res.rows):
                unchanged.add(res.path)
    staged = [r for r in accepted if r.path not in unchanged]
    rows = [row for r in staged for row in r.rows]
    # checked against the head: no staged key exists there, so merged statistics stay exact
    new_keys_in = head.id if head is not None and not any(r[0] in known for r in rows) else None
    shards = sorted({row[2] for row in rows})
    new_bytes = sum(r.new_bytes for r in results) + sum(f.new_bytes for f in file_results)
    staging_id: str | None = None
    snapshot_id: str | None = None
    final_schema = tuple(schema[n] for n in sorted(schema))
    if staged:
        staging_id, snapshot_id, extra = stage(
            catalog, ctx, run, staged, rows, shards, _own_schema(staged), new_keys_in,
            pending, head, gc_before,
        )
        new_bytes += extra
    elif cfg.snapshot and head is not None:
        snapshot_id = head.id
    if snapshot_id is not None:
        final_schema = tuple(catalog.snapshot(snapshot_id).schema)  # what was committed
    written = {oid: size for r in results for oid, size in r.shards.items()}
    return IngestResult(
        dataset=ctx.dataset,
        files=len(files),
        files_ingested=sum(1 for r in accepted if not r.reused),
        files_reused=sum(1 for r in accepted if r.reused),
        files_unchanged=len(unchanged),
        files_skipped=tuple(skipped),
        files_ignored=tuple(ignored),
        samples=sum(len(r.rows) for r in accepted),
        samples_staged=len(rows),
        bytes_in=sum(r.size_bytes for r in file_results),
        bytes_read=_bytes_read(results),
        bytes_stored=sum(written.values()),
        new_bytes=new_bytes,
        shards=len(written),
        seconds=time.perf_counter() - t0,
        engine=run.engine,
        workers=run.workers,
        staging_id=staging_id,
        snapshot_id=snapshot_id,
        schema=final_schema,
        tasks=_timings(run, tasks),
    )


def _reranked(spec: FieldSpec, head: Mapping[str, FieldSpec],
              run_ranks: Mapping[str, set[int]]) -> bool:
    """Whether a file's field went from a 0-d tensor to a vector, or back, against the head.

    A sample hash cannot tell a 0-d tensor from a one-element vector (the recipe hashes
    both as shape (1,)), so such a file is staged whatever its hashes. Only when this
    run's files agree on the new rank: a dataset that mixes both ranks in one field would
    otherwise restage a file, and flip the head's schema, on every re-ingest.
    """
    was = head.get(spec.name)
    return (
        spec.kind == "tensor" and was is not None and was.kind == "tensor"
        and {was.ndim, spec.ndim} == {0, 1} and run_ranks.get(spec.name) == {spec.ndim}
    )


def _own_schema(staged: Sequence[FileResult]) -> Schema:
    """The schema of the samples an entry stages: its files' field types, nothing else.

    Not the branch head's nor earlier staged entries' (the files were checked against
    those): a commit merges the entry's schema into the head's, or, for ``--mode replace``,
    starts from it, so fields or types carried over from elsewhere would be listed by a
    snapshot none of whose samples has them. Where files disagree on a field (accepted
    with ``--allow-schema-change``), the later file's type wins, as in the run's check.
    """
    schema: Schema = ()
    for res in staged:
        specs = tuple(FieldSpec.from_json(s) for s in res.schema)
        schema = merge_schema(schema, specs, allow_change=True)
    return schema


def _check_chunks(cfg: IngestConfig, accepted: Sequence[FileResult]) -> None:
    """Refuse a ``chunks`` entry that names no array field of this ingest, or another rank.

    Field names are known only once the files are read, so this runs after the tasks and
    before anything is staged: the dataset is left as it was (the shards written meanwhile
    are reachable from nothing, and gc reclaims them).
    """
    arrays: dict[str, int] = {}
    for res in accepted:
        for obj in res.schema:
            spec = FieldSpec.from_json(obj)
            if spec.kind in ("tensor", "bytes"):
                arrays.setdefault(spec.name, spec.ndim if spec.kind == "tensor" else 1)
    for name, shape in sorted(cfg.chunks.items()):
        if name not in arrays:
            raise InvalidInputError(
                f"chunks names field {name!r}, which no sample of this ingest has as an "
                f"array; array fields: {_listing(sorted(arrays))}"
            )
        if len(shape) != arrays[name]:
            raise InvalidInputError(
                f"chunks for field {name!r} has {len(shape)} axes; the field has "
                f"{arrays[name]}"
            )


def _listing(names: Sequence[str], most: int = 20) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _joined_software(pieces: Sequence[FileResult]) -> dict[str, str]:
    """The pieces' versions; where workers differed, each version seen, joined by " / "."""
    seen: dict[str, list[str]] = {}
    for p in pieces:
        for name, version in p.software.items():
            if version not in seen.setdefault(name, []):
                seen[name].append(version)
    return {name: " / ".join(versions) for name, versions in sorted(seen.items())}
