"""Catalog commands: init, snapshot, delete, log, show, ls, diff, tag, branch, verify, gc."""

from __future__ import annotations

import datetime
import functools
import math
import re
from collections.abc import Callable
from typing import Any

import click
from simstore.cli._common import (
    CliContext,
    check_at_least,
    check_message,
    check_not_empty,
    emit,
    handle_errors,
    pass_ctx,
    progress_shown,
    text_arg,
)

from simstore._sizes import human_bytes
from simstore.catalog import Catalog, VerifyProgress, gc, verify
from simstore.errors import (
    ConflictError,
    FormatError,
    InvalidInputError,
    NotFoundError,
    one_line,
)
from simstore.manifest import rows_from_list
from simstore.names import parse_ref
from simstore.sample import canonical_json
from simstore.snapshot import Snapshot

__all__ = ["COMMANDS", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str, flag: str | None = None) -> float:
    """Seconds in ``30s``, ``15m``, ``1h``, ``7d``, ``2w`` or a bare number of seconds.

    An error names ``flag`` (``--grace``) when it is given.
    """
    m = _DURATION.match(text)
    if not m:
        where = f"{flag}: " if flag else ""
        raise InvalidInputError(
            f"{where}invalid duration {text!r}: expected e.g. 30s, 15m, 1h, 7d"
        )
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not math.isfinite(seconds):  # hundreds of digits: no duration float64 holds
        where = f"{flag}: " if flag else ""
        raise InvalidInputError(f"{where}duration {text[:40]!r} is too large")
    return seconds


def snapshot_summary(sid: str, snap: Snapshot) -> dict[str, Any]:
    """The fields ``show --json`` prints."""
    return {
        "id": sid,
        "dataset": snap.dataset,
        "parents": list(snap.parents),
        "message": snap.message,
        "author": snap.author,
        "created": snap.created,
        "samples": snap.samples,
        "bytes": snap.sample_bytes,
        "manifest_parts": len(snap.parts),
        "manifest_bytes": snap.manifest_bytes,
        "content_hash": snap.content_hash,
        "schema": [s.to_json() for s in snap.schema],
        "software": written_with(snap),
    }


def written_with(snap: Snapshot) -> list[dict[str, str]]:
    """The distinct sets of versions this snapshot's ingests wrote their files with.

    Those of the commit's own ingests (staged entries it consumed); a snapshot made by
    other operations (a delete, a merge) or by ingests that predate the record lists none.
    """
    seen: dict[str, dict[str, str]] = {}
    ingests = snap.lineage.get("ingests", [])
    for entry in ingests if isinstance(ingests, list) else []:
        sets = entry.get("software", []) if isinstance(entry, dict) else []
        for versions in sets if isinstance(sets, list) else []:
            if isinstance(versions, dict):
                clean = {str(k): str(v) for k, v in sorted(versions.items())}
                seen[canonical_json(clean).decode()] = clean
    return [seen[k] for k in sorted(seen)]


@click.command("init")
@pass_ctx
@handle_errors
def init_cmd(ctx: CliContext) -> None:
    """Initialise a store (idempotent)."""
    ctx.check_local_store()  # a file there: one line naming it, and the file untouched
    cat = Catalog.init(ctx.store_url, storage_options=ctx.storage_options)
    meta = cat.check_initialised()
    cw = "yes" if meta.get("conditional_writes") else "no"
    # a store that was there already (perhaps one this process may only read) is named
    # as such: nothing was written to it
    done = "initialised" if cat.created else "already initialised"
    click.echo(f"{done} {cat.store.url} (conditional writes: {cw})")


