r"""A source root whose own path is not valid UTF-8 (``.../run\xff/``).

Keys are paths relative to the root, so only that part must be text: the files under such
a root are ingested like any others, from Python and from the command line, and every
message, summary and lineage record that names one shows the root's bytes as escapes. A
name that is not UTF-8 inside the root is still a bad file, one line naming it.
"""

import json
import os
import shutil
import sys
import zipfile

import h5py
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))

from cli_helpers import cli  # noqa: E402

from simstore.errors import InvalidInputError, SourceError  # noqa: E402
from simstore.ingest import ingest  # noqa: E402

pytestmark = pytest.mark.skipif(
    sys.platform in ("darwin", "win32"), reason="names that are not UTF-8 are POSIX bytes"
)

ROOT_NAME = b"run\xff"
SHOWN = "run\\xff"  # how messages and summaries show it


def _odd(tmp_path, name=ROOT_NAME):
    """A folder named ``name`` (not UTF-8) under ``tmp_path``, as Python's str names it."""
    path = os.path.join(os.fsencode(tmp_path), name)
    try:
        os.mkdir(path)
    except OSError:
        pytest.skip("this file system refuses names that are not UTF-8")
    return os.fsdecode(path)


@pytest.fixture
def odd_root(tmp_path):
    r"""run\xff/ with a.npz and sub/b.h5, and the values written into them."""
    root = _odd(tmp_path)
    os.mkdir(os.path.join(root, "sub"))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.linspace(0, 1, 5)
    np.savez(os.path.join(root, "a.npz"), u=a)
    with h5py.File(os.path.join(root, "sub", "b.h5"), "w") as f:
        f["v"] = b
    return root, {"a": a, "sub/b.h5": b}


def _keys(catalog, sid):
    return sorted(catalog.manifest(catalog.snapshot(sid)).column("key").to_pylist())


def test_files_under_a_root_named_not_utf8_are_ingested_and_read_back(catalog, odd_root, read):
    root, values = odd_root
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    assert r.files_skipped == () and r.files_ingested == 2
    assert _keys(catalog, r.snapshot_id) == ["a", "sub/b.h5"]
    _, got = read(catalog, f"d@{r.snapshot_id}")
    np.testing.assert_array_equal(got["a"]["u"], values["a"])
    np.testing.assert_array_equal(got["sub/b.h5"]["v"], values["sub/b.h5"])
    json.dumps(r.to_json(), ensure_ascii=False).encode("utf-8")  # strict: no lone surrogates
    # the lineage names the sources as text, the root's byte escaped
    snap = catalog.snapshot(r.snapshot_id)
    (lineage,) = snap.lineage["ingests"]
    sources = json.loads(catalog.get_object(lineage["sources"]["object"]))
    shown = f"{os.path.dirname(root)}/{SHOWN}"
    assert sorted(s["path"] for s in sources) == [f"{shown}/a.npz", f"{shown}/sub/b.h5"]
    # the journal took the files: a re-run reads none of them and stages nothing
    again = ingest([root], dataset="d", store=catalog, snapshot=True)
    assert again.files_reused == 2 and again.samples_staged == 0
    assert again.snapshot_id == r.snapshot_id


def test_a_file_named_under_such_a_root_is_ingested(catalog, odd_root):
    root, _ = odd_root
    r = ingest([os.path.join(root, "a.npz")], dataset="d", store=catalog, snapshot=True)
    assert r.files_skipped == () and _keys(catalog, r.snapshot_id) == ["a"]


def test_a_netcdf_file_under_such_a_root_is_read(catalog, tmp_path):
    """netCDF4 opens only names it can encode as UTF-8: the adapter opens a link to it."""
    import netCDF4
    plain = tmp_path / "plain"
    plain.mkdir()
    with netCDF4.Dataset(plain / "c.nc", "w") as ds:  # netCDF4 cannot write there either
        ds.createDimension("x", 4)
        ds.createVariable("p", "f4", ("x",))[:] = np.arange(4, dtype=np.float32)
    root = _odd(tmp_path)
    shutil.copyfile(plain / "c.nc", os.path.join(root, "c.nc"))
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    assert r.files_skipped == () and _keys(catalog, r.snapshot_id) == ["c.nc"]
    assert {s.name: s.dtype for s in r.schema}["p"] == "float32"


