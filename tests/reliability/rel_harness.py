"""Shared machinery of the reliability suite and the stress run (tests/stress/run.py).

- :class:`HookStore` wraps an ``ObjectStore`` and calls hooks around chosen operations:
  the deterministic way to put a crash, a concurrent gc or a concurrent commit at an exact
  point between two storage calls.
- :func:`kill_after` makes a hook that SIGKILLs the current process at the k-th mutating
  call (before or after it runs): a crash at every possible point between writes.
- :func:`store_problems` checks every promise a store keeps after a crash: every ref and
  every snapshot in every history verifies (deep for heads), every staging entry names
  objects that exist, and no key lies outside the store's layout.
- ``op_*`` functions are what a killed child process runs (ingest, snapshot, gc, a training
  loop); they take only picklable arguments, so a ``forkserver`` context (with the heavy
  modules preloaded) starts them in milliseconds.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from simstore.catalog import Catalog, gc, verify
from simstore.hashing import is_object_id, object_key
from simstore.storage import LocalStore, ObjectInfo, ObjectStore
from simstore.testing.s3 import atomic_moto_writes  # noqa: F401  (re-exported)

MUTATING = ("put", "put_if_absent", "put_file", "move_file", "compare_and_swap", "delete")
PRELOAD = [
    "numpy",
    "pyarrow.parquet",
    "zarr",
    "simstore.catalog",
    "simstore.ingest",
    "simstore.formats",
    "simstore.formats.adapters",
    "rel_harness",
]

Hook = Callable[[str, str, int], None]


class HookStore:
    """An ObjectStore that runs ``before``/``after`` hooks around every call.

    A hook gets ``(method, key, n)`` where ``n`` counts mutating calls so far (1-based,
    including this one; 0 for reads). Everything else is the inner store's behaviour, so
    the local fast paths (``scratch_dir``/``move_file``) stay in use.
    """

    def __init__(
        self, inner: ObjectStore, *, before: Hook | None = None, after: Hook | None = None
    ) -> None:
        self.inner = inner
        self.before = before
        self.after = after
        self.mutations = 0

    # attributes the protocol requires
    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def read_only(self) -> bool:
        return self.inner.read_only

    @property
    def supports_atomic_cas(self) -> bool:
        return self.inner.supports_atomic_cas

    @supports_atomic_cas.setter
    def supports_atomic_cas(self, value: bool) -> None:
        self.inner.supports_atomic_cas = value

    def _call(self, method: str, key: str, *args: Any, **kwargs: Any) -> Any:
        n = 0
        if method in MUTATING:
            self.mutations += 1
            n = self.mutations
        if self.before is not None:
            self.before(method, key, n)
        result = getattr(self.inner, method)(key, *args, **kwargs)
        if self.after is not None:
            self.after(method, key, n)
        return result

    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        return self._call(  # type: ignore[no-any-return]
            "get", key, byte_range, max_bytes=max_bytes)

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        return self._call(  # type: ignore[no-any-return]
            "get_versioned", key, max_bytes=max_bytes)

    def put(self, key: str, data: bytes) -> None:
        self._call("put", key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._call("put_if_absent", key, data)  # type: ignore[no-any-return]

    def put_file(self, key: str, path: str) -> bool:
        return self._call("put_file", key, path)  # type: ignore[no-any-return]

    def move_file(self, key: str, path: str) -> bool:
        return self._call("move_file", key, path)  # type: ignore[no-any-return]

    def scratch_dir(self) -> str:
        return self.inner.scratch_dir()  # type: ignore[attr-defined,no-any-return]

    def compare_and_swap(self, key: str, expected: str | None, data: bytes | None) -> str | None:
        return self._call("compare_and_swap", key, expected, data)  # type: ignore[no-any-return]

    def exists(self, key: str) -> bool:
        return self._call("exists", key)  # type: ignore[no-any-return]

    def info(self, key: str) -> ObjectInfo:
        return self._call("info", key)  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        self._call("delete", key)

    def list(self, prefix: str = "") -> Iterator[str]:
        if self.before is not None:
            self.before("list", prefix, 0)
        return self.inner.list(prefix)

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if self.before is not None:
            self.before("list_info", prefix, 0)
        return self.inner.list_info(prefix)

    def list_temporary(self, older_than: float) -> Iterator[str]:
        return self.inner.list_temporary(older_than)  # type: ignore[attr-defined,no-any-return]

    def local_path(self, key: str) -> str | None:
        return self.inner.local_path(key)


def kill_after(k: int, when: str) -> Hook:
    """A hook that SIGKILLs this process at the k-th mutating call, ``before`` or ``after`` it."""

    def hook(method: str, key: str, n: int) -> None:
        if n == k:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def killing_store(root: str, kill: tuple[int, str] | None) -> ObjectStore:
    """A local store, wrapped so that it kills the process at a chosen write (or never)."""
    inner = LocalStore(root)
    if kill is None:
        return inner
    k, when = kill
    hook = kill_after(k, when)
    return HookStore(
        inner, before=hook if when == "before" else None, after=hook if when == "after" else None
    )


class CacheOnlyStore(LocalStore):
    """A local store that claims no local paths, so the loader reads it as a remote tier.

    That puts the loader's disk cache (fills, locks, pins) in the path of every read,
    which is what a crashed training job on a remote store leaves behind.
    """

    def local_path(self, key: str) -> str | None:
        return None




# -- sources ---------------------------------------------------------------------------
def write_sources(root: str, version: int, *, count: int = 6, seed: int = 0) -> None:
    """Deterministic .npz runs; version ``v`` changes two files and adds one per step.

    ``run000..run{count-1}`` exist in every version; at version v, files ``v % count`` and
    ``(v + 1) % count`` carry version-specific values and ``extra{v:03d}`` is added.
    """
    os.makedirs(root, exist_ok=True)
    for i in range(count):
        tag = version if i in (version % count, (version + 1) % count) else -1
        _write_run(os.path.join(root, f"run{i:03d}.npz"), seed * 1000 + i, tag)
    for name in os.listdir(root):
        if name.startswith("extra"):
            os.unlink(os.path.join(root, name))
    if version > 0:
        _write_run(os.path.join(root, f"extra{version:03d}.npz"), seed * 1000 + 500, version)


def _write_run(path: str, seed: int, tag: int) -> None:
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((3, 8, 8)).astype(np.float32)
    if tag >= 0:
        u = u + np.float32(tag)
    buf = io.BytesIO()
    np.savez(buf, u=u, re=np.float64(100 + seed % 1000), tag=np.int64(tag))
    data = buf.getvalue()
    if os.path.exists(path):
        with open(path, "rb") as f:
            if f.read() == data:
                return  # unchanged: keep its mtime, so the ingest journal still matches
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


# -- checks ----------------------------------------------------------------------------
def store_problems(cat: Catalog, *, deep_heads: bool = True) -> list[str]:
    """Every broken promise this store shows (empty when it is clean).

    - each branch and tag verifies (deep: every shard re-hashed), and so does every
      snapshot in its history (every part intact, every shard present);
    - each staging entry parses and every object it names exists;
    - every key under ``objects/`` is ``objects/<2 hex>/<id>``.
    """
    problems: list[str] = []
    seen: set[str] = set()
    for dataset in cat.datasets():
        heads: list[str] = []
        for refs in (cat.branches(dataset), cat.tags(dataset)):
            try:
                heads += [sid for _, sid in refs.list()]
            except Exception as exc:  # a ref that does not parse is a problem to report
                problems.append(f"{dataset}: refs unreadable: {exc}")
        for sid in heads:
            report = verify(cat, f"{dataset}@{sid}", deep=deep_heads)
            problems += report.problems
            seen.add(sid)
            try:
                history = [s for s, _ in cat.log(f"{dataset}@{sid}")][1:]
            except Exception as exc:
                problems.append(f"{dataset}@{sid}: history unreadable: {exc}")
                continue
            for old in history:
                if old in seen:
                    continue
                seen.add(old)
                problems += verify(cat, f"{dataset}@{old}").problems
        try:
            entries = cat.staged(dataset)
        except Exception as exc:
            problems.append(f"{dataset}: staging unreadable: {exc}")
            continue
        for entry in entries:
            for oid in entry.referenced_objects():
                if not cat.store.exists(object_key(oid)):
                    problems.append(f"staging entry {entry.id} names missing object {oid}")
    for key in cat.store.list("objects/"):
        parts = key.split("/")
        if len(parts) != 3 or not is_object_id(parts[2]) or parts[1] != parts[2][:2]:
            problems.append(f"stray key {key}")
    return problems


def content(cat: Catalog, ref: str) -> dict[str, str]:
    """``{key: sample hash}`` of a ref."""
    snap = cat.snapshot(cat.resolve(ref))
    out: dict[str, str] = {}
    for table in cat.iter_parts(snap):
        keys = table.column("key").to_pylist()
        hashes = table.column("sample_hash").to_pylist()
        out.update({k: h.hex() for k, h in zip(keys, hashes, strict=True)})
    return out


def head(cat: Catalog, dataset: str, branch: str = "main") -> str | None:
    """The snapshot a branch points at, or None."""
    return cat.branches(dataset).get_versioned(branch)[0]


def unreachable_objects(cat: Catalog) -> set[str]:
    """Objects no ref, ancestor or staging entry reaches (what gc with grace 0 removes)."""
    from simstore.catalog import reachable_objects

    roots = {
        sid
        for d in cat.datasets()
        for refs in (cat.branches(d), cat.tags(d))
        for _, sid in refs.list()
    }
    keep = reachable_objects(cat, roots)
    for d in cat.datasets():
        for e in cat.staged(d):
            keep.update(e.referenced_objects())
    return {k.rsplit("/", 1)[-1] for k in cat.store.list("objects/")} - keep


def files_outside(root: str, allowed: str) -> list[str]:
    """Files under ``root`` that are not under ``allowed``."""
    out = []
    allowed = os.path.abspath(allowed)
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.abspath(os.path.join(dirpath, name))
            if not path.startswith(allowed + os.sep):
                out.append(path)
    return sorted(out)


# -- what a killed child runs ----------------------------------------------------------
def op_ingest(
    root: str,
    src: str,
    dataset: str,
    kill: tuple[int, str] | None,
    snapshot: bool = True,
    mode: str = "upsert",
) -> None:
    """Ingest ``src`` (and commit it)."""
    from simstore.ingest import ingest

    cat = Catalog(killing_store(root, kill))
    ingest(
        [src],
        dataset=dataset,
        store=cat,
        snapshot=snapshot,
        message="ingest" if snapshot else None,
        shard_size=64 * 1024,
        mode=mode,
    )  # type: ignore[arg-type]


def op_snapshot(root: str, dataset: str, kill: tuple[int, str] | None) -> None:
    """Commit everything staged."""
    cat = Catalog(killing_store(root, kill))
    cat.commit(dataset, message="snapshot")


def op_gc(root: str, kill: tuple[int, str] | None) -> None:
    """Collect everything unreachable (grace 0: nothing else writes meanwhile)."""
    gc(Catalog(killing_store(root, kill)), grace_s=0)


def op_train(
    root: str,
    ref: str,
    cache_dir: str,
    log_path: str,
    ckpt_path: str,
    num_workers: int,
    state: Mapping[str, Any] | None,
) -> None:
    """A training loop over a cache-backed store that logs keys and checkpoints often.

    After every batch the keys it delivered are appended to ``log_path``; every second
    batch the loader state and the number of logged keys are written to ``ckpt_path``
    atomically (temporary file and rename), as a training job saves its checkpoint. The
    job is its own process group, as a scheduler's job is: its DataLoader workers can be
    found (and killed) by group even after its main process is gone.
    """
    from simstore.loaders import SimDataLoader, SimDataset

    os.setpgid(0, 0)
    ds = SimDataset(
        CacheOnlyStore(root, read_only=True),
        ref,
        shuffle=True,
        seed=3,
        cache_dir=cache_dir,
        prefetch=2,
    )
    # fork, as a training script on Linux does by default (a child of a forkserver would
    # otherwise inherit the forkserver method and start a second, cold server)
    loader = SimDataLoader(
        ds,
        batch_size=2,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )
    if state is not None:
        loader.load_state_dict(state)
    logged = 0
    with open(log_path, "a") as log:
        for i, batch in enumerate(loader):
            log.write("".join(f"{k}\n" for k in batch["__key__"]))
            log.flush()
            logged += len(batch["__key__"])
            if i % 2 == 1:
                tmp = f"{ckpt_path}.tmp"
                with open(tmp, "w") as f:
                    json.dump({"state": loader.state_dict(), "logged": logged}, f)
                os.replace(tmp, ckpt_path)
            time.sleep(0.01)


def wait_until_orphaned(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` that announces itself and waits for its parent to die.

    It writes ``<SIMSTORE_REL_READY>/worker-<pid>`` and returns once the process that
    started it is gone (at most 120 s): the main process dies while its workers start up,
    deterministically.
    """
    parent = os.getppid()
    with open(os.path.join(os.environ["SIMSTORE_REL_READY"], f"worker-{os.getpid()}"), "w"):
        pass
    deadline = time.monotonic() + 120
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.01)


