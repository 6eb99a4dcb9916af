import os
import random

import pytest
from catalog_helpers import content, expected_hash, stage_samples

from simstore.catalog import Catalog, gc, verify
from simstore.errors import (
    AlreadyExistsError,
    ConflictError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    ReadOnlyError,
)
from simstore.hashing import object_key
from simstore.storage import CountingStore, LocalStore


def test_uninitialised_store_is_a_clear_error(tmp_path):
    with pytest.raises(NotFoundError, match="simstore init"):
        Catalog.open(str(tmp_path / "nothing"))


def test_commit_log_show_and_resolve(cat):
    stage_samples(cat, "ds", {"a": b"1", "b": b"2"})
    r1 = cat.commit("ds", message="first", author="me")
    stage_samples(cat, "ds", {"c": b"3"})
    r2 = cat.commit("ds", message="second", author="me")
    assert r2.parent == r1.snapshot_id
    log = list(cat.log("ds"))
    assert [s.message for _, s in log] == ["second", "first"]
    assert cat.resolve("ds") == r2.snapshot_id == cat.resolve("ds@main")
    assert cat.resolve(f"ds@{r1.snapshot_id[:8]}") == r1.snapshot_id
    assert content(cat, "ds") == {
        k: expected_hash(v) for k, v in {"a": b"1", "b": b"2", "c": b"3"}.items()
    }
    assert cat.snapshot(r2.snapshot_id).samples == 3
    assert not cat.staged("ds")


def test_unknown_refs_are_named(cat):
    with pytest.raises(NotFoundError, match="unknown dataset 'nope'"):
        cat.resolve("nope")
    stage_samples(cat, "ds", {"a": b"1"})
    cat.commit("ds", message="m")
    with pytest.raises(NotFoundError, match="no branch, tag or snapshot 'v9'"):
        cat.resolve("ds@v9")


def test_a_full_snapshot_id_names_that_snapshot_first(cat):
    """A full id is looked up as an object (no refs, no listing); no ref takes such a name."""
    stage_samples(cat, "ds", {"a": b"1"})
    sid = cat.commit("ds", message="one").snapshot_id
    stage_samples(cat, "other", {"b": b"2"})
    other = cat.commit("other", message="two").snapshot_id
    store = CountingStore(cat.store)
    assert Catalog(store).resolve(f"ds@{sid}") == sid == cat.resolve(f"ds@{sid.upper()}")
    # the snapshot's first bytes, then the snapshot: no ref read, no listing
    assert {op: u["requests"] for op, u in store.traffic.to_json()["local"].items()} == {
        "range_get": 1, "get": 1}
    with pytest.raises(NotFoundError, match=f"dataset 'ds' has no snapshot '{other}'"):
        cat.resolve(f"ds@{other}")  # a snapshot, but of another dataset
    with pytest.raises(NotFoundError, match="has no snapshot"):
        cat.resolve(f"ds@{'0' * 32}")
    with pytest.raises(NotFoundError, match="unknown dataset 'nope'"):
        cat.resolve(f"nope@{sid}")
    for refs in (cat.branches("ds"), cat.tags("ds")):
        with pytest.raises(InvalidInputError, match="read as a snapshot id"):
            refs.create(other.upper(), sid)
    with pytest.raises(InvalidInputError, match="read as a snapshot id"):
        cat.branches("ds").move(other, None, sid)
    stage_samples(cat, "ds", {"c": b"3"})
    with pytest.raises(InvalidInputError, match="read as a snapshot id"):
        cat.commit("ds", message="m", branch=other)  # refused before anything is written
    assert cat.staged("ds")