def test_a_step_part_under_such_a_root_is_meshed(catalog, tmp_path):
    """gmsh, too, opens only UTF-8 names: the part is read through a link."""
    import gmsh  # noqa: F401
    import source_files  # tests/formats, on the path through conftest

    plain = tmp_path / "plain"
    plain.mkdir()
    source_files.write_step(plain / "box.step")
    root = _odd(tmp_path)
    shutil.copyfile(plain / "box.step", os.path.join(root, "box.step"))
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    assert r.files_skipped == () and _keys(catalog, r.snapshot_id) == ["box.step"]
    assert "points" in {s.name for s in r.schema}


def test_a_name_inside_the_root_that_is_not_utf8_is_still_a_bad_file(catalog, odd_root):
    root, _ = odd_root
    bad = os.path.join(os.fsencode(root), b"caf\xe9.npz")
    with open(bad, "wb") as f, open(os.path.join(root, "a.npz"), "rb") as g:
        f.write(g.read())
    with pytest.raises(SourceError) as info:
        ingest([root], dataset="d", store=catalog)
    message = str(info.value)
    assert "\n" not in message and f"{SHOWN}/caf\\xe9.npz: the name is not valid UTF-8" in message
    message.encode("utf-8")
    r = ingest([root], dataset="d", store=catalog, snapshot=True, on_error="skip")
    (skipped,) = r.files_skipped
    assert skipped.path == os.fsdecode(bad)  # the exact path, for Python callers
    assert f"{SHOWN}/caf\\xe9.npz" in skipped.reason
    assert _keys(catalog, r.snapshot_id) == ["a", "sub/b.h5"]


def _corrupt_npz(root):
    path = os.path.join(root, "bad.npz")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("u.npy", b"\x93NUMPY garbage")
    return path


def test_errors_about_files_under_such_a_root_are_printable(catalog, odd_root):
    root, _ = odd_root
    _corrupt_npz(root)
    with pytest.raises(SourceError) as info:
        ingest([root], dataset="d", store=catalog)
    message = str(info.value)
    message.encode("utf-8")  # no lone surrogates
    assert "\n" not in message
    assert message.startswith(f"{os.path.dirname(root)}/{SHOWN}/bad.npz: ")
    r = ingest([root], dataset="d", store=catalog, on_error="skip")
    (skipped,) = r.files_skipped
    skipped.reason.encode("utf-8")
    assert f"{SHOWN}/bad.npz: " in skipped.reason
    missing = os.fsdecode(os.path.join(os.fsencode(root), b"gone\xfe"))
    with pytest.raises(InvalidInputError, match=r"gone\\xfe: no such file or directory"):
        ingest([missing], dataset="d", store=catalog)


def test_cli_ingests_such_a_root_and_names_its_bad_files_escaped(tmp_path, odd_root):
    root, _ = odd_root
    store = str(tmp_path / "store")
    cli("--store", store, "init", code=0)
    summary = json.loads(
        cli("--store", store, "ingest", root, "--dataset", "d", "--snapshot", "--json", code=0)
    )
    assert summary["files_ingested"] == 2 and summary["skipped"] == [] and summary["snapshot"]
    text = cli("--store", store, "ingest", root, "--dataset", "d", "--no-resume", code=0)
    assert "nothing new to stage" in text
    _corrupt_npz(root)
    line = cli("--store", store, "ingest", root, "--dataset", "d", code=8)
    assert f"{SHOWN}/bad.npz: " in line
    text = cli("--store", store, "ingest", root, "--dataset", "d", "--on-error", "skip", code=0)
    assert f"skipped {os.path.dirname(root)}/{SHOWN}/bad.npz: " in text
    scratch = os.fsdecode(os.path.join(os.fsencode(root), b"gone\xfe"))
    line = cli("--store", store, "ingest", root, "--dataset", "d", "--tmp-dir", scratch, code=2)
    assert line == f"error: invalid --tmp-dir {os.path.dirname(root)}/{SHOWN}/gone\\xfe: " \
        "no such directory"
