"""Commits: staged entries made a snapshot and the branch moved to it by compare-and-swap.

A commit builds its snapshot on the branch's head, writes it, and moves the branch with
one conditional write; a writer that loses the swap builds again on the new head. What
makes a retried commit safe is finding its own entries in the branch's history: a swap
whose response was lost, a crash between a swap and the clean-up, or another writer that
committed the same entries all leave them consumed by a snapshot on the branch, and that
snapshot is this commit's result (applying the entries again would undo newer writes of
their keys).
"""

from __future__ import annotations

import datetime
import getpass
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from simstore.catalog._build import build_snapshot, utc_at
from simstore.catalog._caps import check_written
from simstore.catalog._refs import Branches, staging_key
from simstore.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    SimstoreError,
    StorageError,
)
from simstore.names import DEFAULT_BRANCH, check_name, check_ref_name
from simstore.snapshot import Snapshot, SnapshotId

if TYPE_CHECKING:
    from simstore.catalog._catalog import Catalog
    from simstore.catalog._staged import StagedEntry

__all__ = ["CLOCK_SKEW_S", "CommitResult", "commit", "consumed_in_history", "taken_along"]


def taken_along(
    pending: Mapping[str, frozenset[str] | None], keys: frozenset[str] | set[str] | None
) -> list[str]:
    """The staged entries a commit of a new change must take with it, oldest first.

    ``pending`` maps each entry staged before the change (:meth:`Catalog.staged_keys`) to
    the keys it changes (None: a replace, every key); ``keys`` are the change's own (None:
    it replaces the dataset). An entry left staged applies at the next commit, after the
    change, so it is taken when it changes a key the change, or an entry taken after it,
    changes: committed in staging order, the change is the last word on its keys, as it
    would be had every entry been committed together. A replace takes every entry before
    it (it discards them), and so does any change once a replace has been taken.
    """
    taken: list[str] = []
    reach: set[str] | None = None if keys is None else set(keys)
    for eid in sorted(pending, reverse=True):  # staging ids sort by staging time
        changed = pending[eid]
        if reach is not None and (not reach if changed is None else reach.isdisjoint(changed)):
            continue  # a replace left staged discards the change's keys: taken, if any
        taken.append(eid)
        if reach is not None:
            if changed is None:
                reach = None
            else:
                reach |= changed
    return sorted(taken)


def _default_author() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitResult:
    """What a commit did."""

    dataset: str
    branch: str
    snapshot_id: SnapshotId
    parent: str | None
    samples: int
    sample_bytes: int
    staged: tuple[str, ...]
    attempts: int
    overwritten_concurrent: tuple[str, ...] = ()
    new_part_bytes: int = 0
    overwritten_staged: tuple[str, ...] = ()
    """Keys that more than one of the staged entries this commit applied wrote (or
    deleted): the entry staged last decides each (ingests of folders whose files share
    names, for one, give their samples the same keys)."""

    def to_json(self) -> dict[str, Any]:
        """JSON shape for ``--json``."""
        return {
            "dataset": self.dataset,
            "branch": self.branch,
            "snapshot": self.snapshot_id,
            "parent": self.parent,
            "samples": self.samples,
            "sample_bytes": self.sample_bytes,
            "staged": list(self.staged),
            "attempts": self.attempts,
            "overwritten_concurrent": list(self.overwritten_concurrent),
            "overwritten_staged": list(self.overwritten_staged),
            "new_part_bytes": self.new_part_bytes,
        }


CLOCK_SKEW_S = 60.0
"""How far clocks of two writers may disagree when a commit looks for its entries."""


def staged_at_ns(staging_id: str) -> int | None:
    """When an entry was staged (ns since the epoch), from its id (``<ns:020d>-<hex>``)."""
    stamp = staging_id.split("-", 1)[0]
    if len(stamp) != 20 or not stamp.isdigit():
        return None
    return int(stamp)


def _staged_at_s(staging_id: str) -> float | None:
    """:func:`staged_at_ns` in seconds."""
    ns = staged_at_ns(staging_id)
    return None if ns is None else ns / 1e9


def _made_s(snap: Snapshot) -> float:
    """When ``snap`` was made, as far as the walks back through history go by it.

    Its ``created`` (its writer's clock), or its ``lineage.after`` where that is later: the
    latest time its parent or the entries it consumed had (see :func:`_not_before`).
    """
    made = _epoch_s(snap.created)
    after = snap.lineage.get("after")
    return max(made, _epoch_s(after)) if isinstance(after, str) else made


