"""A failed `ingest --snapshot` leaves no staging entry of its own behind.

Without ``on_error="skip"`` a failed ingest leaves no snapshot or staging entry referencing
what it wrote: a schema the commit would refuse is refused before staging (naming the
file or the staged entry and the field), and a commit that fails all the same removes the
entry this ingest wrote, never another writer's, and never one whose commit landed.
"""

import numpy as np
import pytest

from simstore.catalog import Catalog
from simstore.errors import ConflictError, InvalidInputError, SourceError, StorageError
from simstore.ingest import ingest


def _npz(folder, name, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / f"{name}.npz", **fields)
    return folder


def _f32(value=0.0):
    return np.full(4, value, np.float32)


def _f64(value=0.0):
    return np.full(4, value, np.float64)


@pytest.fixture
def head_and_staged_change(catalog, tmp_path):
    """Head: run000, run001 with `u` float32; staged: run000 with `u` float64 (allowed)."""
    a = tmp_path / "a"
    _npz(a, "run000", u=_f32())
    _npz(a, "run001", u=_f32())
    head = ingest([a], dataset="d", store=catalog, snapshot=True).snapshot_id
    b = _npz(tmp_path / "b", "run000", u=_f64(1))
    staged = ingest([b], dataset="d", store=catalog, allow_schema_change=True).staging_id
    return head, staged


def _head(catalog):
    return catalog.branches("d").get_versioned("main")[0]


def test_a_file_the_commit_would_refuse_is_refused_before_staging(
    catalog, tmp_path, head_and_staged_change
):
    """The file agrees with a staged entry's float64 but the commit, which does not take
    that entry (other keys), merges it into the head's float32: it staged, then failed
    naming its own entry, which stayed staged."""
    head, other = head_and_staged_change
    c = _npz(tmp_path / "c", "run001", u=_f64(2))
    with pytest.raises(SourceError) as info:
        ingest([c], dataset="d", store=catalog, snapshot=True)
    msg = str(info.value)
    assert msg.startswith(f"{c / 'run001.npz'}: field 'u' changes type from tensor float32")
    assert "tensor float64 rank 1" in msg and "\n" not in msg
    assert [e.id for e in catalog.staged("d")] == [other]
    assert _head(catalog) == head
    # allowed, it commits; the other writer's entry stays staged
    r = ingest([c], dataset="d", store=catalog, snapshot=True, allow_schema_change=True)
    assert [e.id for e in catalog.staged("d")] == [other] and _head(catalog) == r.snapshot_id


def test_a_skipped_file_under_on_error_skip_is_the_one_the_commit_would_refuse(
    catalog, tmp_path, head_and_staged_change
):
    """Both files agree with the staged entry, neither with the head the commit starts
    from: both are skipped, and nothing is staged or committed."""
    head, other = head_and_staged_change
    c = _npz(tmp_path / "c", "run001", u=_f64(2))
    _npz(c, "run002", u=_f64(3))
    r = ingest([c], dataset="d", store=catalog, snapshot=True, on_error="skip")
    assert [s.path for s in r.files_skipped] == [str(c / "run001.npz"), str(c / "run002.npz")]
    assert all("changes type from tensor float32" in s.reason for s in r.files_skipped)
    assert r.snapshot_id == head and r.staging_id is None
    assert [e.id for e in catalog.staged("d")] == [other]


class _RacingCatalog(Catalog):
    """Runs ``before_commit`` (another writer) between the ingest's head read and commit."""

    before_commit = None

    def commit(self, dataset, **kwargs):
        hook, self.before_commit = self.before_commit, None
        if hook is not None:
            hook()
        return super().commit(dataset, **kwargs)