def test_ambiguous_prefix(cat):
    ids = []
    for i in range(40):
        stage_samples(cat, "ds", {f"k{i}": str(i).encode()})
        ids.append(cat.commit("ds", message=str(i)).snapshot_id)
    by_prefix = {}
    for sid in ids:
        by_prefix.setdefault(sid[:1], []).append(sid)
    # choose a 4-hex prefix shared by two snapshots if one exists; else fake one
    shared = [v for v in by_prefix.values() if len(v) > 1]
    assert shared  # 40 ids over 16 first digits always collide
    common = os.path.commonprefix(shared[0][:2])
    if len(common) >= 4:
        with pytest.raises(InvalidInputError, match="ambiguous"):
            cat.resolve(f"ds@{common}")
    assert cat.resolve(f"ds@{ids[5][:12]}") == ids[5]


def test_tags_are_write_once_and_branches_independent(cat):
    stage_samples(cat, "ds", {"a": b"1"})
    r1 = cat.commit("ds", message="one")
    cat.tags("ds").create("v1", r1.snapshot_id)
    cat.tags("ds").create("v1", r1.snapshot_id)  # where it already points: done (idempotent)
    cat.branches("ds").create("dev", r1.snapshot_id)
    stage_samples(cat, "ds", {"b": b"2"})
    r2 = cat.commit("ds", message="dev work", branch="dev")
    with pytest.raises(AlreadyExistsError, match="tag 'v1' already exists"):
        cat.tags("ds").create("v1", r2.snapshot_id)
    with pytest.raises(AlreadyExistsError, match="branch 'main' already exists"):
        cat.branches("ds").create("main", r2.snapshot_id)
    assert set(content(cat, "ds@dev")) == {"a", "b"}
    assert set(content(cat, "ds@v1")) == {"a"}
    assert set(content(cat, "ds")) == {"a"}
    with pytest.raises(InvalidInputError):
        cat.tags("ds").create("../x", r1.snapshot_id)


def test_a_name_is_a_branch_or_a_tag_never_both(cat):
    """A branch is looked up before a tag: a branch named like a tag took ds@v1 over (it
    then moved with every commit), and a tag named like a branch could never be read."""
    stage_samples(cat, "ds", {"a": b"1"})
    r1 = cat.commit("ds", message="one")
    cat.tags("ds").create("v1", r1.snapshot_id)
    stage_samples(cat, "ds", {"b": b"2"})
    r2 = cat.commit("ds", message="two")
    with pytest.raises(AlreadyExistsError, match="a tag of that name exists"):
        cat.branches("ds").create("v1", r2.snapshot_id)
    assert not cat.branches("ds").exists("v1")
    assert cat.resolve("ds@v1") == r1.snapshot_id
    with pytest.raises(AlreadyExistsError, match="a branch of that name exists"):
        cat.tags("ds").create("main", r1.snapshot_id)
    assert not cat.tags("ds").exists("main")
    assert cat.resolve("ds@main") == r2.snapshot_id


def test_refs_that_exist_are_answered_before_any_write(cat, tmp_path):
    stage_samples(cat, "ds", {"a": b"1"})
    r1 = cat.commit("ds", message="one")
    stage_samples(cat, "ds", {"b": b"2"})
    r2 = cat.commit("ds", message="two")
    cat.tags("ds").create("v1", r1.snapshot_id)
    cat.branches("ds").create("dev", r1.snapshot_id)
    ro = Catalog.open(str(tmp_path / "store"), read_only=True)  # a reader of a shared store
    # as on a writable store: the same snapshot is done, another is refused; the refresh
    # of the snapshot (a write) used to come first and fail with ReadOnlyError
    ro.tags("ds").create("v1", r1.snapshot_id)
    ro.branches("ds").create("dev", r1.snapshot_id)
    with pytest.raises(AlreadyExistsError, match="tag 'v1' already exists"):
        ro.tags("ds").create("v1", r2.snapshot_id)
    with pytest.raises(AlreadyExistsError, match="branch 'dev' already exists"):
        ro.branches("ds").create("dev", r2.snapshot_id)
    with pytest.raises(ReadOnlyError):  # a new name is a write
        ro.tags("ds").create("v2", r2.snapshot_id)
    assert dict(cat.tags("ds").list()) == {"v1": r1.snapshot_id}


