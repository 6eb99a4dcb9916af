"""A snapshot's schema describes the samples it holds, whatever else is staged.

An ingest stages its own files' field types, not those of the branch head or of earlier
staged entries: a ``--mode replace`` snapshot lists exactly its samples' fields, in the
types they were stored in, and an entry committed alone never brings another entry's
type change into the snapshot.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.ingest import ingest


def _npz(folder, name, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / f"{name}.npz", **fields)
    return folder


def _schema(snap):
    return {s.name: s.dtype for s in snap.schema}


def _stored_types(samples):
    """{field: {dtypes}} over the samples as they read back from their shards."""
    out = {}
    for fields in samples.values():
        for name, value in fields.items():
            out.setdefault(name, set()).add(str(value.dtype))
    return out


def _assert_schema_is_the_samples(snap, samples):
    """Every listed field is held by some sample, and in that type only (and vice versa)."""
    stored = _stored_types(samples)
    assert {n: {t} for n, t in _schema(snap).items()} == stored, (_schema(snap), stored)


@pytest.mark.parametrize("committed_first", [False, True])
def test_a_replace_lists_only_its_own_fields_in_their_new_types(
    catalog, tmp_path, read, committed_first
):
    """x float32 and y, staged (or committed, then one key restaged); then the same keys
    with x float64 and no y, replaced: the snapshot listed y, which no sample had."""
    old = tmp_path / "old"
    for key in ("a", "b"):
        _npz(old, key, x=np.ones(3, np.float32), y=np.zeros(2, np.float32))
    if committed_first:
        ingest([old], dataset="d", store=catalog, snapshot=True)
        _npz(tmp_path / "again", "a", x=np.full(3, 2, np.float32), y=np.ones(2, np.float32))
        ingest([tmp_path / "again"], dataset="d", store=catalog)
    else:
        ingest([old], dataset="d", store=catalog)
    assert len(catalog.staged("d")) == 1
    new = tmp_path / "new"
    for key in ("a", "b"):
        _npz(new, key, x=np.full(3, 5.0))
    r = ingest([new], dataset="d", store=catalog, snapshot=True, mode="replace",
               allow_schema_change=True)
    snap, samples = read(catalog, f"d@{r.snapshot_id}")
    assert sorted(samples) == ["a", "b"]
    assert _schema(snap) == {"x": "float64"}
    _assert_schema_is_the_samples(snap, samples)
    assert {s.name: s.dtype for s in r.schema} == {"x": "float64"}  # the summary agrees
    assert catalog.staged("d") == []


def test_a_replace_does_not_list_a_field_of_an_entry_it_discards(catalog, tmp_path, read):
    """An entry staged before a replace (key z, field w) is taken with it and discarded
    by it: left staged, it would apply over the replace at the next commit. The replace
    once listed w as well."""
    ingest([_npz(tmp_path / "other", "z", x=np.ones(3, np.float32), w=np.ones(2, np.int32))],
           dataset="d", store=catalog)
    (other,) = catalog.staged("d")
    new = _npz(tmp_path / "new", "a", x=np.full(3, 5.0))
    r = ingest([new], dataset="d", store=catalog, snapshot=True, mode="replace",
               allow_schema_change=True)
    snap, samples = read(catalog, f"d@{r.snapshot_id}")
    assert sorted(samples) == ["a"] and _schema(snap) == {"x": "float64"}
    _assert_schema_is_the_samples(snap, samples)
    assert catalog.staged("d") == []
    assert other.id in catalog.snapshot(r.snapshot_id).lineage["staging"]


def test_an_upsert_does_not_commit_a_type_change_of_an_entry_it_leaves_staged(
    catalog, tmp_path, read
):
    """Head: a, b with x float32. Staged (allowed): c with x float64. An upsert of key e
    (field y only) with --allow-schema-change --snapshot committed its entry alone, yet
    the snapshot said x float64, the type of none of its samples."""
    head = tmp_path / "head"
    for key in ("a", "b"):
        _npz(head, key, x=np.ones(3, np.float32))
    ingest([head], dataset="d", store=catalog, snapshot=True)
    ingest([_npz(tmp_path / "c", "c", x=np.ones(3))], dataset="d", store=catalog,
           allow_schema_change=True)
    (changed,) = catalog.staged("d")
    e = _npz(tmp_path / "e", "e", y=np.zeros(2, np.float32))
    r = ingest([e], dataset="d", store=catalog, snapshot=True, allow_schema_change=True)
    snap, samples = read(catalog, f"d@{r.snapshot_id}")
    assert sorted(samples) == ["a", "b", "e"]
    assert _schema(snap) == {"x": "float32", "y": "float32"}
    _assert_schema_is_the_samples(snap, samples)
    assert {s.name: s.dtype for s in r.schema} == _schema(snap)
    # the staged change still commits, with its own type winning as documented
    assert [x.id for x in catalog.staged("d")] == [changed.id]
    sid = catalog.commit("d", message="c", allow_schema_change=True).snapshot_id
    assert _schema(catalog.snapshot(sid)) == {"x": "float64", "y": "float32"}


def test_an_entry_without_the_field_commits_beside_another_entrys_type_change(
    catalog, tmp_path, read
):
    """Without --allow-schema-change the ingest was refused, naming the other staged
    entry, though its own files agree with the head: it carried that entry's type."""
    head = tmp_path / "head"
    for key in ("run000", "run001"):
        _npz(head, key, u=np.zeros(4, np.float32))
    ingest([head], dataset="d", store=catalog, snapshot=True)
    ingest([_npz(tmp_path / "b", "run000", u=np.ones(4))], dataset="d", store=catalog,
           allow_schema_change=True)
    (other,) = catalog.staged("d")
    r = ingest([_npz(tmp_path / "c", "run009", w=np.zeros(4, np.float32))], dataset="d",
               store=catalog, snapshot=True)
    snap, samples = read(catalog, f"d@{r.snapshot_id}")
    assert sorted(samples) == ["run000", "run001", "run009"]
    assert _schema(snap) == {"u": "float32", "w": "float32"}
    _assert_schema_is_the_samples(snap, samples)
    assert [e.id for e in catalog.staged("d")] == [other.id]


