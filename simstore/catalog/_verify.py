"""verify: checking what a snapshot reaches, naming the snapshots a damaged object reaches."""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from simstore._verified import DEFAULT_VERIFY_EVERY_S, node_records, stamp_info
from simstore.catalog._catalog import Catalog
from simstore.catalog._contents import ROW_COLUMNS, ShardCheck, check_shards, hash_object
from simstore.catalog._refs import Branches, Tags, misplaced_refs
from simstore.errors import (
    FormatError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    SimstoreError,
)
from simstore.hashing import is_object_id, object_key
from simstore.manifest import PartRef, decode_part, part_ref
from simstore.names import Ref, check_name, parse_ref
from simstore.snapshot import Snapshot, content_hash_of

__all__ = [
    "ProblemKind",
    "VerifyProblem",
    "VerifyProgress",
    "VerifyReport",
    "check_catalog",
    "check_flags",
    "in_split",
    "verify",
]

ProblemKind = Literal["snapshot", "manifest part", "shard", "lineage object", "ref"]
"""What a damaged object is to the snapshots that reach it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyProgress:
    """Where a sample check stands, sent after each shard (``verify(progress=...)``).

    ``bytes_*`` count the samples' logical bytes (the manifest's ``size_bytes``).
    """

    shards_done: int
    shards_total: int
    samples: int
    bytes_done: int
    bytes_total: int
    elapsed_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyProblem:
    """One missing or damaged object (each object once) and what reaches it.

    ``snapshots``: the snapshots checked that reference it, in the order they were
    walked (for a snapshot: the children that name it as a parent); ``refs``: the refs
    verified that name it (snapshots only). ``problem`` is ``missing``, ``damaged`` (a
    hash mismatch, undecodable, not what its snapshot says) or ``invalid id``.
    """

    object: str
    kind: ProblemKind
    problem: Literal["missing", "damaged", "invalid id"]
    snapshots: tuple[str, ...] = ()
    refs: tuple[str, ...] = ()
    message: str

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "object": self.object,
            "kind": self.kind,
            "problem": self.problem,
            "snapshots": list(self.snapshots),
            "refs": list(self.refs),
            "message": self.message,
        }


@dataclass(slots=True, kw_only=True)
class VerifyReport:
    """What ``verify`` checked and what it found wrong.

    ``snapshot`` is REF's snapshot (None when every ref was verified); ``snapshots``
    every snapshot checked, in walk order. ``problems`` has one line per problem, and
    ``problem_objects`` the same problems by object, with the snapshots reaching each.
    """

    snapshot: str | None
    deep: bool
    history: bool = False
    all_refs: bool = False
    samples: bool = False
    split: tuple[int, int] | None = None
    """``(k, n)``: only the shards and lineage objects of part ``k`` of ``n`` were checked."""
    snapshots: list[str] = field(default_factory=list)
    objects_checked: int = 0
    bytes_hashed: int = 0
    samples_checked: int = 0
    """Manifest rows whose sample was read from its shard and hashed (``samples``)."""
    shards_recorded: int = 0
    """Shard files of a local store whose match ``deep`` recorded for the node's loaders
    (see ``simstore._verified``)."""
    problem_objects: list[VerifyProblem] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """One line per problem: each problem's message."""
        return [p.message for p in self.problem_objects]

    @property
    def ok(self) -> bool:
        """Whether nothing was wrong."""
        return not self.problem_objects

    def add(self, problem: VerifyProblem) -> None:
        """Record a problem."""
        self.problem_objects.append(problem)

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "snapshot": self.snapshot,
            "deep": self.deep,
            "history": self.history,
            "all": self.all_refs,
            "samples": self.samples,
            "split": list(self.split) if self.split is not None else None,
            "ok": self.ok,
            "snapshots": list(self.snapshots),
            "objects_checked": self.objects_checked,
            "bytes_hashed": self.bytes_hashed,
            "samples_checked": self.samples_checked,
            "shards_recorded": self.shards_recorded,
            "problems": self.problems,
            "problem_objects": [p.to_json() for p in self.problem_objects],
        }


