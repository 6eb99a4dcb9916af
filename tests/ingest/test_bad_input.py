"""Every bad input gives one line naming the file (and field); a failed run references nothing."""

import numpy as np
import pytest
import source_files as sf

from simstore.errors import SourceError
from simstore.ingest import ingest


def bad_h5(root):
    good = root / "good.h5"
    sf.write_h5(good)
    (root / "truncated.h5").write_bytes(good.read_bytes()[:2000])
    good.unlink()
    return "truncated.h5", None


def bad_stl(root):
    (root / "broken.stl").write_text(
        "solid x\nfacet normal 0 0 1\n outer loop\n vertex 0 0\nendsolid\n"
    )
    return "broken.stl", None


def bad_step(root):
    (root / "empty.step").write_text(
        "ISO-10303-21;\nHEADER;\nFILE_DESCRIPTION((''),'2;1');\nFILE_NAME('x','',(''),(''),'','','');\n"
        "FILE_SCHEMA(('AUTOMOTIVE_DESIGN'));\nENDSEC;\nDATA;\nENDSEC;\nEND-ISO-10303-21;\n"
    )
    return "empty.step", None


def bad_nan(root):
    u = np.ones((4, 4), np.float32)
    u[1, 2] = np.nan
    np.savez(root / "nan.npz", u=u)
    return "nan.npz", "u"


def bad_inf(root):
    np.savez(root / "inf.npz", u=np.array([[1.0, np.inf]], np.float32))
    return "inf.npz", "u"


def bad_shape(root):
    np.savez(root / "rank.npz", u=np.ones((2, 2, 2), np.float32))  # others are rank 2
    return "rank.npz", "u"


def bad_dtype(root):
    np.savez(root / "dtype.npz", u=np.ones((4, 4), np.float64))  # others are float32
    return "dtype.npz", "u"


def bad_object(root):
    np.savez(root / "obj.npz", u=np.array([None, 1], dtype=object))
    return "obj.npz", "u"


CASES = [bad_h5, bad_stl, bad_step, bad_nan, bad_inf, bad_shape, bad_dtype, bad_object]


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(3):
        np.savez(root / f"a{i}.npz", u=np.full((4, 4), float(i), np.float32))
    return root


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_bad_file_fails_the_ingest_with_one_line_naming_it(catalog, folder, make):
    name, field = make(folder)
    with pytest.raises(SourceError) as info:
        ingest([folder], dataset="d", store=catalog, snapshot=True, nan="error")
    message = str(info.value)
    assert "\n" not in message
    assert name in message
    if field is not None:
        assert f"field {field!r}" in message
    assert catalog.staged("d") == []
    assert catalog.branches("d").get_versioned("main")[0] is None


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_on_error_skip_ingests_the_rest_and_lists_the_file(catalog, folder, make):
    name, _ = make(folder)
    r = ingest([folder], dataset="d", store=catalog, snapshot=True, nan="error", on_error="skip")
    assert [s.path.endswith(name) for s in r.files_skipped] == [True]
    assert name in r.files_skipped[0].reason
    snap = catalog.snapshot(r.snapshot_id)
    assert sorted(catalog.manifest(snap).column("key").to_pylist()) == ["a0", "a1", "a2"]
    assert r.to_json()["skipped"][0]["path"].endswith(name)


def test_schema_break_against_the_previous_snapshot_names_old_and_new_type(
    catalog, folder, tmp_path
):
    ingest([folder], dataset="d", store=catalog, snapshot=True)
    later = tmp_path / "later"
    later.mkdir()
    np.savez(later / "b.npz", u=np.ones((4, 4), np.float64))
    with pytest.raises(SourceError) as info:
        ingest([later], dataset="d", store=catalog, snapshot=True)
    msg = str(info.value)
    assert "b.npz" in msg and "field 'u'" in msg
    assert "tensor float32 rank 2" in msg and "tensor float64 rank 2" in msg
    assert "--allow-schema-change" in msg
    r = ingest([later], dataset="d", store=catalog, snapshot=True, allow_schema_change=True)
    snap = catalog.snapshot(r.snapshot_id)
    assert {s.name: s.dtype for s in snap.schema}["u"] == "float64"


