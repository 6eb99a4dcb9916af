"""A ref, snapshot, manifest part, staging entry or store record larger than any simstore
writes is refused unread, with one error naming it.

Found by an audit of planted objects: a snapshot, ref or part planted as a sparse file of
8 GiB (``truncate -s 8G``) was read whole by the commands that read it, which ended with
"out of memory" (exit 1) naming nothing; only gc capped what it read of a snapshot. Each
kind now has a cap (``simstore/catalog/_caps.py``, docs/format.md) that its read checks
against the size the store reports, before reading anything.

The 8 GiB files are sparse (no disk) and read by commands in a process whose address
space is bounded, so a regression fails here instead of taking the machine's memory.
"""

from __future__ import annotations

import glob
import os
import resource
import subprocess
import sys

import pytest
from catalog_helpers import stage_samples

from simstore.catalog import Catalog
from simstore.errors import FormatError, IntegrityError, InvalidInputError
from simstore.hashing import object_key
from simstore.snapshot import SNAPSHOT_HEAD

HUGE = 8 << 30
LIMIT = 2 << 30
"""The address space of a command reading a planted file: a quarter of its size."""
CAPS = {"ref": 4 << 10, "store record": 64 << 10, "staging entry": 1 << 30,
        "snapshot": 1 << 30, "manifest part": 256 << 20}
"""The caps docs/format.md gives."""


@pytest.fixture
def root(tmp_path):
    """A store whose dataset ``ds`` has two snapshots on ``main`` and one staged entry."""
    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    stage_samples(cat, "ds", {"a": b"one" * 10, "b": b"two" * 10})
    cat.commit("ds", message="first")
    stage_samples(cat, "ds", {"c": b"three" * 10})
    cat.commit("ds", message="second")
    stage_samples(cat, "ds", {"d": b"four" * 10})
    return root


def _path(root: str, key: str) -> str:
    return os.path.join(root, *key.split("/"))


def _key(root: str, kind: str) -> str:
    """The key of an object of ``kind`` in the store ``root`` (see the fixture)."""
    cat = Catalog.open(root)
    if kind == "ref":
        return "datasets/ds/refs/heads/main"
    if kind == "store record":
        return "simstore.json"
    if kind == "staging entry":
        (path,) = glob.glob(_path(root, "datasets/ds/staging/*"))
        return "datasets/ds/staging/" + os.path.basename(path)
    snap = cat.snapshot(cat.resolve("ds"))
    return object_key(snap.id if kind == "snapshot" else snap.parts[0].id)


def _grow(path: str, size: int) -> None:
    """Make the file ``size`` bytes long, its first bytes kept (sparse: no disk)."""
    os.truncate(path, size)


def _bounded(*args: str) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    return subprocess.run([sys.executable, "-m", "simstore", *args], capture_output=True,
                          text=True, timeout=120, preexec_fn=limit, check=False)


@pytest.mark.parametrize(("kind", "commands", "code"), [
    ("snapshot", [["log", "ds"], ["show", "ds"], ["gc", "--dry-run"]], 6),
    ("ref", [["ls"], ["snapshot", "ds", "-m", "x"], ["branch", "ds", "--delete", "main"]], 7),
    ("manifest part", [["keys", "ds"], ["diff", "FIRST", "ds"]], 6),
    ("staging entry", [["snapshot", "ds", "-m", "x"], ["unstage", "ds"]], 7),
    ("store record", [["ls"]], 7),
])
def test_a_sparse_8_gib_object_is_one_line_naming_it(root, kind, commands, code):
    key = _key(root, kind)
    cat = Catalog.open(root)
    first = f"ds@{list(cat.log('ds'))[-1][0]}"
    _grow(_path(root, key), HUGE)
    for command in commands:
        run = _bounded("--store", root, *(first if a == "FIRST" else a for a in command))
        assert run.returncode == code, (command, run.returncode, run.stderr)
        (line,) = run.stderr.splitlines()
        assert line.startswith("error: ") and key in line, (command, line)
        assert f"larger than any {kind} simstore writes" in line, line


def test_verify_reports_a_sparse_8_gib_part_and_goes_on(root):
    key = _key(root, "manifest part")
    _grow(_path(root, key), HUGE)
    run = _bounded("--store", root, "verify", "ds")
    assert run.returncode == 6, run.stderr
    assert f"{key} is larger than any manifest part simstore writes" in run.stdout


def test_gc_passes_over_a_sparse_8_gib_object_that_begins_as_a_snapshot(root):
    # gc tells a snapshot no ref names by its first bytes (a snapshot's here), but one
    # over the snapshot cap is none and is not read (as before the cap was shared)
    oid = "ab" * 16
    path = _path(root, object_key(oid))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(SNAPSHOT_HEAD)
    _grow(path, HUGE)
    run = _bounded("--store", root, "gc", "--grace", "0s")
    assert run.returncode == 0, run.stderr
    assert not os.path.exists(path)  # old and unreached: garbage


