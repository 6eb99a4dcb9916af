"""verify with ``history`` (REF's ancestors too) and ``all_refs`` (every branch and tag).

verify checked only the named snapshot: damage to what only an ancestor reaches (a tag
or a branch reset to it would read it) went unseen until a reader failed.
"""

import pytest
from catalog_helpers import stage_samples

from simstore.catalog import Catalog, verify
from simstore.errors import InvalidInputError
from simstore.hashing import hash_bytes, object_key


def _flip(cat, oid):
    path = cat.store.local_path(object_key(oid))
    with open(path, "r+b") as f:
        byte = f.read(1)[0]
        f.seek(0)
        f.write(bytes([byte ^ 0x01]))


@pytest.fixture
def two(cat):
    """Dataset ``ds``: snapshot s1 {a, b}, then s2 with ``a`` replaced; ``b`` is shared."""
    stage_samples(cat, "ds", {"a": b"old a" * 50, "b": b"shared b" * 50})
    s1 = cat.commit("ds", message="first").snapshot_id
    stage_samples(cat, "ds", {"a": b"new a" * 50})
    s2 = cat.commit("ds", message="second").snapshot_id
    return s1, s2, hash_bytes(b"old a" * 50), hash_bytes(b"shared b" * 50)


def test_ancestor_shard_deleted_fails_only_with_history(cat, two):
    s1, s2, only_s1, _ = two
    cat.store.delete(object_key(only_s1))

    head = verify(cat, "ds")
    assert head.ok and head.snapshots == [s2] and not head.history

    report = verify(cat, "ds", history=True)
    assert not report.ok
    assert report.snapshots == [s2, s1]
    assert len(report.problems) == 1
    (p,) = report.problem_objects
    assert (p.object, p.kind, p.problem, p.snapshots) == (only_s1, "shard", "missing", (s1,))
    assert object_key(only_s1) in p.message and s1 in p.message and s2 not in p.message
    assert report.problems == [p.message]
    assert report.to_json()["problem_objects"][0]["snapshots"] == [s1]


def test_damaged_shared_object_is_reported_once_naming_every_snapshot(cat, two):
    s1, s2, _, shared = two
    _flip(cat, shared)

    report = verify(cat, "ds", deep=True, history=True)
    assert len(report.problems) == 1
    (p,) = report.problem_objects
    assert (p.object, p.problem, p.snapshots) == (shared, "damaged", (s2, s1))
    assert f"expected {shared}" in p.message and s1 in p.message and s2 in p.message
    # each object once: 2 snapshots, 2 manifest parts, 3 shards (a old, a new, b)
    assert report.objects_checked == 2 + 2 + 3
    assert verify(cat, "ds", deep=True).problem_objects[0].snapshots == (s2,)


def test_all_refs_covers_every_branch_and_tag_of_every_dataset(cat, two):
    s1, s2, _, _ = two
    stage_samples(cat, "other", {"x": b"x" * 40})
    o1 = cat.commit("other", message="o1").snapshot_id
    cat.tags("other").create("v1", o1)
    stage_samples(cat, "other", {"x": b"y" * 40})
    o2 = cat.commit("other", message="o2").snapshot_id
    cat.branches("ds").create("old", s1)

    clean = verify(cat, all_refs=True)
    assert clean.ok and clean.snapshot is None and clean.all_refs
    assert set(clean.snapshots) == {s1, s2, o1, o2} and len(clean.snapshots) == 4

    _flip(cat, hash_bytes(b"x" * 40))  # only o1 (tagged, and o2's parent) reaches it
    assert verify(cat, all_refs=True).ok  # shallow: the object is there
    report = verify(cat, all_refs=True, deep=True)
    (p,) = report.problem_objects
    assert p.object == hash_bytes(b"x" * 40) and p.snapshots == (o1,)
    assert report.to_json()["all"] is True and report.to_json()["snapshot"] is None


def test_missing_parent_snapshot_is_reported_naming_the_child(cat, two):
    s1, s2, _, _ = two
    cat.store.delete(object_key(s1))

    assert verify(cat, "ds").ok  # the head itself reaches all it needs
    for report in (verify(cat, "ds", history=True), verify(cat, all_refs=True)):
        assert report.snapshots == [s2]
        (p,) = report.problem_objects
        assert (p.object, p.kind, p.problem, p.snapshots) == (s1, "snapshot", "missing", (s2,))
        assert f"no snapshot {s1}" in p.message and f"parent of snapshot {s2}" in p.message


