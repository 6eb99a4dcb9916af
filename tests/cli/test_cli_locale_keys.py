"""Keys are the UTF-8 text of file names whatever the locale, and print under any locale.

Python decodes file names and arguments with the locale's encoding: under a Latin-1
locale the UTF-8 name ``dä€.npy`` was stored as the key ``dÃ¤â\\x82¬``, and under the C
locale without UTF-8 mode refused as "not valid UTF-8", so the same files gave other keys,
or none, in another locale; printing a key the locale cannot spell (``€`` in Latin-1)
was a ``UnicodeEncodeError`` traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from simstore.catalog import Catalog

NAME = "dä€"  # € has no Latin-1 byte


@pytest.fixture(scope="module")
def latin1(tmp_path_factory):
    """A Latin-1 locale compiled for the test (``localedef``, from glibc's sources)."""
    where = tmp_path_factory.mktemp("locales")
    subprocess.run(["localedef", "-i", "en_US", "-f", "ISO-8859-1",
                    str(where / "en_US.ISO-8859-1")], check=True, capture_output=True)
    return {"LOCPATH": str(where), "LC_ALL": "en_US.ISO-8859-1"}


@pytest.mark.parametrize("locale", ["C", "latin1"])
def test_keys_do_not_depend_on_the_locale(tmp_path, request, locale):
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONIOENCODING": ""}
    if locale == "latin1":
        env.update(request.getfixturevalue("latin1"))
    encoding = "latin-1" if locale == "latin1" else "utf-8"

    def simstore(*args):
        # arguments pass as the file name's bytes, as a shell passes them
        argv = [sys.executable, "-m", "simstore", *args]
        return subprocess.run([os.fsencode(a) for a in argv], env=env, timeout=300,
                              capture_output=True)

    src = tmp_path / "src"
    src.mkdir()
    np.save(src / f"{NAME}.npy", np.arange(3.0))
    store = str(tmp_path / "st")
    assert simstore("--store", store, "init").returncode == 0
    run = simstore("--store", store, "ingest", str(src), "--dataset", "d", "--snapshot",
                   "-m", "m", "--no-progress")
    assert run.returncode == 0, run.stderr.decode(encoding)
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("d"))
    assert cat.read_part(snap.parts[0], snapshot=snap.id).column("key").to_pylist() == [NAME]

    listed = simstore("--store", store, "keys", "d", "--prefix", NAME[:2])
    assert listed.returncode == 0, listed.stderr.decode(encoding)
    want = "dä\\u20ac" if locale == "latin1" else NAME  # what Latin-1 cannot spell, escaped
    assert listed.stdout.decode(encoding).strip() == want
    shown = simstore("--store", store, "cat", "d", NAME, "--json")
    assert shown.returncode == 0, shown.stderr.decode(encoding)