def _not_before(parent: Snapshot | None, entries: Sequence[StagedEntry]) -> float:
    """The time a snapshot of ``entries`` on ``parent`` must not be taken to precede.

    The latest of its parent's time (:func:`_made_s`) and the times its entries were
    staged. A writer whose clock runs behind another's records it as ``lineage.after``,
    so times along a branch never go backwards and a snapshot is never older than an entry
    it consumed, whatever the writers' clocks: a walk back from the head that stops at
    the first snapshot older than an entry (:func:`consumed_in_history`) cannot stop
    before the one that consumed it.
    """
    times = [_made_s(parent)] if parent is not None else []
    for e in entries:
        times.append(_epoch_s(e.created))
        staged = _staged_at_s(e.id)
        if staged is not None:
            times.append(staged)
    return max(times, default=0.0)


def _epoch_s(iso_time: str) -> float:
    """Seconds since the epoch of an ISO 8601 time; unparseable times count as the epoch."""
    try:
        moment = datetime.datetime.fromisoformat(iso_time)
    except (TypeError, ValueError):
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _unstaged(cat: Catalog, dataset: str, entries: Sequence[StagedEntry]) -> list[str]:
    """The ids of ``entries`` no longer staged (one existence check each)."""
    return [e.id for e in entries if not cat.store.exists(staging_key(dataset, e.id))]