@click.command("snapshot")
@click.argument("dataset")
@click.option("-m", "--message", required=True, help="Snapshot message.")
@click.option("--branch", default="main", show_default=True)
@click.option("--author", default=None, help="Author (default: the current user).")
@click.option("--allow-schema-change", is_flag=True, help="Accept changed field types.")
@click.option("--allow-empty", is_flag=True,
              help="Make a snapshot even with nothing staged (its parent's content).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@handle_errors
def snapshot_cmd(
    ctx: CliContext,
    dataset: str,
    message: str,
    branch: str,
    author: str | None,
    allow_schema_change: bool,
    allow_empty: bool,
    as_json: bool,
) -> None:
    """Commit everything staged for DATASET as a new snapshot on a branch."""
    message = text_arg(message)
    author = text_arg(author)
    check_message(message)
    check_not_empty(author, "--author", "empty (leave --author out for the current user)")
    cat = ctx.catalog()
    # an unknown dataset is the library's NotFoundError (exit 3), as for every command
    res = cat.commit(
        dataset,
        message=message,
        branch=branch,
        author=author,
        allow_schema_change=allow_schema_change,
        allow_empty=allow_empty,
    )
    lines = [f"{dataset}@{branch} -> {res.snapshot_id} ({res.samples} samples)"]
    if res.overwritten_concurrent:
        lines.append(
            f"note: {len(res.overwritten_concurrent)} keys were also written by a concurrent "
            f"commit; this later commit wins: {', '.join(res.overwritten_concurrent[:5])}"
        )
    if res.overwritten_staged:
        lines.append(
            f"note: {len(res.overwritten_staged)} keys were written by more than one staged "
            f"entry; the one staged last wins: {', '.join(res.overwritten_staged[:5])}"
        )
    emit(as_json, res.to_json(), "\n".join(lines))


@click.command("delete")
@click.argument("dataset")
@click.argument("keys", nargs=-1, required=True)
@click.option("--snapshot", "do_snapshot", is_flag=True, help="Commit right away.")
@click.option("-m", "--message", default=None, help="Snapshot message (with --snapshot).")
@click.option("--branch", default="main", show_default=True)
@click.option("--allow-schema-change", is_flag=True,
              help="With --snapshot: commit an earlier staged change of these keys that "
              "changes a field's type (it is committed with the deletion).")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def delete_cmd(
    ctx: CliContext,
    dataset: str,
    keys: tuple[str, ...],
    do_snapshot: bool,
    message: str | None,
    branch: str,
    allow_schema_change: bool,
    as_json: bool,
) -> None:
    """Stage the deletion of sample KEYS from DATASET (missing keys are an error)."""
    if message is not None and not do_snapshot:
        raise InvalidInputError(
            "-m/--message names a snapshot: it needs --snapshot (staged entries are "
            "committed later with `simstore snapshot NAME -m MSG`)"
        )
    if allow_schema_change and not do_snapshot:
        raise InvalidInputError(
            "--allow-schema-change applies to the commit: it needs --snapshot (or give it "
            "to `simstore snapshot NAME`)"
        )
    message = text_arg(message)
    check_message(message)
    keys = tuple(text_arg(k) for k in keys)
    cat = ctx.catalog()
    # --branch must name a branch, as the commit's: a tag or a snapshot id would have the
    # keys checked against one snapshot and the deletion committed onto another (or not
    # at all, with the entry left staged for the next snapshot)
    if do_snapshot:
        cat.check_commit_branch(dataset, branch)  # before anything is staged
    head_id, _ = cat.branches(dataset).get_versioned(branch)
    if head_id is None:
        cat.branches(dataset).require(branch)  # names the branches there are
        # a dataset without branches: unknown, or one with only tags
        cat.resolve(f"{dataset}@{branch}")  # an unknown dataset or revision: its error
        raise NotFoundError(
            f"dataset {dataset!r} has no branch {branch!r}: a deletion is staged against "
            "a branch"
        )
    head = cat.snapshot(head_id, named_by=f"branch {dataset}@{branch}", dataset=dataset)
    present = _present_keys(cat, head, set(keys))
    missing = sorted(set(keys) - present)
    if missing:
        raise InvalidInputError(
            f"dataset {dataset!r} branch {branch!r} has no sample {missing[0]!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    from simstore.manifest import ManifestRow

    rows = [
        ManifestRow(key=k, sample_hash="0" * 32, shard="0" * 32, position=0, size_bytes=0)
        for k in sorted(set(keys))
    ]
    import pyarrow as pa

    table = rows_from_list(rows)
    table = table.append_column("deleted", pa.array([True] * table.num_rows))
    entry = cat.stage(dataset, changes=table, lineage={"operation": "delete"})
    out: dict[str, Any] = {"staged": entry.id, "deleted": len(rows)}
    text = f"staged deletion of {len(rows)} samples ({entry.id})"
    if do_snapshot:
        try:
            res = cat.commit(
                dataset,
                message=message or f"delete {len(rows)} samples",
                branch=branch,
                # with every earlier entry that changes these keys, so the deletion is
                # the last change to them, not undone by one left staged
                staging_ids=cat.taken_with(dataset, entry.id, set(keys)),
                allow_schema_change=allow_schema_change,
            )
        except BaseException:
            # a failed (or interrupted) commit leaves nothing staged for the next snapshot
            cat.discard_unless_committed(dataset, branch, entry)
            raise
        out["commit"] = res.to_json()
        text += f"\n{dataset}@{branch} -> {res.snapshot_id} ({res.samples} samples)"
    emit(as_json, out, text)


def _present_keys(cat: Catalog, snap: Snapshot, keys: set[str]) -> set[str]:
    import bisect

    import pyarrow.compute as pc

    firsts = [p.first_key for p in snap.parts]
    wanted: dict[int, set[str]] = {}
    for k in keys:
        i = bisect.bisect_right(firsts, k) - 1
        if i >= 0 and k <= snap.parts[i].last_key:
            wanted.setdefault(i, set()).add(k)
    found: set[str] = set()
    for i, ks in wanted.items():
        table = cat.read_part(snap.parts[i])
        mask = pc.is_in(table.column("key"), value_set=__import__("pyarrow").array(sorted(ks)))
        found.update(table.filter(mask).column("key").to_pylist())
    return found


@click.command("log")
@click.argument("ref")
@click.option("-n", "--limit", type=int, default=None, help="Show at most N snapshots.")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def log_cmd(ctx: CliContext, ref: str, limit: int | None, as_json: bool) -> None:
    """Snapshots of REF, newest first."""
    check_at_least(limit, "-n/--limit", 0)
    cat = ctx.catalog(read_only=True)
    entries = [snapshot_summary(sid, s) for sid, s in cat.log(ref, limit=limit)]

    def text() -> str:
        lines = []
        for e in entries:
            lines.append(
                f"{e['id'][:12]}  {_utc(e['created'])}  {e['samples']:>10} samples  "
                f"{human_bytes(e['bytes']):>10}  {one_line(e['author'])}: {one_line(e['message'])}"
            )
        return "\n".join(lines)

    emit(as_json, entries, text)


@click.command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def show_cmd(ctx: CliContext, ref: str, as_json: bool) -> None:
    """Details of one snapshot."""
    cat = ctx.catalog(read_only=True)
    sid = cat.resolve(ref)
    info = snapshot_summary(sid, cat.snapshot(sid))

    def text() -> str:
        fields = ", ".join(f"{s['name']}:{s['kind']}" for s in info["schema"])
        return "\n".join(
            [
                f"snapshot      {info['id']}",
                f"dataset       {info['dataset']}",
                f"parents       {', '.join(info['parents']) or '-'}",
                # typed text, shown on one line each with its breaks and a terminal's
                # escape sequences as escapes (``--json`` gives them exactly)
                f"created       {info['created']} by {one_line(info['author'])}",
                f"message       {one_line(info['message'])}",
                f"samples       {info['samples']}",
                f"bytes         {info['bytes']} ({human_bytes(info['bytes'])})",
                f"manifest      {info['manifest_parts']} parts, "
                f"{human_bytes(info['manifest_bytes'])}",
                f"content_hash  {info['content_hash']}",
                f"fields        {fields or '-'}",
                *(f"written with  {_versions_line(v)}" for v in info["software"]),
            ]
        )

    emit(as_json, info, text)


def _versions_line(versions: dict[str, str]) -> str:
    first = [n for n in ("simstore", "python") if n in versions]
    rest = sorted(n for n in versions if n not in first)
    return ", ".join(f"{n} {versions[n]}" for n in first + rest)


@click.command("ls")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def ls_cmd(ctx: CliContext, as_json: bool) -> None:
    """Datasets in the store with their branches and tags."""
    cat = ctx.catalog(read_only=True)
    out: list[dict[str, Any]] = []
    for name in cat.datasets():
        branches = dict(cat.branches(name).list())
        tags = dict(cat.tags(name).list())
        staged = len(cat.staged(name))
        # samples per branch (a dataset need not have a main)
        counts = {b: cat.snapshot(sid, named_by=f"branch {name}@{b}").samples
                  for b, sid in branches.items()}
        out.append(
            {
                "dataset": name,
                "branches": branches,
                "tags": tags,
                "staged": staged,
                "samples": counts.get("main"),
                "branch_samples": counts,
            }
        )

    def text() -> str:
        if not out:
            return "(no datasets)"
        lines = []
        for d in out:
            br = ", ".join(
                f"{b}={s[:8]} ({d['branch_samples'][b]} samples)"
                for b, s in d["branches"].items()
            ) or "-"
            tg = ", ".join(d["tags"]) or "-"
            lines.append(
                f"{d['dataset']}  branches: {br}  tags: {tg}"
                + (f"  staged: {d['staged']}" if d["staged"] else "")
            )
        return "\n".join(lines)

    emit(as_json, out, text)


@click.command("unstage")
@click.argument("name")
@click.argument("ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Discard every staged entry of NAME.")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def unstage_cmd(ctx: CliContext, name: str, ids: tuple[str, ...], every: bool,
                as_json: bool) -> None:
    """List NAME's staged entries, or discard those named (IDS, or --all).

    An entry is named by its id, or 6 or more of the first characters of the id or of
    its part after the ``-``. The objects a discarded entry named stay until ``gc``
    finds nothing reaching them.
    """
    from simstore.names import check_name

    check_name(name, "dataset name")
    if every and ids:
        raise InvalidInputError("unstage: give entry ids or --all, not both")
    cat = ctx.catalog(read_only=not (ids or every))
    try:
        entries = cat.staged(name)
    except FormatError:
        if not (ids or every):
            raise  # a listing names the damaged entry; discarding it is how to fix it
        _discard_damaged(cat, name, ids, as_json)
        return
    if not entries and not cat.has_dataset(name):
        raise NotFoundError(f"no dataset {name!r}")
    chosen = list(entries) if every else [_staged_entry(entries, name, i) for i in ids]
    gone = {e.id for e in chosen}
    if gone:
        cat.discard_staged(name, sorted(gone))
        # a snapshot that landed meanwhile may have applied an entry before it went: that
        # entry was committed, not discarded (a review raced `snapshot` with this)
        from simstore.catalog._commit import consumed_in_history

        committed: dict[str, str] = {}
        for branch, head in cat.branches(name).list():
            for entry_id, sid in consumed_in_history(cat, head, chosen).items():
                committed.setdefault(entry_id, f"{sid} on {branch}")
        if committed:
            entry_id, by = min(committed.items())
            more = f" (and {len(committed) - 1} more)" if len(committed) > 1 else ""
            raise ConflictError(
                f"{name}: staged entry {entry_id}{more} was committed by snapshot {by} while "
                "it was being discarded: its changes are in that snapshot"
                + ("; the other entries named were discarded" if len(gone) > len(committed)
                   else ""))

    def row(e: Any) -> dict[str, Any]:
        return {"id": e.id, "created": e.created, "mode": e.mode, "rows": e.rows,
                "deletions": e.deletions, "shards": len(e.shards)}

    discarded = [row(e) for e in entries if e.id in gone]
    left = [row(e) for e in entries if e.id not in gone]
    out = {"dataset": name, "discarded": discarded, "staged": left}

    def text() -> str:
        lines = [f"discarded {r['id']}" for r in discarded]
        lines += [f"{r['id']}  {_utc(r['created'])}  {r['mode']}  {r['rows']} rows"
                  + (f", {r['deletions']} deletions" if r["deletions"] else "")
                  for r in left]
        if not lines:
            lines.append(f"nothing staged for {name}")
        return "\n".join(lines)

    emit(as_json, out, text)


def _discard_damaged(cat: Any, name: str, ids: tuple[str, ...], as_json: bool) -> None:
    """``unstage`` where a staged entry is damaged: discard by id, without reading them.

    No commit can have taken a damaged entry (it reads every entry it applies), so none
    of those named was committed meanwhile.
    """
    from types import SimpleNamespace

    from simstore.catalog._refs import staging_key

    listed = [SimpleNamespace(id=key.rsplit("/", 1)[-1])
              for key in cat.store.list(staging_key(name))]
    chosen = listed if not ids else [_staged_entry(listed, name, i) for i in ids]
    gone = sorted({e.id for e in chosen})
    cat.discard_staged(name, gone)
    left = [e.id for e in listed if e.id not in gone]
    out = {"dataset": name, "discarded": [{"id": i} for i in gone],
           "staged": [{"id": i} for i in left]}
    emit(as_json, out, lambda: "\n".join(
        [f"discarded {i}" for i in gone] + [f"{i}  (not read: an entry is damaged)"
                                            for i in left]))


def _staged_entry(entries: list[Any], name: str, given: str) -> Any:
    """The one staged entry of ``name`` named by ``given``.

    Its id, or 6 or more of the first characters of the id or of its part after the
    ``-`` (ids start with the time they were staged: entries staged together share the
    first digits).
    """
    text = given.strip().lower()
    if len(text) < 6:
        raise InvalidInputError(
            f"staged entry {given!r}: give its id, or 6 or more of its first characters or "
            "of those after its '-'")
    found = [e for e in entries if e.id == text] or [
        e for e in entries
        if e.id.startswith(text) or e.id.partition("-")[2].startswith(text)]
    if not found:
        raise NotFoundError(f"{name} has no staged entry {given!r} (`simstore unstage "
                            f"{name}` lists them)")
    if len(found) > 1:
        raise InvalidInputError(
            f"staged entry {given!r} of {name} is ambiguous: "
            + ", ".join(e.id for e in found))
    return found[0]


@click.command("diff")
@click.argument("ref_a")
@click.argument("ref_b")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def diff_cmd(ctx: CliContext, ref_a: str, ref_b: str, as_json: bool) -> None:
    """Samples added, removed and modified from REF_A to REF_B."""
    cat = ctx.catalog(read_only=True)
    res = cat.diff(ref_a, ref_b)
    out = res.to_json()

    def text() -> str:
        s = out["summary"]
        # keys escaped as `keys` shows them: a key is a file's name and may hold a line
        # break or a terminal's escape sequence (``--json`` gives them exactly)
        lines = [f"+ {one_line(k, exact=True)}" for k in out["added"]]
        lines += [f"- {one_line(k, exact=True)}" for k in out["removed"]]
        lines += [f"M {one_line(k, exact=True)}" for k in out["modified"]]
        moved = f", {s['relocated']} relocated" if s.get("relocated") else ""
        lines.append(
            f"{s['added']} added, {s['removed']} removed, {s['modified']} modified{moved} "
            f"({human_bytes(s['added_bytes'])} added, {human_bytes(s['removed_bytes'])} "
            f"removed); read {out['cost']['parts_read']} of {out['cost']['parts_total']} "
            "manifest parts"
        )
        return "\n".join(lines)

    emit(as_json, out, text)


@click.command("tag")
@click.argument("ref")
@click.argument("name")
@click.option(
    "--delete", "do_delete", is_flag=True, help="Delete tag NAME (REF names the dataset)."
)
@pass_ctx
@handle_errors
def tag_cmd(ctx: CliContext, ref: str, name: str, do_delete: bool) -> None:
    """Tag the snapshot REF resolves to as NAME (tags never move)."""
    cat = ctx.catalog()
    r = parse_ref(ref)
    if do_delete:
        cat.tags(r.dataset).delete(name)
        click.echo(f"deleted tag {r.dataset}@{name}")
        return
    sid = cat.resolve(r)
    cat.snapshot(sid)  # missing or damaged: its error (exit 6), before a ref names it
    cat.tags(r.dataset).create(name, sid)
    click.echo(f"{r.dataset}@{name} -> {sid}")


@click.command("branch")
@click.argument("ref")
@click.argument("name")
@click.option(
    "--delete", "do_delete", is_flag=True,
    help="Delete branch NAME (REF names the dataset).",
)
@pass_ctx
@handle_errors
def branch_cmd(ctx: CliContext, ref: str, name: str, do_delete: bool) -> None:
    """Create branch NAME at the snapshot REF resolves to."""
    cat = ctx.catalog()
    r = parse_ref(ref)
    if do_delete:
        cat.branches(r.dataset).delete(name)
        click.echo(f"deleted branch {r.dataset}@{name}")
        return
    sid = cat.resolve(r)
    cat.snapshot(sid)  # missing or damaged: its error (exit 6), before a ref names it
    cat.branches(r.dataset).create(name, sid)
    click.echo(f"{r.dataset}@{name} -> {sid}")


@click.command("verify")
@click.argument("ref", required=False)
@click.option("--deep", is_flag=True, help="Re-hash every object the snapshots reach.")
@click.option("--history", is_flag=True, help="Verify REF's ancestors too.")
@click.option(
    "--all", "all_refs", is_flag=True,
    help="Verify every snapshot every branch and tag of every dataset reaches (no REF).",
)  # fmt: skip
@click.option(
    "--samples", is_flag=True,
    help="Read every sample and check its key and content hash against the manifest.",
)  # fmt: skip
@click.option(
    "--split", "split", metavar="K/N", default=None,
    help="Check only part K (0-based) of N of the shards and lineage objects, for one "
         "task of an array job (e.g. $SLURM_ARRAY_TASK_ID/16).",
)  # fmt: skip
@click.option(
    "--progress/--no-progress", default=None,
    help="A progress bar on stderr for --samples (default: when stderr is a terminal).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def verify_cmd(
    ctx: CliContext, ref: str | None, deep: bool, history: bool, all_refs: bool,
    samples: bool, split: str | None, progress: bool | None, as_json: bool,
) -> None:
    """Check that a snapshot (or a history, or every ref) and all it reaches is intact."""
    if all_refs and ref is not None:
        raise InvalidInputError(f"give a REF ({ref}) or --all, not both")
    if not all_refs and ref is None:
        raise click.UsageError("missing argument 'REF' (or --all for every branch and tag)")
    cat = ctx.catalog(read_only=True)
    parts = _split(split) if split is not None else None
    bar = None
    if samples and progress_shown(progress):
        from simstore.cli._ingest import ProgressBar

        bar = ProgressBar()
    try:
        report = verify(
            cat, ref, deep=deep, history=history, all_refs=all_refs, samples=samples,
            split=parts, progress=None if bar is None else functools.partial(_draw, bar),
            **(_node_keepers() if deep else {}),
        )
    finally:
        if bar is not None:
            bar.finish()

    def text() -> str:
        n = len(report.snapshots)
        if report.all_refs:
            what = f"every branch and tag, {n} snapshot{'s' if n != 1 else ''}"
        elif report.history:
            what = f"snapshot {report.snapshot} and its history, {n} snapshots"
        else:
            what = f"snapshot {report.snapshot}"
        if report.split is not None:
            what += f" (part {report.split[0]} of {report.split[1]} of its shards)"
        head = (
            f"{'ok' if report.ok else 'FAILED'}: {what}, "
            f"{report.objects_checked} objects checked"
            + (f", {human_bytes(report.bytes_hashed)} re-hashed" if report.bytes_hashed or deep
               else "")
            + (f", {report.samples_checked} samples read and hashed" if samples else "")
            + (f", {report.shards_recorded} shard files recorded for this node's loaders"
               if report.shards_recorded else "")
        )
        return "\n".join([head, *report.problems])

    emit(as_json, report.to_json(), text)
    if not report.ok:
        raise SystemExit(6)


def _node_keepers() -> dict[str, Callable[..., object] | None]:
    """``verify``'s callbacks that keep what the node's loaders derive, for ``--deep``.

    A recorded shard's page layout and a checked part's stream rows, each in the loaders'
    cache of them (made once here: its folder is checked, and any warning said, once).
    """
    from simstore.loaders._nodecache import layout_cache
    from simstore.loaders._partrows import part_rows_cache

    layouts, rows = layout_cache(), part_rows_cache()
    return {"recorded": layouts.keep_file if layouts is not None else None,
            "part_decoded": rows.keep_table if rows is not None else None}


def _draw(bar: Any, p: VerifyProgress) -> None:
    bar.draw("shards", p.shards_done, p.shards_total, p.samples, p.bytes_done,
             p.bytes_total, p.elapsed_s)


def _split(text: str) -> tuple[int, int]:
    """``K/N`` as ``(k, n)``; anything else is one line naming the flag."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text, flags=re.ASCII)
    if match:
        got = (int(match[1]), int(match[2]))
        if got[1] >= 1 and got[0] < got[1]:
            return got
    raise InvalidInputError(f"invalid --split {text!r}: give K/N with 0 <= K < N, e.g. 3/16")


@click.command("gc")
@click.option("--dry-run", is_flag=True, help="Only report what would be deleted.")
@click.option("--grace", default="1h", show_default=True, help="Keep objects newer than this.")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def gc_cmd(ctx: CliContext, dry_run: bool, grace: str, as_json: bool) -> None:
    """Delete objects no branch, tag, staging entry or recent write reaches."""
    cat = ctx.catalog()
    report = gc(cat, grace_s=parse_duration(grace, "--grace"), dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    emit(
        as_json,
        report.to_json(),
        f"{verb} {len(report.deleted)} objects ({human_bytes(report.deleted_bytes)}); "
        f"kept {report.reachable} reachable and {report.kept_recent} recent"
        + (f" (ages on this machine's clock; {report.clock[len('local: '):]})"
           if report.clock.startswith("local: ") else ""),
    )


COMMANDS = [
    init_cmd,
    snapshot_cmd,
    delete_cmd,
    log_cmd,
    show_cmd,
    ls_cmd,
    unstage_cmd,
    diff_cmd,
    tag_cmd,
    branch_cmd,
    verify_cmd,
    gc_cmd,
]


def _utc(created: str) -> str:
    """A snapshot's ``created`` to the second, in UTC and marked so (``...Z``)."""
    try:
        moment = datetime.datetime.fromisoformat(created)
    except (TypeError, ValueError):
        return str(created)[:19]
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