def op_train_startup(root: str, ref: str, num_workers: int, ready_dir: str) -> None:
    """Start a loader whose workers wait in :func:`wait_until_orphaned`; read one epoch."""
    from simstore.loaders import SimDataLoader, SimDataset

    os.environ["SIMSTORE_REL_READY"] = ready_dir
    ds = SimDataset(CacheOnlyStore(root, read_only=True), ref, shuffle=True, seed=3)
    loader = SimDataLoader(
        ds,
        batch_size=2,
        num_workers=num_workers,
        multiprocessing_context="fork",
        worker_init_fn=wait_until_orphaned,
    )
    for _ in loader:
        pass


def epoch_keys(
    root: str, ref: str, cache_dir: str | None = None, num_workers: int = 0
) -> list[str]:
    """Keys of one epoch, in order (seed 3, batch 2), as ``op_train`` reads them."""
    from simstore.loaders import SimDataLoader, SimDataset

    store: ObjectStore = CacheOnlyStore(root, read_only=True)
    ds = SimDataset(store, ref, shuffle=True, seed=3, cache_dir=cache_dir, prefetch=2)
    loader = SimDataLoader(
        ds,
        batch_size=2,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )
    return [k for batch in loader for k in batch["__key__"]]


def run_killed(
    ctx: Any,
    target: Callable[..., None],
    args: tuple[Any, ...],
    delay_s: float | None,
    timeout_s: float = 120.0,
) -> str:
    """Run ``target`` in a child; SIGKILL it after ``delay_s`` (None: let it finish).

    Returns how it ended: ``killed`` (by us or by its own kill hook), ``finished`` or
    ``failed`` (non-zero exit).
    """
    proc = ctx.Process(target=target, args=args)
    proc.start()
    if delay_s is not None:
        proc.join(delay_s)
        if proc.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                kill_tree(proc.pid)
    proc.join(timeout_s)
    if proc.exitcode is None:
        kill_tree(proc.pid)
        proc.join()
        raise AssertionError(f"{target.__name__} hung for {timeout_s} s")
    if proc.exitcode == -signal.SIGKILL:
        return "killed"
    return "finished" if proc.exitcode == 0 else "failed"