def commit(
    cat: Catalog,
    dataset: str,
    *,
    message: str,
    branch: str = DEFAULT_BRANCH,
    author: str | None = None,
    staging_ids: Sequence[str] | None = None,
    allow_empty: bool = True,
    max_attempts: int = 50,
    rng: random.Random | None = None,
    allow_schema_change: bool = False,
) -> CommitResult:
    """:meth:`Catalog.commit` of ``cat``: its arguments and promises are documented there."""
    check_name(dataset, "dataset name")
    check_ref_name(branch, "branch name")
    if not isinstance(message, str):
        raise InvalidInputError(f"commit message must be a string, not {message!r}")
    if not message.strip():
        raise InvalidInputError(f"invalid commit message {message!r}: a snapshot needs a message")
    if author is not None and not isinstance(author, str):
        raise InvalidInputError(f"author must be a string, not {author!r}")
    for what, text in (("commit message", message), ("author", author)):
        try:
            (text or "").encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInputError(
                f"invalid {what} {text!r}: not UTF-8 text (bytes of another encoding)"
            ) from None
    if author is not None and not author.strip():
        raise InvalidInputError(
            f"invalid author {author!r}: empty (leave it out for the current user)"
        )
    if isinstance(staging_ids, str):
        raise InvalidInputError(
            f"staging_ids takes a list of ids, not the string {staging_ids!r}"
        )
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) \
            or max_attempts < 1:
        raise InvalidInputError(f"max_attempts must be a positive integer: {max_attempts!r}")
    rng = rng or random.Random(int.from_bytes(os.urandom(8), "little"))
    author = author if author is not None else _default_author()
    all_entries = cat.staged(dataset)
    if staging_ids is not None:
        wanted = set(staging_ids)
        missing = wanted - {e.id for e in all_entries}
        entries = [e for e in all_entries if e.id in wanted]
        if missing and not entries:
            done = _committed_by_another(cat, dataset, branch, missing)
            if done is not None:
                return done
            raise NotFoundError(
                f"dataset {dataset!r} has no staged entries {sorted(missing)[:3]}"
            )
    else:
        entries = all_entries
    if not all_entries and not cat.has_dataset(dataset):
        # Nothing staged and no branch or tag: a dataset is created by its first staged
        # change (an ingest, Catalog.stage), never by a commit of a mistyped name.
        raise NotFoundError(
            f"unknown dataset {dataset!r}: nothing staged and no branches or tags; "
            f"create it by ingesting into it (simstore ingest SOURCE --dataset {dataset})"
        )
    existed = cat.check_commit_branch(dataset, branch)
    branches = cat.branches(dataset)
    first_head: str | None = None
    overwritten: set[str] = set()
    change_tables = {e.id: cat._read_changes(e) for e in entries}
    delay = 0.005
    for attempt in range(1, max_attempts + 1):
        head, version = branches.get_versioned(branch)
        if attempt == 1:
            first_head = head
        if head is None and (existed or first_head is not None):
            # deleted while this commit ran: committing now would create the branch
            # again with a snapshot of the staged changes alone, no history under it
            raise NotFoundError(
                f"dataset {dataset!r}: branch {branch!r} was deleted while this commit "
                "ran; the staged changes stay staged"
            )
        consumed = consumed_in_history(cat, head, entries)
        todo = [e for e in entries if e.id not in consumed]
        if entries and not todo:
            # Every entry is already on the branch: this writer's swap landed though
            # its response was lost, a crash came between a swap and the clean-up, or
            # another writer committed the same entries. Applying them again would
            # undo newer writes of their keys.
            return _already_committed(
                cat, dataset, branch, entries, consumed, first_head, change_tables, attempt
            )
        if attempt > 1 and head != first_head and head is not None:
            overwritten |= _keys_changed_between(cat, first_head, head, change_tables)
        parent = (cat.snapshot(head, named_by=f"branch {dataset}@{branch}",
                                dataset=dataset) if head else None)
        if not todo and not allow_empty and parent is not None:
            raise InvalidInputError(
                f"dataset {dataset!r}: nothing staged to commit (a snapshot would repeat "
                f"{head}; allow_empty / --allow-empty makes one anyway)"
            )
        now = time.time()
        after = _not_before(parent, entries)
        snap, counters = build_snapshot(
            cat, dataset, parent, head, todo, change_tables, message=message,
            author=author, created=utc_at(now), allow_schema_change=allow_schema_change,
            after=utc_at(after) if after > now else None,
        )
        body = snap.to_bytes()
        check_written("snapshot", len(body),
                      f"dataset {dataset!r}: a snapshot of {len(snap.parts)} manifest parts",
                      f"raise target_rows (now {cat.target_rows}) for fewer parts, or "
                      "shorten the message")
        sid, _ = cat.put_object(body)
        gone = _unstaged(cat, dataset, todo)
        if gone:
            if branches.get_versioned(branch)[1] != version:
                continue  # another commit took them (and removed them): found above
            # discarded (unstage) while this snapshot was built: its swap would publish
            # changes the discard was told were gone (an audit raced unstage with this)
            raise ConflictError(
                f"dataset {dataset!r}: staged entry {gone[0]} was discarded while this "
                "commit ran; nothing was committed (what is still staged stays staged)"
            )
        try:
            # A move that raised StorageError (every response lost) but landed returns
            # normally: move reads the branch back and finds this snapshot there.
            branches.move(branch, version, sid)
        except ConflictError:
            now_head, _ = branches.get_versioned(branch)
            if now_head != sid:
                time.sleep(rng.uniform(0, delay))
                delay = min(delay * 2, 1.0)
                continue
        except StorageError:
            # Not at this snapshot now, but a concurrent commit may have moved the
            # branch on from it since it landed: found in the history, it counts.
            landed = _landed_below(cat, branches, branch, sid, entries)
            if landed is None:
                raise
            return _already_committed(
                cat, dataset, branch, entries, landed, first_head, change_tables, attempt
            )
        cat.discard_staged(dataset, [e.id for e in entries])
        return CommitResult(
            dataset=dataset,
            branch=branch,
            snapshot_id=SnapshotId(sid),
            parent=head,
            samples=snap.samples,
            sample_bytes=snap.sample_bytes,
            staged=tuple(e.id for e in todo),
            attempts=attempt,
            overwritten_concurrent=tuple(sorted(overwritten)),
            new_part_bytes=counters.new_part_bytes,
            overwritten_staged=_keys_in_several(todo, change_tables),
        )
    raise ConflictError(
        f"dataset {dataset!r} branch {branch!r}: gave up after {max_attempts} attempts "
        "lost to concurrent commits"
    )


def _landed_below(
    cat: Catalog, branches: Branches, branch: str, sid: str, entries: Sequence[StagedEntry]
) -> dict[str, str] | None:
    """After a move that raised StorageError: where the branch's history holds ``sid``.

    ``{staging id: snapshot id}`` (as :func:`consumed_in_history`) when every entry
    is consumed on the branch and ``sid``, this commit's snapshot, is among the
    snapshots that consumed them: the move landed and later commits built on it. A
    snapshot id is a hash of the snapshot, so ``sid`` there is this commit's content
    whoever wrote it. None otherwise, or when the branch cannot be read: the error
    stands. A commit of nothing (no entries) is not looked for.
    """
    if not entries:
        return None
    try:
        head, _ = branches.get_versioned(branch)
        consumed = consumed_in_history(cat, head, entries)
    except SimstoreError:
        return None
    if len(consumed) < len(entries) or sid not in consumed.values():
        return None
    return consumed