@pytest.mark.parametrize(("kind", "error"), [
    ("snapshot", IntegrityError),
    ("ref", FormatError),
    ("manifest part", IntegrityError),
    ("staging entry", FormatError),
    ("store record", FormatError),
])
def test_one_byte_over_the_cap_is_the_kind_s_error_naming_it(root, kind, error):
    key = _key(root, kind)
    _grow(_path(root, key), CAPS[kind] + 1)
    cat = Catalog.open(root) if kind != "store record" else None

    def read() -> object:
        if cat is None:
            return Catalog.open(root)
        if kind == "staging entry":
            return cat.staged("ds")
        if kind == "ref":
            return cat.resolve("ds")
        snap = cat.snapshot(cat.resolve("ds"))
        return list(cat.iter_parts(snap))

    with pytest.raises(error) as info:
        read()
    assert type(info.value) is error  # the class the CLI maps to the kind's exit code
    assert key in str(info.value)
    assert f"larger than any {kind} simstore writes" in str(info.value)


def test_the_caps_are_those_format_md_gives():
    from simstore.catalog import _caps

    assert {kind: _caps.max_bytes(kind) for kind in CAPS} == CAPS


@pytest.mark.parametrize("kind", ["manifest part", "snapshot"])
def test_a_commit_writes_no_object_its_readers_would_refuse(root, monkeypatch, kind):
    from simstore.catalog import _caps

    cat = Catalog.open(root)
    head = cat.resolve("ds")
    # the head's own (read by the commit) still fits; the larger one it would write not
    name = "PART_MAX_BYTES" if kind == "manifest part" else "SNAPSHOT_MAX_BYTES"
    monkeypatch.setattr(_caps, name, os.path.getsize(_path(root, _key(root, kind))))
    with pytest.raises(InvalidInputError, match=f"a {kind} .* would be .*, more than any "
                       f"{kind} simstore reads .*target_rows"):
        cat.commit("ds", message="third " * 100)
    assert cat.resolve("ds") == head  # nothing committed; the entry stays staged
    assert len(cat.staged("ds")) == 1


def test_a_staging_entry_too_large_to_read_is_not_staged(root, monkeypatch):
    from simstore.catalog import _caps

    cat = Catalog.open(root)
    with monkeypatch.context() as patched:
        patched.setattr(_caps, "STAGING_MAX_BYTES", 200)
        with pytest.raises(InvalidInputError, match="a staging entry of 1 shards would be .*, "
                           "more than any staging entry simstore reads"):
            stage_samples(cat, "ds", {"e": b"five" * 10})
    assert len(cat.staged("ds")) == 1


class _StoreBeforeTheKeyword:
    """A store written before ``max_bytes`` (its ``get`` and ``get_versioned`` lack it)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.gets: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        self.gets.append(key)
        return self._inner.get(key, byte_range)  # type: ignore[attr-defined,no-any-return]

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        self.gets.append(key)
        return self._inner.get_versioned(key)  # type: ignore[attr-defined,no-any-return]


class _PassingKeywordsOn:
    """A wrapper that passes whatever keywords it gets on to the store it wraps."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def get(self, key: str, byte_range: tuple[int, int] | None = None,
            **kw: object) -> bytes:
        return self._inner.get(key, byte_range, **kw)  # type: ignore[attr-defined,no-any-return]

    def get_versioned(self, key: str, **kw: object) -> tuple[bytes, str]:
        return self._inner.get_versioned(key, **kw)  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("kind", ["snapshot", "ref", "manifest part", "staging entry"])
@pytest.mark.parametrize("wrapped", ["as is", "keywords passed on", "counted"])
def test_a_store_without_the_keyword_still_reads_and_refuses(root, kind, wrapped):
    """Found by a review: the catalog passed ``max_bytes`` to every store, so a store of
    the protocol as it was (a caller's own backend) failed every read with a TypeError,
    and so did one behind a wrapper passing ``**kwargs`` on. Such a store is asked the
    object's size first; a ``CountingStore`` in front counts that as the HEAD it is."""
    from simstore.storage import CountingStore, LocalStore, open_store

    store = _StoreBeforeTheKeyword(LocalStore(root))
    outer: object = store
    if wrapped == "keywords passed on":
        outer = _PassingKeywordsOn(store)
    elif wrapped == "counted":
        outer = CountingStore(store)  # type: ignore[arg-type]
    assert open_store(outer) is outer  # type: ignore[arg-type]
    cat = Catalog.open(outer)  # type: ignore[arg-type]
    snap = cat.snapshot(cat.resolve("ds"))
    assert [p.num_rows for p in cat.iter_parts(snap)] and cat.staged("ds")
    assert store.gets  # read through the old signature

    key = _key(root, kind)
    _grow(_path(root, key), CAPS[kind] + 1)
    if wrapped == "counted":
        from simstore.cost import OpClass

        usage = outer.traffic.tier(outer.tier)  # type: ignore[attr-defined]
        heads = usage.usage(OpClass.HEAD).requests
        assert heads >= len(store.gets) > 0, usage  # a size asked per read, counted
    store.gets.clear()
    cat = Catalog.open(outer)  # type: ignore[arg-type]  # nothing read before kept
    with pytest.raises((FormatError, IntegrityError)) as info:
        if kind == "staging entry":
            cat.staged("ds")
        elif kind == "ref":
            cat.resolve("ds")
        else:
            list(cat.iter_parts(cat.snapshot(cat.resolve("ds"))))
    assert key in str(info.value)
    assert f"larger than any {kind} simstore writes" in str(info.value)
    assert key not in store.gets  # refused by its size, unread