def kill_tree(pid: int) -> list[int]:
    """SIGKILL a process and its descendants (a DataLoader's workers); returns their pids."""
    import psutil

    try:
        parent = psutil.Process(pid)
        children = parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    pids = [pid] + [c.pid for c in children]
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return pids


# -- kill trials -----------------------------------------------------------------------
# Each scenario owns a store and runs trials: pick a random point, start the operation in
# a child, SIGKILL it there, check every promise, finish the work, check convergence.
# Points are either a mutating storage call (kill just before or just after the k-th
# write, delete or swap: every step of the protocol) or a random instant (which can land
# in the middle of a write, an fsync or a rename).
@dataclass
class Trial:
    """One kill trial and what it found."""

    scenario: str
    point: str
    outcome: str
    problems: list[str]
    lost: int
    converged: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "point": self.point,
            "outcome": self.outcome,
            "problems": self.problems,
            "lost": self.lost,
            "converged": self.converged,
        }


def _choose_point(
    rng: random.Random, writes: int, duration_s: float
) -> tuple[tuple[int, str] | None, float | None, str]:
    if rng.random() < 0.6:
        k = rng.randint(1, max(1, writes))
        when = rng.choice(["before", "after"])
        return (k, when), None, f"{when} write {k}/{writes}"
    delay = rng.uniform(0.0, duration_s * 1.1)
    return None, delay, f"at {delay:.3f} s of {duration_s:.3f} s"