def consumed_in_history(
    cat: Catalog, head: str | None, entries: Sequence[StagedEntry]
) -> dict[str, str]:
    """``{staging id: snapshot id}`` for entries a snapshot on the branch already consumed.

    Walks first parents from ``head`` back past the time the oldest entry was staged
    (less :data:`CLOCK_SKEW_S`): a snapshot can only consume an entry staged before it,
    so the walk costs one read per commit made since then, usually none or one.
    """
    if not entries:
        return {}
    oldest = min(_epoch_s(e.created) for e in entries)
    return _consumed_ids(cat, head, {e.id for e in entries}, oldest)


def _consumed_ids(
    cat: Catalog, head: str | None, wanted: set[str], oldest: float
) -> dict[str, str]:
    """:func:`consumed_in_history` by staging ids, the oldest staged at ``oldest`` (s)."""
    if not wanted or head is None:
        return {}
    oldest -= CLOCK_SKEW_S
    found: dict[str, str] = {}
    sid: str | None = head
    while sid is not None and len(found) < len(wanted):
        snap = cat.snapshot(sid)
        for staged in snap.lineage.get("staging", []):
            if staged in wanted:
                found.setdefault(str(staged), sid)
        if _made_s(snap) < oldest:
            break
        sid = snap.parents[0] if snap.parents else None
    return found


def _committed_by_another(
    cat: Catalog, dataset: str, branch: str, ids: set[str]
) -> CommitResult | None:
    """The snapshot on ``branch`` that consumed every entry of ``ids``, or None.

    For a commit whose entries are all gone from staging: another writer's commit
    took them along (it commits every pending entry its own changes overlap) and
    removed them. That is this commit done, as when the same entries are committed by
    two writers; entries that no snapshot on the branch consumed stay an error. The
    walk back is bounded by the entries' staging times, which their ids begin with.
    """
    times = [_staged_at_s(i) for i in ids]
    if any(t is None for t in times):
        return None
    head, _ = cat.branches(dataset).get_versioned(branch)
    consumed = _consumed_ids(cat, head, ids, min(t for t in times if t is not None))
    if set(consumed) != ids:
        return None
    # the walk goes from the head backwards: the newest consuming snapshot comes first
    sid = next(iter(consumed.values()))
    snap = cat.snapshot(sid)
    return CommitResult(
        dataset=dataset,
        branch=branch,
        snapshot_id=SnapshotId(sid),
        parent=snap.parents[0] if snap.parents else None,
        samples=snap.samples,
        sample_bytes=snap.sample_bytes,
        staged=tuple(sorted(ids)),
        attempts=0,
        overwritten_concurrent=(),
    )


def _already_committed(
    cat: Catalog,
    dataset: str,
    branch: str,
    entries: Sequence[StagedEntry],
    consumed: Mapping[str, str],
    first_head: str | None,
    change_tables: Mapping[str, pa.Table],
    attempt: int,
) -> CommitResult:
    """The result of a commit whose entries a snapshot on the branch already holds."""
    # the walk goes from the head backwards, so the first snapshot found is the newest
    sid = next(iter(consumed.values()))
    snap = cat.snapshot(sid)
    parent = snap.parents[0] if snap.parents else None
    overwritten: set[str] = set()
    if parent is not None and parent != first_head:
        overwritten = _keys_changed_between(cat, first_head, parent, change_tables)
    cat.discard_staged(dataset, [e.id for e in entries])
    return CommitResult(
        dataset=dataset,
        branch=branch,
        snapshot_id=SnapshotId(sid),
        parent=parent,
        samples=snap.samples,
        sample_bytes=snap.sample_bytes,
        staged=tuple(e.id for e in entries),
        attempts=attempt,
        overwritten_concurrent=tuple(sorted(overwritten)),
    )


def _keys_in_several(entries: Sequence[Any], change_tables: Mapping[str, pa.Table]
                     ) -> tuple[str, ...]:
    """Keys that more than one of ``entries`` changes, sorted."""
    seen: set[str] = set()
    several: set[str] = set()
    for entry in entries:
        keys = set(change_tables[entry.id].column("key").to_pylist())
        several |= keys & seen
        seen |= keys
    return tuple(sorted(several))


def _keys_changed_between(
    cat: Catalog, a: str | None, b: str, change_tables: Mapping[str, pa.Table]
) -> set[str]:
    mine: set[str] = set()
    for t in change_tables.values():
        mine.update(t.column("key").to_pylist())
    if not mine:
        return set()
    result = cat.diff_snapshots(a, b)
    d = result.diff
    theirs = {r.key for r in d.added} | {r.key for r in d.removed}
    theirs |= {new.key for _, new in d.modified}
    return mine & theirs