def test_replace_mode_and_deletions(cat):
    stage_samples(cat, "ds", {"a": b"1", "b": b"2"})
    cat.commit("ds", message="m")
    stage_samples(cat, "ds", {"c": b"3"}, mode="replace")
    cat.commit("ds", message="replace")
    assert set(content(cat, "ds")) == {"c"}
    stage_samples(cat, "ds", {"d": b"4"}, deleted=["c"])
    cat.commit("ds", message="swap")
    assert set(content(cat, "ds")) == {"d"}


def test_reingesting_identical_data_stores_nothing_new(cat):
    items = {f"k{i:04d}": os.urandom(64) for i in range(500)}
    stage_samples(cat, "ds", items)
    cat.commit("ds", message="one")
    before = {i.key for i in cat.store.list_info("objects/")}
    stage_samples(cat, "ds", items)
    r = cat.commit("ds", message="again")
    after = {i.key for i in cat.store.list_info("objects/")}
    new = after - before
    # only the new snapshot and the staged change set (which gc may collect) are new
    assert r.new_part_bytes == 0
    assert len(new) <= 2
    assert object_key(r.snapshot_id) in new


def test_diff_reads_only_changed_parts(tmp_path):
    cat = Catalog(LocalStore(str(tmp_path / "store")), target_rows=64)
    Catalog.init(cat.store)
    items = {f"k{i:05d}": str(i).encode() for i in range(5000)}
    stage_samples(cat, "ds", items)
    a = cat.commit("ds", message="a").snapshot_id
    stage_samples(cat, "ds", {"k02500": b"changed", "zzz": b"new"}, deleted=["k00007"])
    b = cat.commit("ds", message="b").snapshot_id
    res = cat.diff(f"ds@{a}", f"ds@{b}")
    assert [r.key for r in res.diff.added] == ["zzz"]
    assert [r.key for r in res.diff.removed] == ["k00007"]
    assert [new.key for _, new in res.diff.modified] == ["k02500"]
    assert res.parts_read <= 8 < res.parts_total
    assert res.bytes_read < 0.1 * res.manifest_bytes
    assert cat.diff(f"ds@{a}", f"ds@{a}").diff.is_empty


def test_verify_detects_corruption_and_missing(cat):
    stage_samples(cat, "ds", {"a": b"payload-a" * 100, "b": b"payload-b" * 100})
    r = cat.commit("ds", message="m")
    assert verify(cat, "ds", deep=True).ok
    shard = sorted(content_shards(cat, r.snapshot_id))[0]
    path = cat.store.local_path(object_key(shard))
    with open(path, "r+b") as f:
        f.seek(3)
        byte = f.read(1)
        f.seek(3)
        f.write(bytes([byte[0] ^ 0x01]))
    assert verify(cat, "ds").ok  # shallow: present
    deep = verify(cat, "ds", deep=True)
    assert not deep.ok
    assert shard in deep.problems[0] and r.snapshot_id in deep.problems[0]
    os.unlink(path)
    assert any("missing" in p for p in verify(cat, "ds").problems)


def test_corrupt_manifest_part_is_named(cat):
    stage_samples(cat, "ds", {"a": b"1"})
    r = cat.commit("ds", message="m")
    part = cat.snapshot(r.snapshot_id).parts[0]
    path = cat.store.local_path(object_key(part.id))
    with open(path, "r+b") as f:
        f.truncate(20)
    report = verify(cat, "ds")
    assert not report.ok and part.id in report.problems[0]
    with pytest.raises(IntegrityError, match=part.id):
        cat.read_part(part)


def content_shards(cat, sid):
    snap = cat.snapshot(sid)
    out = set()
    for t in cat.iter_parts(snap):
        out.update(t.column("shard").to_pylist())
    return out