def test_missing_head_snapshot_names_the_ref(cat, two):
    _, s2, _, _ = two
    cat.store.delete(object_key(s2))
    report = verify(cat, all_refs=True)
    (p,) = report.problem_objects
    assert (p.object, p.problem, p.refs) == (s2, "missing", ("ds@main",))
    assert "named by ds@main" in p.message


def test_ref_and_all_refs_together_or_neither_are_refused(cat, two):
    with pytest.raises(InvalidInputError, match="not both"):
        verify(cat, "ds", all_refs=True)
    with pytest.raises(InvalidInputError, match="needs a REF"):
        verify(cat)


def test_empty_store_verifies_with_all_refs(tmp_path):
    report = verify(Catalog.init(str(tmp_path / "empty")), all_refs=True)
    assert report.ok and report.snapshots == [] and report.objects_checked == 0


def test_a_ref_naming_another_datasets_snapshot_is_damage_everywhere(cat, two):
    """A branch file overwritten with another dataset's (valid bytes: nothing in simstore
    writes one) served that dataset's samples under this name, and verify passed it."""
    import os

    from click.testing import CliRunner
    from simstore.cli import main

    from simstore.errors import IntegrityError

    stage_samples(cat, "other", {"x": b"other x" * 50})
    theirs = cat.commit("other", message="other's").snapshot_id
    ours = cat.store.local_path("datasets/ds/refs/heads/main")
    with open(cat.store.local_path("datasets/other/refs/heads/main"), "rb") as f:
        data = f.read()
    os.chmod(ours, 0o644)
    with open(ours, "wb") as f:
        f.write(data)
    fresh = Catalog.open(cat.store.root)
    with pytest.raises(IntegrityError, match=rf"branch ds@main names snapshot {theirs} of "
                                             r"dataset 'other', not of 'ds'"):
        fresh.snapshot(fresh.resolve("ds@main"))
    with pytest.raises(IntegrityError, match="branch ds@main names snapshot"):
        verify(Catalog.open(cat.store.root), "ds")
    report = verify(Catalog.open(cat.store.root), all_refs=True)
    (p,) = report.problem_objects
    assert (p.object, p.kind, p.problem) == ("ds@main", "ref", "damaged")
    # a commit onto it is refused: it would build on the other dataset's samples
    stage_samples(fresh, "ds", {"c": b"new c" * 50})
    with pytest.raises(IntegrityError, match="branch ds@main"):
        fresh.commit("ds", message="third")
    assert fresh.branches("ds").get("main") == theirs  # nothing moved
    shown = CliRunner().invoke(main, ["--store", cat.store.root, "show", "ds@main"])
    assert shown.exit_code == 6 and "of dataset 'other'" in shown.output
    assert fresh.resolve("other@main") == theirs  # the other dataset reads as before
    assert fresh.snapshot(theirs).dataset == "other"  # in this catalog too
    # an ingest into the damaged branch is refused before it compares anything
    src = os.path.join(cat.store.root, "..", "src")
    os.makedirs(src)
    import numpy as np

    np.savez(os.path.join(src, "a.npz"), u=np.zeros(3, np.float32))
    staged = CliRunner().invoke(main, ["--store", cat.store.root, "ingest", src,
                                       "--dataset", "ds", "--no-progress"])
    assert staged.exit_code == 6 and "branch ds@main names snapshot" in staged.output


def test_a_missing_snapshot_a_tag_names_is_damage_for_cost_and_gc(cat, two):
    """`cost NAME` and `gc` walked the refs' targets without recording which ref names
    each: a missing one was exit 3 ("no snapshot"), where cost REF said exit 6 naming it."""
    from click.testing import CliRunner
    from simstore.cli import main

    s1, _, _, _ = two
    cat.tags("ds").create("v1", s1)
    cat.branches("ds").delete("main")  # the tag alone reaches s1
    cat.store.delete(object_key(s1))
    for args in (["cost", "ds"], ["cost", "ds@v1"], ["gc", "--dry-run"]):
        result = CliRunner().invoke(main, ["--store", cat.store.root, *args])
        assert result.exit_code == 6, (args, result.output)
        assert f"{object_key(s1)} is missing; referenced by tag ds@v1" in result.output


