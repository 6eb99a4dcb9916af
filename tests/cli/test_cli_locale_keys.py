"""The same files give the same keys, field names and shards under any locale.

Python decodes file names (and arguments) with the locale's encoding. Under a Latin-1
locale the UTF-8 name ``dä€.npy`` was stored as the key ``dÃ¤â\\x82¬``, a Zarr folder's
array ``ärr`` became the field ``Ã¤rr``, a ``.pvd``'s step ``stép_0.vtu`` was "no such
file"; under the C locale without UTF-8 mode the names were refused as "not valid UTF-8"
or were a ``UnicodeEncodeError`` traceback. The command line now runs in Python's UTF-8
mode (the names' own bytes), and ``simstore.ingest`` reads keys from the bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import zarr

from simstore.catalog import Catalog

NAME = "dä€"  # € has no Latin-1 byte


@pytest.fixture(scope="module")
def latin1(tmp_path_factory):
    """A Latin-1 locale compiled for the test (``localedef``, from glibc's sources)."""
    where = tmp_path_factory.mktemp("locales")
    subprocess.run(["localedef", "-i", "en_US", "-f", "ISO-8859-1",
                    str(where / "en_US.ISO-8859-1")], check=True, capture_output=True)
    return {"LOCPATH": str(where), "LC_ALL": "en_US.ISO-8859-1"}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A .npy, a Zarr folder and a .pvd series, all named with non-ASCII characters."""
    import meshio

    folder = tmp_path_factory.mktemp("sources") / "src"
    folder.mkdir()
    np.save(folder / f"{NAME}.npy", np.arange(3.0))
    group = zarr.open_group(str(folder / "zä.zarr"), mode="w")
    group.create_array("ärr", shape=(4,), dtype="f4")[:] = np.arange(4, dtype="f4")
    points = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]])
    entries = []
    for i in range(2):
        meshio.Mesh(points, [("triangle", np.array([[0, 1, 2]]))],
                    point_data={"T": np.arange(3.0) + i}).write(folder / f"stép_{i}.vtu")
        entries.append(f'<DataSet timestep="{i}" part="0" file="stép_{i}.vtu"/>')
    (folder / "série.pvd").write_text(
        '<?xml version="1.0"?>\n<VTKFile type="Collection" version="0.1">\n<Collection>\n'
        + "\n".join(entries) + "\n</Collection>\n</VTKFile>\n", encoding="utf-8")
    return folder


def _run(env, *args):
    # arguments pass as the names' bytes, as a shell passes them
    argv = [sys.executable, "-m", "simstore", *args]
    return subprocess.run([a if isinstance(a, bytes) else os.fsencode(a) for a in argv],
                          env=env, timeout=300, capture_output=True)


def _ingested(tmp_path, src, env, label):
    store = str(tmp_path / f"st-{label}")
    assert _run(env, "--store", store, "init").returncode == 0
    run = _run(env, "--store", store, "ingest", str(src), "--dataset", "d", "--snapshot",
               "-m", "m", "--no-progress")
    assert run.returncode == 0, run.stderr.decode("utf-8", "replace")
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("d"))
    keys = cat.read_part(snap.parts[0], snapshot=snap.id).column("key").to_pylist()
    return store, (snap.content_hash, keys, sorted(f.name for f in snap.schema))


def test_the_same_files_give_the_same_dataset_under_any_locale(tmp_path, src, latin1):
    base = {**os.environ, "PYTHONIOENCODING": ""}
    utf8 = {**base, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    c_locale = {**base, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    latin = {**base, "LANG": "C", "PYTHONUTF8": "0", **latin1}
    _, want = _ingested(tmp_path, src, utf8, "utf8")
    assert want[1] == [NAME, "série.pvd/t0000", "série.pvd/t0001", "zä.zarr"]
    assert "ärr" in want[2]
    for label, env in (("c", c_locale), ("latin1", latin)):
        store, got = _ingested(tmp_path, src, env, label)
        assert got == want, label
        listed = _run(env, "--store", store, "keys", "d", "--prefix", NAME[:2])
        assert listed.returncode == 0, listed.stderr.decode("utf-8", "replace")
        assert listed.stdout.decode("utf-8").strip() == NAME  # UTF-8 out, as it went in
        shown = _run(env, "--store", store, "cat", "d", NAME, "--json")
        assert shown.returncode == 0, shown.stderr.decode("utf-8", "replace")
        if label == "latin1":  # typed on a Latin-1 terminal: "dä" is the bytes 64 e4
            typed = [os.fsencode(a) for a in (sys.executable, "-m", "simstore", "--store",
                                              store, "keys", "d", "--prefix")]
            listed = subprocess.run([*typed, b"d\xe4"], env=env, timeout=300,
                                    capture_output=True)
            assert listed.stdout.decode("utf-8").strip() == NAME, listed.stderr
        # a message typed on a Latin-1 terminal ("café" is the bytes 63 61 66 e9) was a
        # UnicodeEncodeError traceback once UTF-8 mode read it
        typed = b"caf\xe9" if label == "latin1" else "café"
        gone = _run(env, "--store", store, "delete", "d", NAME, "--snapshot", "-m", typed)
        assert gone.returncode == 0, gone.stderr.decode("utf-8", "replace")
        cat = Catalog.open(store)
        snap = cat.snapshot(cat.resolve("d"))
        assert (snap.samples, snap.message) == (len(want[1]) - 1, "café")


def test_only_simstore_itself_starts_again_in_utf8_mode():
    # main() called by another program under a Latin-1 locale started that program again
    # (its side effects twice; a script read from stdin, nothing at all)
    from simstore._launch import _started_as_simstore

    assert _started_as_simstore(["py", "/venv/bin/simstore", "ls"])
    assert _started_as_simstore(["py", "-X", "dev", "-Im", "simstore", "ls"])
    assert _started_as_simstore(["py", "-Wignore", "-msimstore"])
    assert not _started_as_simstore(["py", "-m", "pytest", "tests"])
    assert not _started_as_simstore(["py", "-c", "import simstore"])
    assert not _started_as_simstore(["py", "/venv/bin/train.py"])
    host = ("import sys; print('side effect', flush=True); sys.argv = ['simstore', "
            "'--version']; from simstore._launch import main; main()")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONCOERCECLOCALE": "0"}  # names read as ASCII: simstore would start again
    out = subprocess.run([sys.executable, "-c", host], env=env, capture_output=True,
                         text=True, encoding="utf-8", errors="replace", timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("side effect") == 1 and "version" in out.stdout