def test_gc_keeps_reachable_and_deletes_unreachable(cat):
    e1 = stage_samples(cat, "ds", {"a": b"keep-a", "b": b"drop-b"})
    r1 = cat.commit("ds", message="one")
    e2 = stage_samples(cat, "ds", {"c": b"keep-c"}, deleted=["b"])
    r2 = cat.commit("ds", message="two")
    # all data is reachable through history; only the consumed change sets go
    report = gc(cat, grace_s=0)
    assert sorted(report.deleted) == sorted([e1.changes, e2.changes])
    # move main back past nothing: make a branch-less orphan by replacing history
    e3 = stage_samples(cat, "ds", {"z": b"only-z"}, mode="replace")
    r3 = cat.commit("ds", message="three")
    dry = gc(cat, grace_s=0, dry_run=True)
    assert dry.deleted == [e3.changes]  # r1, r2 are ancestors of r3: their data stays
    # an orphan object older than the grace period goes; a recent one stays
    orphan, _ = cat.put_object(b"orphan bytes")
    assert gc(cat, grace_s=3600).deleted == []
    report = gc(cat, grace_s=0)
    assert orphan in report.deleted
    assert not cat.store.exists(object_key(orphan))
    for sid in (r1.snapshot_id, r2.snapshot_id, r3.snapshot_id):
        assert verify(cat, f"ds@{sid}", deep=True).ok


def test_gc_keeps_staged_objects(cat):
    entry = stage_samples(cat, "ds", {"a": b"staged only"})
    report = gc(cat, grace_s=0)
    for oid in entry.referenced_objects():
        assert cat.store.exists(object_key(oid))
    assert not set(entry.referenced_objects()) & set(report.deleted)
    r = cat.commit("ds", message="m")
    assert verify(cat, f"ds@{r.snapshot_id}", deep=True).ok


class LostResponseStore:
    """Wraps a store: the first successful CAS on a ref lands but reports a conflict."""

    def __init__(self, inner):
        self._inner = inner
        self.lost = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def compare_and_swap(self, key, expected, data):
        version = self._inner.compare_and_swap(key, expected, data)
        if "/refs/heads/" in key and self.lost == 0:
            self.lost += 1
            raise ConflictError(f"{key}: precondition failed (response lost, retried)")
        return version


def test_commit_recognises_its_own_lost_response(tmp_path):
    inner = LocalStore(str(tmp_path / "s"))
    Catalog.init(inner)
    store = LostResponseStore(inner)
    cat = Catalog(store)
    stage_samples(cat, "ds", {"a": b"1"})
    r = cat.commit("ds", message="m")
    assert store.lost == 1
    assert r.attempts == 1
    assert cat.resolve("ds") == r.snapshot_id
    assert len(list(cat.log("ds"))) == 1


def test_racing_writers_lose_nothing_and_later_wins(cat):
    # writer A and B both stage; B commits first; A then commits on top and reports overlap
    stage_samples(cat, "ds", {"base": b"0"})
    cat.commit("ds", message="base")
    ea = stage_samples(cat, "ds", {"shared": b"from-a", "only-a": b"a"})
    eb = stage_samples(cat, "ds", {"shared": b"from-b", "only-b": b"b"})
    head, version = cat.branches("ds").get_versioned("main")

    class Interleave:
        """Let B commit right after A read the head, forcing A to retry."""

        def __init__(self, inner):
            self._inner = inner
            self.fired = False

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def compare_and_swap(self, key, expected, data):
            if not self.fired and "/refs/heads/" in key:
                self.fired = True
                Catalog(self._inner).commit("ds", message="b", staging_ids=[eb.id])
            return self._inner.compare_and_swap(key, expected, data)

    cat_a = Catalog(Interleave(cat.store))
    ra = cat_a.commit("ds", message="a", staging_ids=[ea.id], rng=random.Random(0))
    assert ra.attempts == 2
    assert ra.overwritten_concurrent == ("shared",)
    final = content(cat, "ds")
    assert final["shared"] == expected_hash(b"from-a")
    assert {"base", "only-a", "only-b", "shared"} == set(final)
    assert [s.message for _, s in cat.log("ds")] == ["a", "b", "base"]