def _content_hash(cat: Catalog, dataset: str, branch: str = "main") -> str | None:
    sid = head(cat, dataset, branch)
    return cat.snapshot(sid).content_hash if sid else None


class _Counting:
    """Counts mutating calls of a run (to size the choice of kill points)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, method: str, key: str, n: int) -> None:
        self.n = max(self.n, n)


class IngestScenario:
    """Re-ingest a changing source folder (``--mode replace --snapshot``); kill the ingest."""

    name = "ingest"

    def __init__(self, workdir: str, ctx: Any) -> None:
        self.ctx = ctx
        self.root = os.path.join(workdir, "ingest-store")
        self.src = os.path.join(workdir, "ingest-src")
        self.version = 0
        Catalog.init(self.root)
        write_sources(self.src, 0)
        counter = _Counting()
        t0 = time.perf_counter()
        from simstore.ingest import ingest

        ingest(
            [self.src],
            dataset="ds",
            store=Catalog(HookStore(LocalStore(self.root), after=counter)),
            snapshot=True,
            message="v0",
            shard_size=64 * 1024,
        )
        self.duration_s = max(0.05, time.perf_counter() - t0)
        self.writes = counter.n + 2

    def expected(self) -> str:
        ref = Catalog.init(f"memory://rel-expected-{uuid.uuid4().hex}")
        from simstore.ingest import ingest

        ingest(
            [self.src], dataset="ds", store=ref, snapshot=True, message="x", shard_size=64 * 1024
        )
        value = _content_hash(ref, "ds")
        assert value is not None
        return value

    def trial(self, rng: random.Random) -> Trial:
        self.version += 1
        write_sources(self.src, self.version)
        expected = self.expected()
        cat = Catalog.open(self.root)
        before = _content_hash(cat, "ds")
        kill, delay, point = _choose_point(rng, self.writes, self.duration_s)
        outcome = run_killed(
            self.ctx, op_ingest, (self.root, self.src, "ds", kill, True, "replace"), delay
        )
        cat = Catalog.open(self.root)
        problems = store_problems(cat)
        now = _content_hash(cat, "ds")
        if now not in (before, expected):
            problems.append(f"branch holds content {now}, neither old {before} nor new {expected}")
        op_ingest(self.root, self.src, "ds", None, True, "replace")  # the re-run
        cat = Catalog.open(self.root)
        problems += store_problems(cat)
        final = _content_hash(cat, "ds")
        return Trial(self.name, point, outcome, problems, int(final != expected), final == expected)


class SnapshotScenario:
    """Stage a change in process, commit it in a child; kill the commit."""

    name = "snapshot"

    def __init__(self, workdir: str, ctx: Any) -> None:
        self.ctx = ctx
        self.root = os.path.join(workdir, "snapshot-store")
        self.src = os.path.join(workdir, "snapshot-src")
        self.version = 0
        Catalog.init(self.root)
        write_sources(self.src, 0, seed=1)
        op_ingest(self.root, self.src, "ds", None)
        self._stage_next()
        counter = _Counting()
        t0 = time.perf_counter()
        Catalog(HookStore(LocalStore(self.root), after=counter)).commit("ds", message="s")
        self.duration_s = max(0.02, time.perf_counter() - t0)
        self.writes = counter.n + 1

    def _stage_next(self) -> None:
        self.version += 1
        write_sources(self.src, self.version, seed=1)
        op_ingest(self.root, self.src, "ds", None, snapshot=False)

    def trial(self, rng: random.Random) -> Trial:
        self._stage_next()
        cat = Catalog.open(self.root)
        before = content(cat, "ds")
        staged = cat.staged("ds")
        expected = dict(before)
        for entry in staged:
            changes = cat._read_changes(entry)
            expected.update(
                zip(
                    changes.column("key").to_pylist(),
                    (x.hex() for x in changes.column("sample_hash").to_pylist()),
                    strict=True,
                )
            )
        kill, delay, point = _choose_point(rng, self.writes, self.duration_s)
        outcome = run_killed(self.ctx, op_snapshot, (self.root, "ds", kill), delay)
        cat = Catalog.open(self.root)
        problems = store_problems(cat)
        now = content(cat, "ds")
        if now not in (before, expected):
            problems.append("branch holds neither the old nor the new content")
        cat.commit("ds", message="re-run")
        cat = Catalog.open(self.root)
        problems += store_problems(cat)
        if cat.staged("ds"):
            problems.append(f"{len(cat.staged('ds'))} staging entries left after the re-run")
        final = content(cat, "ds")
        lost = sum(1 for k, v in expected.items() if final.get(k) != v)
        return Trial(self.name, point, outcome, problems, lost, final == expected)


class GcScenario:
    """Make garbage (a deleted branch, consumed change sets); kill gc mid-way."""

    name = "gc"

    def __init__(self, workdir: str, ctx: Any) -> None:
        self.ctx = ctx
        self.root = os.path.join(workdir, "gc-store")
        self.src = os.path.join(workdir, "gc-src")
        self.version = 0
        Catalog.init(self.root)
        write_sources(self.src, 0, seed=2)
        op_ingest(self.root, self.src, "ds", None)
        self._make_garbage()
        counter = _Counting()
        t0 = time.perf_counter()
        gc(Catalog(HookStore(LocalStore(self.root), after=counter)), grace_s=0)
        self.duration_s = max(0.02, time.perf_counter() - t0)
        self.writes = counter.n + 1

    def _make_garbage(self) -> None:
        from simstore.ingest import ingest

        self.version += 1
        cat = Catalog.open(self.root)
        side = f"side{self.version}"
        cat.branches("ds").create(side, cat.resolve("ds"))
        write_sources(self.src, self.version, seed=2)
        ingest(
            [self.src],
            dataset="ds",
            store=cat,
            snapshot=True,
            message="side",
            branch=side,
            shard_size=64 * 1024,
        )
        cat.branches("ds").delete(side)
        if self.version % 2 == 0:  # and, every other time, move main on too
            ingest(
                [self.src],
                dataset="ds",
                store=cat,
                snapshot=True,
                message="main",
                shard_size=64 * 1024,
            )

    def trial(self, rng: random.Random) -> Trial:
        self._make_garbage()
        cat = Catalog.open(self.root)
        before = content(cat, "ds")
        garbage = unreachable_objects(cat)
        kill, delay, point = _choose_point(rng, max(1, len(garbage)), self.duration_s)
        outcome = run_killed(self.ctx, op_gc, (self.root, kill), delay)
        cat = Catalog.open(self.root)
        problems = store_problems(cat)
        gc(cat, grace_s=0)
        problems += store_problems(cat)
        left = unreachable_objects(cat)
        if left:
            problems.append(f"{len(left)} unreachable objects left after a complete gc")
        final = content(cat, "ds")
        lost = sum(1 for k, v in before.items() if final.get(k) != v)
        return Trial(self.name, point, outcome, problems, lost, not left and final == before)


class TrainScenario:
    """A training loop over a cache-backed store, killed (with its workers) mid-epoch.

    Afterwards: no shared memory of the dead processes is left, the next start resumes
    from the last checkpoint and delivers exactly the rest of the epoch in order, and the
    cache holds only complete, verified copies.
    """

    name = "train"

    def __init__(self, workdir: str, ctx: Any, *, num_workers: int = 2) -> None:
        self.ctx = ctx
        self.workdir = workdir
        self.root = os.path.join(workdir, "train-store")
        src = os.path.join(workdir, "train-src")
        self.num_workers = num_workers
        self.n = 0
        Catalog.init(self.root)
        write_sources(src, 0, count=40, seed=3)
        from simstore.ingest import ingest

        ingest(
            [src],
            dataset="ds",
            store=self.root,
            snapshot=True,
            message="train",
            shard_size=16 * 1024,
        )
        self.ref = f"ds@{Catalog.open(self.root).resolve('ds')}"
        # the reference epoch, twice: the first run also starts the forkserver; the
        # second, warm, is the duration kill instants are drawn from
        for run in ("cold", "warm"):
            log = os.path.join(workdir, f"train-reference-{run}.log")
            t0 = time.perf_counter()
            outcome = run_killed(
                ctx,
                op_train,
                (
                    self.root,
                    self.ref,
                    os.path.join(workdir, f"train-ref-cache-{run}"),
                    log,
                    log + ".ckpt",
                    num_workers,
                    None,
                ),
                None,
            )
            assert outcome == "finished", outcome
            self.duration_s = time.perf_counter() - t0
            self.reference = _read_lines(log)

    def trial(self, rng: random.Random) -> Trial:
        self.n += 1
        base = os.path.join(self.workdir, f"train-{self.n}")
        cache = os.path.join(self.workdir, "train-cache")  # shared by every trial
        log, ckpt = base + ".log", base + ".ckpt"
        delay = rng.uniform(0.0, self.duration_s)
        shm_before = _shm_entries()
        proc = self.ctx.Process(
            target=op_train, args=(self.root, self.ref, cache, log, ckpt, self.num_workers, None)
        )
        proc.start()
        proc.join(delay)
        pids: list[int] = []
        whole_tree = rng.random() < 0.5
        if proc.exitcode is None:
            # a job killed whole (a scheduler kills the job's process group or cgroup), or
            # only its main process (the OOM killer): then its DataLoader workers notice
            # and exit
            pids = _tree(proc.pid)
            if whole_tree:
                _kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)
        outcome = (
            "killed"
            if proc.exitcode == -signal.SIGKILL
            else ("finished" if proc.exitcode == 0 else "failed")
        )
        problems: list[str] = []
        # by group, not by the tree seen before the kill: a worker forked just before
        # the kill is in the group but was in no tree
        members = _group(proc.pid)
        pids = sorted(set(pids) | set(members))
        if not _wait_gone(members, 30.0):
            problems.append("workers of the killed loader did not exit within 30 s")
            _kill_group(proc.pid)  # recorded; do not let them pile up over many trials
        leaked = [
            e
            for e in _shm_entries() - shm_before
            if any(f"_{p}_" in e or e.endswith(f"_{p}") for p in pids)
        ]
        if leaked:
            problems.append(f"shared memory left by the killed loader: {sorted(leaked)}")
        logged = _read_lines(log)
        state = None
        done = 0
        if os.path.exists(ckpt):
            with open(ckpt) as f:
                saved = json.load(f)
            state, done = saved["state"], int(saved["logged"])
        resumed_log = base + ".resumed.log"
        again = run_killed(
            self.ctx,
            op_train,
            (
                self.root,
                self.ref,
                cache,
                resumed_log,
                resumed_log + ".ckpt",
                self.num_workers,
                state,
            ),
            None,
        )
        if again != "finished":
            problems.append(f"the next start {again}")
        delivered = logged[:done] + _read_lines(resumed_log)
        if delivered != self.reference:
            problems.append(
                f"resumed epoch differs from the reference ({len(delivered)} keys, "
                f"{len(self.reference)} expected; checkpoint at {done})"
            )
        problems += _cache_problems(cache)
        lost = len(set(self.reference) - set(delivered))
        what = "job" if whole_tree else "main process"
        return Trial(
            self.name,
            f"{what} at {delay:.3f} s of {self.duration_s:.3f} s",
            outcome,
            problems,
            lost,
            delivered == self.reference,
        )


def _read_lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    import psutil

    out = []
    for p in psutil.pids():
        with contextlib.suppress(OSError):
            if os.getpgid(p) == pgid:
                out.append(p)
    return out


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tree(pid: int) -> list[int]:
    import psutil

    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _wait_gone(pids: list[int], timeout_s: float) -> bool:
    """Wait until every process in ``pids`` has exited; False on timeout."""
    import psutil

    deadline = time.monotonic() + timeout_s
    for p in pids:
        try:
            psutil.Process(p).wait(max(0.0, deadline - time.monotonic()))
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            return False
    return True


def _cache_problems(cache: str) -> list[str]:
    """Files in the cache that are partial or do not hash to their names."""
    from simstore.hashing import hash_file

    problems = []
    tmp = os.path.join(cache, "tmp")
    if os.path.isdir(tmp) and os.listdir(tmp):
        problems.append(f"partial cache fills left after the next run: {os.listdir(tmp)}")
    objects = os.path.join(cache, "objects")
    for dirpath, _dirs, files in os.walk(objects):
        for name in files:
            actual, _ = hash_file(os.path.join(dirpath, name))
            if actual != name:
                problems.append(f"cache copy {name} has hash {actual}")
    return problems


SCENARIOS = {
    "ingest": IngestScenario,
    "snapshot": SnapshotScenario,
    "gc": GcScenario,
    "train": TrainScenario,
}


# -- concurrent writers ----------------------------------------------------------------
def stage_payloads(cat: Catalog, dataset: str, items: Mapping[str, bytes]) -> Any:
    """Stage ``{key: payload}``; each payload is stored as its own object (a 'shard')."""
    import pyarrow as pa

    from simstore.hashing import hash_bytes
    from simstore.manifest import ManifestRow, rows_from_list

    rows = []
    for key, payload in sorted(items.items()):
        oid, _ = cat.put_object(payload)
        rows.append(
            ManifestRow(
                key=key,
                sample_hash=hash_bytes(b"s" + payload),
                shard=oid,
                position=0,
                size_bytes=len(payload),
            )
        )
    table = rows_from_list(rows)
    table = table.append_column("deleted", pa.array([False] * len(rows)))
    return cat.stage(dataset, changes=table, shards=[r.shard for r in rows])


def op_commit_loop(
    url: str, storage_options: Mapping[str, Any] | None, writer: int, commits: int, result_path: str
) -> None:
    """Commit ``commits`` times to ``ds@main``: key ``w<writer>-<i>`` and key ``shared``.

    Writes ``{"attempts": [...]}`` to ``result_path`` when done.
    """
    cat = Catalog.open(url, storage_options=storage_options)
    attempts = []
    for i in range(commits):
        payload = f"{writer}-{i}".encode() * 20
        entry = stage_payloads(cat, "ds", {f"w{writer}-{i:03d}": payload, "shared": payload})
        res = cat.commit("ds", message=f"{writer}:{i}", staging_ids=[entry.id], max_attempts=200)
        attempts.append(res.attempts)
    with open(result_path, "w") as f:
        json.dump({"attempts": attempts}, f)


def run_writers(
    ctx: Any,
    url: str,
    storage_options: Mapping[str, Any] | None,
    writers: int,
    commits: int,
    workdir: str,
) -> list[int]:
    """Start ``writers`` committing processes at once; returns every commit's attempts."""
    procs = []
    for w in range(writers):
        path = os.path.join(workdir, f"writer-{w}.json")
        procs.append(
            (
                ctx.Process(target=op_commit_loop, args=(url, storage_options, w, commits, path)),
                path,
            )
        )
    for proc, _ in procs:
        proc.start()
    attempts: list[int] = []
    for proc, path in procs:
        proc.join(600)
        if proc.exitcode is None:
            kill_tree(proc.pid)
            raise AssertionError("a committing writer hung")
        assert proc.exitcode == 0, f"writer exited with {proc.exitcode}"
        with open(path) as f:
            attempts += json.load(f)["attempts"]
    return attempts