def verify(
    cat: Catalog,
    ref: str | Ref | None = None,
    *,
    deep: bool = False,
    history: bool = False,
    all_refs: bool = False,
    samples: bool = False,
    split: tuple[int, int] | None = None,
    progress: Callable[[VerifyProgress], None] | None = None,
    recorded: Callable[[str, str], object] | None = None,
    part_decoded: Callable[[str, pa.Table], object] | None = None,
) -> VerifyReport:
    """Check a snapshot (with ``history``, its ancestors too) and everything it reaches.

    Always: each snapshot hashes to its id, every manifest part exists, hashes to its
    id, decodes, has the rows and content the snapshot says, and every shard exists.
    With ``deep``: every shard and lineage object is re-hashed, and each shard file of a
    local store that matched is recorded for the node's loaders, which then trust it while
    it is unchanged (``SimDataset(verify_every_s=...)``). ``history``: REF's
    snapshot and every ancestor (parents followed); ``all_refs`` (REF then None): every
    snapshot reachable from every branch and tag of every dataset. Each object is checked
    once however many snapshots share it. ``samples``: every manifest row is checked
    against the shard row it names: the key stored there, and the hash of the sample read
    there against the row's ``sample_hash`` (each shard is read whole, as an epoch reads
    it; see docs/reliability.md). Problems name the object and the snapshots that reach
    it (a missing parent: the child naming it); the report lists them all rather than
    stopping at the first. ``split=(k, n)``: of the shards and lineage objects, only
    those in part ``k`` (0-based) of ``n`` are checked (by their ids, which are uniform
    hashes), so ``n`` tasks of an array job split a large ``deep`` or ``samples`` check;
    snapshots and manifest parts are checked by every task. ``progress`` is called
    after each shard of the sample check. ``recorded(shard id, path)`` is called for each
    shard file recorded for the node's loaders (``deep``, a local store): the command
    line keeps the shard's page layout for them there too. ``part_decoded(part id,
    table)`` is called for each manifest part that hashed to its id and decoded with the
    rows its snapshots say (``--deep`` on the command line keeps its stream rows for the
    node's loaders).
    """
    check_catalog(cat, "verify")
    check_flags(deep=deep, history=history, all_refs=all_refs, samples=samples)
    deep, history, all_refs, samples = bool(deep), bool(history), bool(all_refs), bool(samples)
    if split is not None:
        if isinstance(split, str | bytes) or not isinstance(split, tuple | list) \
                or len(split) != 2:
            raise InvalidInputError(f"a verify split is a pair (K, N), got {split!r}")
        k, n = split
        if not (_whole(k) and _whole(n) and n >= 1 and 0 <= k < n):
            raise InvalidInputError(f"a verify split is K/N with 0 <= K < N, got {k!r}/{n!r}")
        split = (int(k), int(n))
    if progress is not None and not callable(progress):
        raise InvalidInputError(f"invalid progress {progress!r}: a callable or None")
    for name, hook in (("recorded", recorded), ("part_decoded", part_decoded)):
        if hook is not None and not callable(hook):
            raise InvalidInputError(f"invalid {name} {hook!r}: a callable or None")
    if all_refs and ref is not None:
        raise InvalidInputError(f"verify checks one REF ({ref}) or every ref (all_refs), not both")
    if all_refs:
        report = VerifyReport(
            snapshot=None, deep=deep, history=True, all_refs=True, samples=samples,
            split=split,
        )
        roots = _ref_roots(cat, report)
    elif ref is None:
        raise InvalidInputError("verify needs a REF, or all_refs=True to verify every ref")
    else:
        sid = cat.resolve(ref)
        report = VerifyReport(snapshot=sid, deep=deep, history=history, samples=samples,
                              split=split)
        roots = [(str(ref), sid)]
    walk = _Walk(report)
    walk.snapshots(cat, roots, follow_parents=report.history)
    walk.parts(cat, decoded=part_decoded)
    walk.objects(cat, deep=deep, recorded=recorded)
    if samples:
        walk.sample_rows(cat, progress=progress)
    return report


def _whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_catalog(cat: object, what: str) -> None:
    if not isinstance(cat, Catalog):
        raise InvalidInputError(
            f"{what} takes a Catalog first, got {cat!r}: "
            f"{what}(simstore.Catalog.open(URL), ...)"
        )


def check_flags(**flags: object) -> None:
    """Refuse a flag that is not True or False (``deep="no"`` is not a deep check)."""
    for name, value in flags.items():
        if not isinstance(value, bool | np.bool_):
            raise InvalidInputError(f"invalid {name} {value!r}: must be True or False")


def in_split(oid: str, split: tuple[int, int]) -> bool:
    """Whether object ``oid`` is in part ``k`` of ``split = (k, n)`` (8 hex digits mod n).

    An id that is not hex (an invalid one, reported as such) is in part 0.
    """
    k, n = split
    try:
        return int(oid[:8], 16) % n == k
    except ValueError:
        return k == 0