def test_nan_allowed_by_default_and_counted(catalog, folder):
    bad_nan(folder)
    r = ingest([folder], dataset="d", store=catalog, snapshot=True)
    stats = catalog.snapshot(r.snapshot_id).stats["fields"]["u"]
    assert sum(stats["nan_count"]) == 1
    assert sum(stats["count"]) == 4 * 16 - 1


def test_rerun_after_a_failure_redoes_no_finished_file(catalog, folder):
    bad_h5(folder)
    with pytest.raises(SourceError):
        ingest([folder], dataset="d", store=catalog, snapshot=True)
    (folder / "truncated.h5").unlink()
    r = ingest([folder], dataset="d", store=catalog, snapshot=True)
    assert r.files_reused == 3 and r.files_ingested == 0
    assert r.samples_staged == 3 and r.snapshot_id


def test_explicit_file_no_adapter_reads_is_a_source_error(catalog, tmp_path):
    odd = tmp_path / "notes.xyz"
    odd.write_text("hello")
    with pytest.raises(SourceError, match=r"notes\.xyz: no installed adapter reads this file"):
        ingest([odd], dataset="d", store=catalog)


def _field_file(path):
    np.savez(path, fields=np.ones((2, 3), np.float32))


def _group_file(path):
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("fields/density", data=np.zeros((2, 3), np.float32))


def _assert_group_clash(message, path, under, over):
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert f"field {under!r}" in message and f"field {over!r}" in message
    assert "a field cannot also be a group of fields" in message


@pytest.mark.parametrize("shard_size", [None, 1], ids=["one-task", "a-task-per-file"])
@pytest.mark.parametrize("group_first", [False, True], ids=["field-first", "group-first"])
@pytest.mark.parametrize("fmt", ["zarr", "parquet"])
def test_a_field_that_is_a_group_in_another_file_is_refused(
    catalog, tmp_path, shard_size, group_first, fmt
):
    # one file's field 'fields' and another's 'fields/density': a Zarr shard holding both
    # could not read the second; refused whether the files share a task (the worker sees
    # both) or not (the driver merges the run's schema), in either order
    src = tmp_path / "src"
    src.mkdir()
    first, second = ("a.h5", "b.npz") if group_first else ("a.npz", "b.h5")
    (_group_file if group_first else _field_file)(src / first)
    (_field_file if group_first else _group_file)(src / second)
    opts = {"shard_size": shard_size} if shard_size else {}
    with pytest.raises(SourceError) as info:
        ingest([src], dataset="d", store=catalog, snapshot=True, format=fmt, **opts)
    _assert_group_clash(str(info.value), str(src / second), "fields/density", "fields")
    assert str(src / first) in str(info.value)  # where the other field comes from
    assert catalog.staged("d") == []
    assert catalog.branches("d").get_versioned("main")[0] is None

    r = ingest([src], dataset="d", store=catalog, snapshot=True, format=fmt, on_error="skip", **opts)
    assert [s.path for s in r.files_skipped] == [str(src / second)]
    assert [s.name for s in r.schema] == ["fields/density" if group_first else "fields"]


@pytest.mark.parametrize("allow", [False, True])
def test_a_field_that_is_a_group_of_a_field_of_the_dataset_is_refused(catalog, tmp_path, allow):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    _field_file(old / "a.npz")
    ingest([old], dataset="d", store=catalog, snapshot=True, format="zarr")
    head = catalog.branches("d").get_versioned("main")[0]
    _group_file(new / "b.h5")
    with pytest.raises(SourceError) as info:
        ingest([new], dataset="d", store=catalog, snapshot=True, allow_schema_change=allow)
    _assert_group_clash(str(info.value), str(new / "b.h5"), "fields/density", "fields")
    assert "dataset 'd'" in str(info.value)
    assert catalog.staged("d") == [] and catalog.branches("d").get_versioned("main")[0] == head