def commit_problems(cat: Catalog, writers: int, commits: int) -> list[str]:
    """What is wrong with ``ds@main`` after :func:`run_writers` (empty: no commit lost)."""
    from simstore.hashing import hash_bytes

    problems = []
    log = [s.message for _, s in cat.log("ds")]
    want = {f"{w}:{i}" for w in range(writers) for i in range(commits)}
    if sorted(log) != sorted(want):
        missing = sorted(want - set(log))
        extra = len(log) - len(set(log))
        problems.append(
            f"log has {len(log)} commits for {len(want)}: missing {missing[:5]}, {extra} duplicates"
        )
    data = content(cat, "ds")
    for w in range(writers):
        for i in range(commits):
            payload = f"{w}-{i}".encode() * 20
            if data.get(f"w{w}-{i:03d}") != hash_bytes(b"s" + payload):
                problems.append(f"sample w{w}-{i:03d} lost")
    # 'shared' holds the payload of the newest commit in the log
    newest = log[0].split(":") if log else ["?", "?"]
    latest = f"{newest[0]}-{newest[1]}".encode() * 20
    if data.get("shared") != hash_bytes(b"s" + latest):
        problems.append("key 'shared' does not hold the newest commit's write")
    problems += store_problems(cat)
    if cat.staged("ds"):
        problems.append(f"{len(cat.staged('ds'))} staging entries left")
    return problems