def _ref_roots(cat: Catalog, report: VerifyReport) -> list[tuple[str, str]]:
    """``(DATASET@NAME, snapshot id)`` of every branch and tag; bad refs are problems."""
    roots: list[tuple[str, str]] = []
    for label, line in misplaced_refs(cat.store):
        report.add(VerifyProblem(
            object=label, kind="ref", problem="damaged", refs=(label,), message=line,
        ))  # fmt: skip
    for dataset in cat.datasets():
        try:
            check_name(dataset, "dataset name")
        except InvalidInputError:
            # a folder or key simstore did not write: its refs name no snapshot it can
            # check (gc refuses such a store rather than take them for unreachable)
            where = f"datasets/{dataset}/"
            report.add(VerifyProblem(
                object=where, kind="ref", problem="invalid id", message=(
                    f"{cat.store.url}/{where}: {dataset!r} is no dataset name simstore "
                    "writes (a folder made by hand?)"),
            ))  # fmt: skip
            continue
        for refs in (Branches(cat.store, dataset), Tags(cat.store, dataset)):
            for name in refs.names():
                label = f"{dataset}@{name}"
                try:
                    roots.append((label, refs.get(name)))
                except NotFoundError:
                    continue  # deleted since the listing
                except InvalidInputError:
                    # a file copied in beside the refs (``main copy``): the rest is checked
                    report.add(VerifyProblem(
                        object=label, kind="ref", problem="invalid id", refs=(label,),
                        message=f"{cat.store.url}/{refs.key_unchecked(name)}: {name!r} "
                                "is no branch or tag name simstore writes",
                    ))  # fmt: skip
                except FormatError as exc:
                    report.add(VerifyProblem(
                        object=label, kind="ref", problem="damaged", refs=(label,),
                        message=str(exc),
                    ))  # fmt: skip
    return roots


# A problem line names at most this many snapshots (the JSON lists them all).
_NAMED_MAX = 10


def _named(sids: list[str]) -> str:
    """``snapshot a`` or ``snapshots a, b`` (at most ``_NAMED_MAX`` shown)."""
    shown = ", ".join(sids[:_NAMED_MAX])
    more = f" and {len(sids) - _NAMED_MAX} more" if len(sids) > _NAMED_MAX else ""
    return f"snapshot{'s' if len(sids) > 1 else ''} {shown}{more}"