def test_a_concurrent_type_change_fails_the_commit_and_removes_only_this_entry(
    catalog, tmp_path
):
    a = _npz(tmp_path / "a", "run000", u=_f32())
    ingest([a], dataset="d", store=catalog, snapshot=True)
    other = ingest([_npz(tmp_path / "o", "run007", v=_f32())], dataset="d",
                   store=catalog).staging_id
    racing = _RacingCatalog(catalog.store)
    theirs = _npz(tmp_path / "t", "run001", u=_f64())

    def concurrent_commit():
        ingest([theirs], dataset="d", store=Catalog(catalog.store), snapshot=True,
               allow_schema_change=True)

    racing.before_commit = concurrent_commit
    mine = _npz(tmp_path / "m", "run002", u=_f32(5))
    with pytest.raises(InvalidInputError) as info:
        ingest([mine], dataset="d", store=racing, snapshot=True)
    msg = str(info.value)
    assert "field 'u' changes type from tensor float64 rank 1 to tensor float32" in msg
    assert "(this ingest's, removed)" in msg and "\n" not in msg
    assert [e.id for e in catalog.staged("d")] == [other]
    assert catalog.snapshot(_head(catalog)).samples == 2  # run000 and theirs


def test_a_commit_that_gives_up_removes_this_entry_and_keeps_its_error(catalog, tmp_path):
    ingest([_npz(tmp_path / "a", "run000", u=_f32())], dataset="d", store=catalog,
           snapshot=True)
    other = ingest([_npz(tmp_path / "o", "run007", u=_f32())], dataset="d",
                   store=catalog).staging_id
    gave_up = "dataset 'd' branch 'main': gave up after 50 attempts lost to concurrent commits"

    class Losing(Catalog):
        def commit(self, dataset, **kwargs):
            raise ConflictError(gave_up)

    with pytest.raises(ConflictError) as info:
        ingest([_npz(tmp_path / "m", "run001", u=_f32())], dataset="d",
               store=Losing(catalog.store), snapshot=True)
    assert str(info.value) == gave_up
    assert [e.id for e in catalog.staged("d")] == [other]


def test_a_reused_pending_entry_is_not_removed_when_the_commit_fails(catalog, tmp_path):
    """An identical entry already staged (by an earlier run) is not this run's to remove."""
    ingest([_npz(tmp_path / "a", "run000", u=_f32())], dataset="d", store=catalog,
           snapshot=True)
    m = _npz(tmp_path / "m", "run001", u=_f32())
    earlier = ingest([m], dataset="d", store=catalog).staging_id

    class Failing(Catalog):
        def commit(self, dataset, **kwargs):
            raise StorageError("s3://b/p: branch d/main: connection reset")

    with pytest.raises(StorageError, match="connection reset"):
        ingest([m], dataset="d", store=Failing(catalog.store), snapshot=True)
    assert [e.id for e in catalog.staged("d")] == [earlier]


def test_an_entry_whose_commit_landed_is_not_removed_though_the_commit_raised(
    catalog, tmp_path
):
    """The swap landed, then the commit failed removing its staging entries: the entry
    is left to the next commit, which recognises it as consumed."""
    head = ingest([_npz(tmp_path / "a", "run000", u=_f32())], dataset="d", store=catalog,
                  snapshot=True).snapshot_id
    discards = []

    class CleanUpFails(Catalog):
        def discard_staged(self, dataset, ids):
            discards.append(list(ids))
            raise StorageError("s3://b/p: staging entry: connection reset")

    with pytest.raises(StorageError, match="connection reset"):
        ingest([_npz(tmp_path / "m", "run001", u=_f32())], dataset="d",
               store=CleanUpFails(catalog.store), snapshot=True)
    landed = _head(catalog)
    assert landed != head and catalog.snapshot(landed).samples == 2
    assert len(discards) == 1  # the commit's own: the ingest's clean-up saw it landed
    (entry,) = catalog.staged("d")
    assert catalog.snapshot(landed).lineage["staging"] == [entry.id]
    assert catalog.commit("d", message="again").snapshot_id == landed
    assert catalog.staged("d") == []