def test_the_driver_refuses_a_field_and_its_group_from_the_pieces_of_one_file():
    # the pieces of one file run on different workers: only the joined schema has both
    from simstore.ingest._driver import _group_clash
    from simstore.sample import FieldSpec

    def spec(name):
        return FieldSpec(name=name, kind="tensor", dtype="float32", ndim=2)

    both = [spec("a/b/c"), spec("a/b"), spec("x")]
    message = _group_clash("f.h5", both, {})
    assert message is not None
    _assert_group_clash(message, "f.h5", "a/b/c", "a/b")
    assert "of this file" in message
    message = _group_clash("g.h5", [spec("a")], {"a/b/c": "f.h5", "x": "dataset 'd'"})
    assert message == (
        "g.h5: field 'a/b/c' of f.h5 lies under field 'a'; a field cannot also be a group of "
        "fields"
    )
    assert _group_clash("g.h5", [spec("a/c"), spec("ab"), spec("a/b")], {"a/b": "f.h5"}) is None
    # fields already in the merged schema were checked when they came in
    assert _group_clash("g.h5", [spec("a"), spec("a/b")], {"a": "x", "a/b": "y"}) is None


def test_a_dataset_that_has_a_field_and_its_group_from_before_still_ingests_readable_shards(
    catalog, tmp_path, monkeypatch, read
):
    # a head written before the check holds both 'fields' and 'fields/density': the new
    # files' samples with each go to separate Zarr shards (one shard cannot hold both)
    import simstore.ingest._worker as worker

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    _field_file(old / "a.npz")
    _group_file(old / "b.h5")
    with monkeypatch.context() as m:
        m.setattr(worker.FieldGroups, "clash", lambda self, name: None)  # every check
        ingest([old], dataset="d", store=catalog, snapshot=True, format="zarr", shard_size=1)
    _field_file(new / "c.npz")
    _group_file(new / "d.h5")
    _field_file(new / "e.npz")
    r = ingest([new], dataset="d", store=catalog, snapshot=True, format="zarr")
    assert r.samples_staged == 3 and r.shards == 3
    _, samples = read(catalog, f"d@{r.snapshot_id}")
    assert {k: sorted(v) for k, v in samples.items()} == {
        "a": ["fields"], "b.h5": ["fields/density"], "c": ["fields"],
        "d.h5": ["fields/density"], "e": ["fields"],
    }


def test_a_cad_file_that_does_not_read_names_the_file_and_no_field(catalog, tmp_path):
    # the whole file failed: there is no field to name (the message named `points`, the
    # first field the adapter would have made)
    root = tmp_path / "cad"
    root.mkdir()
    (root / "part.step").write_text("this is not a step file\nhello\n")
    with pytest.raises(SourceError) as info:
        ingest([root], dataset="d", store=catalog, snapshot=True)
    message = str(info.value)
    assert "\n" not in message and "part.step" in message
    assert "not a readable CAD file" in message and "field" not in message
    assert catalog.staged("d") == []


def test_a_binary_stl_cut_short_says_so(catalog, tmp_path):
    import meshio

    root = tmp_path / "stl"
    root.mkdir()
    good = root / "tri.stl"
    points = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]], np.float64)
    meshio.write(good, meshio.Mesh(points, [("triangle", np.array([[0, 1, 2], [1, 3, 2]]))]),
                 binary=True)
    data = good.read_bytes()
    assert len(data) == 84 + 50 * 2
    good.unlink()
    (root / "cut.stl").write_bytes(data[:-30])  # written by meshio, then cut short
    with pytest.raises(SourceError) as info:
        ingest([root], dataset="d", store=catalog, snapshot=True)
    message = str(info.value)
    assert "\n" not in message and "cut.stl" in message
    assert "says 2 triangles (184 bytes), the file has 154 bytes" in message
    assert "\\x00" not in message
    assert catalog.staged("d") == []


@pytest.mark.parametrize("name", [b"x", "x\udcff", "\ud800"])
def test_a_field_name_that_is_not_utf8_text_is_refused_naming_it(name):
    """An adapter handing a name of bytes, or of bytes that are not UTF-8 (a file name
    decoded with surrogates): refused by name, never a TypeError or a surrogate error."""
    from simstore.errors import InvalidInputError
    from simstore.ingest._arrays import check_field_name

    with pytest.raises(InvalidInputError) as info:
        check_field_name(name)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    message.encode("utf-8")  # printable: no lone surrogate left in it
    assert ("must be text" if isinstance(name, bytes) else "is not UTF-8 text") in message
