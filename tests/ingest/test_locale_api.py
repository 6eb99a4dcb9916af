"""``simstore.ingest`` in a process whose locale is not UTF-8 (a pipeline's worker).

Keys come from file names' bytes, and a directory source's hash from its files' name
bytes: under the C locale without UTF-8 mode a non-ASCII name was "not valid UTF-8" and
a Zarr folder's hash a ``UnicodeEncodeError``. Names that go through Python's own
decoding (inside Zarr folders, in ``.pvd`` lists) still need UTF-8 mode: the call warns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import zarr

from simstore.ingest._sources import hash_source

NAME = "dä€"

_CHILD = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from simstore.catalog import Catalog
    from simstore.ingest import ingest
    from simstore.ingest._sources import hash_source
    src, store, folder = sys.argv[1:4]  # decoded as this locale decodes names
    cat = Catalog.init(store)
    ingest([src], dataset="d", store=cat, snapshot=True, message="m")
    snap = cat.snapshot(cat.resolve("d"))
    keys = cat.read_part(snap.parts[0], snapshot=snap.id).column("key").to_pylist()
    print(json.dumps({"keys": keys, "hash": hash_source(folder),
                      "encoding": sys.getfilesystemencoding()}))
""")


def test_keys_and_folder_hashes_under_the_c_locale(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / f"{NAME}.npy", np.arange(3.0))
    folder = tmp_path / "zä.zarr"
    zarr.open_group(str(folder), mode="w").create_array("ärr", shape=(2,), dtype="f4")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONCOERCECLOCALE": "0"}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(tmp_path / "st"),
                          str(folder)], env=env, capture_output=True, text=True,
                         encoding="utf-8", errors="replace", timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["encoding"] != "utf-8"  # the child really decodes names otherwise
    assert got["keys"] == [NAME]
    assert got["hash"] == list(hash_source(str(folder)))  # as a UTF-8 process hashes it
    assert "run Python in UTF-8 mode" in out.stderr