@pytest.mark.parametrize("field, value", [
    ("content", "0" * 32), ("first_key", "zzz"), ("last_key", "a"), ("sample_bytes", 1),
])
def test_a_part_entry_that_misstates_its_part_is_damage(cat, two, field, value):
    """verify compared a part's rows with its snapshot's entry, and nothing else: a
    snapshot whose entry misstated the part's content digest (diff then saw no change
    where show's content_hash differed) or its first key (keys --prefix skipped rows)
    passed, --deep or not."""
    import json

    from simstore.catalog._refs import encode_ref
    from simstore.manifest import PartRef
    from simstore.sample import canonical_json
    from simstore.snapshot import content_hash_of

    obj = json.loads(cat.get_object(cat.resolve("ds")))
    obj["parts"][0][field] = value
    obj["content_hash"] = content_hash_of([PartRef(**p) for p in obj["parts"]])
    forged, _ = cat.put_object(canonical_json(obj))
    cat.store.put("datasets/ds/refs/heads/forged", encode_ref(forged))
    assert verify(cat, "ds@main", deep=True).ok
    report = verify(cat, "ds@forged", deep=True)
    assert not report.ok
    part = obj["parts"][0]["id"]
    if field == "content":  # only reading the part shows it
        (problem,) = [p for p in report.problems if part in p]
        assert f"has {field} " in problem and forged in problem
    else:  # the snapshot contradicts itself: its parts' keys, or its totals and theirs
        (problem,) = [p for p in report.problems if forged in p]
        assert (part in problem) if "key" in field else ("its parts" in problem)


@pytest.mark.parametrize("forge", ["swap", "repeat", "count", "bytes"])
def test_a_snapshot_whose_parts_disagree_with_its_order_or_totals_is_damage(tmp_path, forge):
    """Found by an audit: a snapshot listing its parts out of key order or one twice, or
    counting samples its parts do not hold, passed verify --deep --samples when its
    content hash was recomputed to match: the loader then served samples twice and a
    lookup by key missed keys that were there."""
    import json

    from simstore.catalog._refs import encode_ref
    from simstore.errors import FormatError
    from simstore.manifest import PartRef
    from simstore.sample import canonical_json
    from simstore.snapshot import Snapshot, content_hash_of
    from simstore.storage import open_store

    Catalog.init(str(tmp_path / "store"))
    cat = Catalog(open_store(str(tmp_path / "store")), target_rows=8)
    stage_samples(cat, "ds", {f"k{i:03d}": f"sample {i}".encode() * 20 for i in range(64)})
    cat.commit("ds", message="m")
    obj = json.loads(cat.get_object(cat.resolve("ds")))
    assert len(obj["parts"]) >= 3
    if forge == "swap":
        obj["parts"][0], obj["parts"][1] = obj["parts"][1], obj["parts"][0]
    elif forge == "repeat":
        obj["parts"].insert(1, obj["parts"][1])
        obj["samples"] += obj["parts"][1]["rows"]
        obj["sample_bytes"] += obj["parts"][1]["sample_bytes"]
    elif forge == "count":
        obj["samples"] = 999_999
    else:
        obj["sample_bytes"] = 5
    obj["content_hash"] = content_hash_of([PartRef(**p) for p in obj["parts"]])
    data = canonical_json(obj)
    forged, _ = cat.put_object(data)
    cat.store.put("datasets/ds/refs/heads/forged", encode_ref(forged))

    with pytest.raises(FormatError, match=f"snapshot {forged}: "):
        Snapshot.from_bytes(data, object_id=forged)
    report = verify(cat, "ds@forged", deep=True)  # (these shards are no real shards:
    assert not report.ok                           # the samples are not read)
    assert any(forged in p for p in report.problems)
    assert verify(cat, "ds@main", deep=True).ok
    from simstore.loaders import SimDataset

    with pytest.raises(FormatError, match=forged):
        SimDataset(cat.store.root, "ds@forged")
    with pytest.raises(FormatError, match=f"snapshot {forged}: "):
        cat.resolve(f"ds@{forged}")  # by its full id: refused, not "no snapshot"