def op_ingest_versions(root: str, src: str, dataset: str, versions: int, seed: int) -> None:
    """Ingest ``versions`` successive versions of a source folder, committing each."""
    for v in range(versions):
        write_sources(src, v, seed=seed)
        op_ingest(root, src, dataset, None, True, "replace")


def op_stuck_fill(cache_dir: str, object_id: str, data: bytes, ready_path: str) -> None:
    """Start filling the loader's disk cache with ``object_id`` and hang half-way.

    Writes half the bytes, then the file ``ready_path``, then sleeps while holding the
    fill's stripe lock, until it is killed: a loader that died mid-download.
    """
    from simstore.loaders._cache import CacheConfig, ShardCache
    from simstore.loaders._stats import Counters

    cache = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=1 << 30), Counters())

    def download(out: Any) -> None:
        out.write(data[: len(data) // 2])
        out.raw.flush()
        with open(ready_path, "w") as f:
            f.write("filling")
        time.sleep(3600)

    cache.acquire(object_id, lambda: len(data), download)


class QuotaStore(LocalStore):
    """A local store that runs out of space after ``budget`` bytes of writes."""

    def __init__(self, root: str, budget: int) -> None:
        super().__init__(root)
        self.budget = budget

    def _spend(self, size):
        if size > self.budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget -= size

    def _write_tmp(self, path, data, src=None):
        self._spend(os.path.getsize(src) if src is not None else len(data or b""))
        return super()._write_tmp(path, data, src)

    def move_file(self, key, path):
        # a shard built in scratch took its space when it was written: charge it here
        try:
            self._spend(os.path.getsize(path))
        except OSError as exc:
            os.unlink(path)
            raise self._error("write", key, exc) from exc
        return super().move_file(key, path)