def test_cli_show_lists_the_replaced_type_only(tmp_path):
    store = str(tmp_path / "store")
    runner = CliRunner()

    def run(*args):
        result = runner.invoke(main, ["--store", store, *args], catch_exceptions=False)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result.stdout

    run("init")
    old = tmp_path / "old"
    for key in ("a", "b"):
        _npz(old, key, x=np.ones(3, np.float32), y=np.zeros(2, np.float32))
    run("ingest", str(old), "--dataset", "d")
    new = tmp_path / "new"
    for key in ("a", "b"):
        _npz(new, key, x=np.ones(3))
    summary = json.loads(run("ingest", str(new), "--dataset", "d", "--snapshot", "--mode",
                             "replace", "--allow-schema-change", "--json"))
    shown = json.loads(run("show", f"d@{summary['snapshot']}", "--json"))
    assert [(s["name"], s["dtype"]) for s in shown["schema"]] == [("x", "float64")]
    assert summary["schema"] == shown["schema"]


@pytest.mark.parametrize("before, after", [(np.array(3.0), np.array([3.0])),
                                           (np.array([3.0]), np.array(3.0))])
def test_a_field_whose_rank_changes_between_0_and_a_one_element_vector_is_staged(
    catalog, tmp_path, read, before, after
):
    """Both hash alike (the sample hash takes a 0-d tensor's shape as (1,)), so the file
    looked unchanged and the new shape never reached the snapshot."""
    _npz(tmp_path / "a", "s", x=before)
    ingest([tmp_path / "a"], dataset="d", store=catalog, snapshot=True)
    _npz(tmp_path / "b", "s", x=after)
    r = ingest([tmp_path / "b"], dataset="d", store=catalog, snapshot=True,
               allow_schema_change=True)
    assert r.files_unchanged == 0 and r.snapshot_id is not None
    snap, samples = read(catalog, f"d@{r.snapshot_id}")
    assert {s.name: s.ndim for s in snap.schema} == {"x": after.ndim}
    (fields,) = samples.values()
    assert fields["x"].shape == after.shape
    # the same file again is unchanged: only a rank change forces the stage
    r = ingest([tmp_path / "b"], dataset="d", store=catalog, snapshot=True)
    assert r.files_unchanged == 1


def test_a_folder_mixing_ranks_is_not_restaged_on_every_re_ingest(catalog, tmp_path):
    """The rank check first staged any file whose rank differed from the head's: a folder
    holding a 0-d and a one-element x (or ranks 1 and 2), re-ingested unchanged with
    allow_schema_change, staged one of them and flipped the schema on every run."""
    for name, fields in {"ranks01": (np.array(3.0), np.array([4.0])),
                         "ranks12": (np.ones(2), np.ones((1, 2)))}.items():
        src = tmp_path / name
        _npz(src, "a", x=fields[0])
        _npz(src, "b", x=fields[1])
        first = ingest([src], dataset=name, store=catalog, snapshot=True,
                       allow_schema_change=True)
        assert first.samples_staged == 2
        for _ in range(2):
            again = ingest([src], dataset=name, store=catalog, snapshot=True,
                           allow_schema_change=True)
            assert again.files_unchanged == 2 and again.samples_staged == 0