class _Walk:
    """verify's state: what each snapshot references, found in three passes.

    Snapshots first (following parents), then each distinct manifest part once, then
    each distinct shard and lineage object once. Which snapshots reach an object is
    kept by way of its manifest parts (a shard maps to the parts listing it, a part to
    the snapshots listing it), so memory grows with distinct parts and shards, not with
    snapshots times shards; the snapshot list of an object is built only for a problem.
    """

    def __init__(self, report: VerifyReport) -> None:
        self.report = report
        self.rank: dict[str, int] = {}  # snapshot id -> walk order, read or not
        self.children: dict[str, list[str]] = {}  # snapshot id -> snapshots naming it
        self.refs: dict[str, list[str]] = {}  # snapshot id -> refs naming it
        self.claims: dict[str, dict[PartRef, list[str]]] = {}  # part -> entry -> snapshots
        self.lineage: dict[str, list[str]] = {}  # lineage object -> snapshots
        self.shard_parts: dict[str, list[str]] = {}  # shard -> parts listing it
        self.rows: list[pa.Table] = []  # with samples: the parts' ROW_COLUMNS and "part"

    def _ordered(self, sids: Iterable[str]) -> list[str]:
        return sorted(set(sids), key=self.rank.__getitem__)

    def snapshots(
        self, cat: Catalog, roots: list[tuple[str, str]], *, follow_parents: bool
    ) -> None:
        report = self.report
        for label, sid in roots:
            self.refs.setdefault(sid, []).append(label)
        stack = [sid for _, sid in reversed(roots)]
        while stack:
            sid = stack.pop()
            if sid in self.rank:
                continue
            self.rank[sid] = len(self.rank)
            if not is_object_id(sid):
                self._snapshot_problem(sid, "invalid id", f"invalid snapshot id {sid!r}")
                continue
            try:  # from the store, not the catalog's cache: what is stored is checked
                snap = Snapshot.from_bytes(cat.get_object(sid, kind="snapshot"), object_id=sid)
            except NotFoundError:
                self._snapshot_problem(sid, "missing", f"{cat.store.url}: no snapshot {sid}")
                continue
            except (IntegrityError, FormatError) as exc:
                self._snapshot_problem(sid, "damaged", str(exc))
                continue
            report.snapshots.append(sid)
            report.objects_checked += 1
            for label in self.refs.get(sid, []):
                try:
                    named = parse_ref(label).dataset
                except SimstoreError:
                    continue
                if named != snap.dataset:  # a ref file of another dataset's
                    report.add(VerifyProblem(
                        object=label, kind="ref", problem="damaged", refs=(label,),
                        message=f"ref {label} names snapshot {sid} of dataset "
                        f"{snap.dataset!r}, not of {named!r}",
                    ))  # fmt: skip
            if content_hash_of(snap.parts) != snap.content_hash:
                self._snapshot_problem(
                    sid, "damaged", f"snapshot {sid}: content_hash does not match its parts"
                )
            for part in snap.parts:
                self.claims.setdefault(part.id, {}).setdefault(part, []).append(sid)
            for oid in snap.lineage.get("objects", []):
                self.lineage.setdefault(str(oid), []).append(sid)
            if follow_parents:
                for parent in reversed(snap.parents):
                    self.children.setdefault(parent, []).append(sid)
                    stack.append(parent)
        # the children and refs naming a damaged snapshot are known only now
        for i, p in enumerate(report.problem_objects):
            if p.kind != "snapshot":
                continue
            children = self._ordered(self.children.get(p.object, []))
            refs = self.refs.get(p.object, [])
            how = []
            if children:
                how.append(f"parent of {_named(children)}")
            if refs:
                how.append(f"named by {', '.join(refs)}")
            message = "; ".join([p.message, *how])
            report.problem_objects[i] = replace(
                p, snapshots=tuple(children), refs=tuple(refs), message=message
            )

    def _snapshot_problem(
        self, sid: str, problem: Literal["missing", "damaged", "invalid id"], message: str
    ) -> None:
        self.report.add(
            VerifyProblem(object=sid, kind="snapshot", problem=problem, message=message)
        )

    def parts(self, cat: Catalog,
              decoded: Callable[[str, pa.Table], object] | None = None) -> None:
        report = self.report
        for pid, claims in self.claims.items():
            report.objects_checked += 1
            sids = self._ordered(s for listed in claims.values() for s in listed)
            try:
                data = cat.get_object(pid, kind="manifest part")
                table = decode_part(data, object_id=pid)
            except (NotFoundError, IntegrityError, FormatError) as exc:
                report.add(VerifyProblem(
                    object=pid, kind="manifest part", snapshots=tuple(sids),
                    problem="missing" if isinstance(exc, NotFoundError) else "damaged",
                    message=f"{exc} (manifest part of {_named(sids)})",
                ))  # fmt: skip
                continue
            actual = part_ref(table, data) if table.num_rows else None
            held = {e for e in claims if e == actual or (actual is None and e.rows == 0)}
            if decoded is not None and len(held) == len(claims):
                decoded(pid, table)
            for entry, claimed in claims.items():
                if entry in held:
                    continue
                by = self._ordered(claimed)
                say = f"snapshot{'s' if len(by) > 1 else ''} say{'' if len(by) > 1 else 's'}"
                if actual is None or entry.rows != actual.rows:
                    what = f"has {table.num_rows} rows, {say} {entry.rows}"
                else:  # its entry's other figures: each one a read of the part relies on
                    name = next(f for f in ("content", "first_key", "last_key",
                                            "sample_bytes", "size_bytes")
                                if getattr(entry, f) != getattr(actual, f))
                    what = (f"has {name} {getattr(actual, name)!r}, {say} "
                            f"{getattr(entry, name)!r}")
                report.add(VerifyProblem(
                    object=pid, kind="manifest part", problem="damaged", snapshots=tuple(by),
                    message=f"manifest part {pid} of {_named(by)} {what}",
                ))  # fmt: skip
            shards = pc.unique(table.column("shard")).to_pylist()
            for shard in shards:
                self.shard_parts.setdefault(shard, []).append(pid)
            if report.samples:
                rows = table.select(ROW_COLUMNS)
                if report.split is not None:  # this task's shards' rows only
                    split = report.split
                    mine = pa.array([s for s in shards if in_split(s, split)], pa.string())
                    rows = rows.filter(pc.is_in(rows.column("shard"), mine))
                self.rows.append(rows.append_column(
                    "part", pa.array([pid] * rows.num_rows, pa.string()).dictionary_encode()
                ))

    def _reaching(self, oid: str) -> list[str]:
        sids = list(self.lineage.get(oid, []))
        for pid in self.shard_parts.get(oid, []):
            sids += (s for listed in self.claims[pid].values() for s in listed)
        return self._ordered(sids)

    def objects(self, cat: Catalog, *, deep: bool,
                recorded: Callable[[str, str], object] | None = None) -> None:
        report = self.report
        records = node_records(True, DEFAULT_VERIFY_EVERY_S) if deep else None
        for oid in sorted(self.shard_parts.keys() | self.lineage.keys()):
            if report.split is not None and not in_split(oid, report.split):
                continue
            report.objects_checked += 1
            kind: ProblemKind = "shard" if oid in self.shard_parts else "lineage object"
            if not is_object_id(oid):
                by = self._reaching(oid)
                report.add(VerifyProblem(
                    object=oid, kind=kind, problem="invalid id", snapshots=tuple(by),
                    message=f"{_named(by)} reference{'' if len(by) > 1 else 's'} an invalid "
                    f"object id {oid!r}",
                ))  # fmt: skip
                continue
            key = object_key(oid)
            actual: str | None = None
            stamp: tuple[int, int] | None = None
            path: str | None = None
            # a remote shard whose samples are checked is fetched, and hashed, once: then
            deferred = (
                deep and report.samples and kind == "shard" and cat.store.local_path(key) is None
            )
            try:
                if deep and not deferred:
                    # the stamp before: a file changed while hashed is not recorded
                    stamped_ns = time.time_ns()
                    path = cat.store.local_path(key) if records is not None else None
                    stamp = stamp_info(path) if path is not None else None
                    actual, size = hash_object(cat, oid)
                    report.bytes_hashed += size
                elif not cat.store.exists(key):
                    raise NotFoundError(key)
            except NotFoundError:
                if records is not None:
                    records.forget(oid)
                by = self._reaching(oid)
                report.add(VerifyProblem(
                    object=oid, kind=kind, problem="missing", snapshots=tuple(by),
                    message=f"{key} is missing; referenced by {_named(by)}",
                ))  # fmt: skip
                continue
            if actual == oid and stamp is not None and records is not None and kind == "shard":
                added = records.add(oid, *stamp, stamped_ns)
                report.shards_recorded += added
                if added and recorded is not None and path is not None:
                    recorded(oid, path)
            if actual is not None and actual != oid:
                if records is not None:
                    # a loader trusting an earlier match would go on reading the damage
                    records.forget(oid)
                by = self._reaching(oid)
                report.add(VerifyProblem(
                    object=oid, kind=kind, problem="damaged", snapshots=tuple(by),
                    message=f"{key} has hash {actual}, expected {oid}; referenced by "
                    f"{_named(by)}",
                ))  # fmt: skip


    def sample_rows(
        self, cat: Catalog, *, progress: Callable[[VerifyProgress], None] | None = None
    ) -> None:
        """Each manifest row against its shard (after ``objects``: damage found is skipped)."""
        report = self.report
        skip = {p.object for p in report.problem_objects if p.kind == "shard"}
        if not self.rows:
            return
        rows = pa.concat_tables(self.rows, promote_options="permissive")
        self.rows = []
        started = time.monotonic()
        if skip:
            rows = rows.filter(pc.invert(pc.is_in(rows.column("shard"),
                                                  pa.array(sorted(skip), pa.string()))))
        total_shards = pc.count_distinct(rows.column("shard")).as_py()
        total_bytes = pc.sum(rows.column("size_bytes")).as_py() or 0
        state = {"shards": 0, "bytes": 0}

        def done(check: ShardCheck) -> None:
            report.samples_checked += check.checked
            state["shards"] += 1
            state["bytes"] += check.bytes_read
            if progress is not None:
                progress(VerifyProgress(
                    shards_done=state["shards"], shards_total=total_shards,
                    samples=report.samples_checked, bytes_done=state["bytes"],
                    bytes_total=total_bytes, elapsed_s=time.monotonic() - started,
                ))  # fmt: skip
            report.bytes_hashed += check.bytes_hashed
            if check.ok:
                return
            by = self._reaching(check.shard)
            report.add(VerifyProblem(
                object=check.shard, kind="shard", problem="damaged", snapshots=tuple(by),
                message=check.message(_named(by)),
            ))  # fmt: skip

        check_shards(cat, rows, on_done=done)
