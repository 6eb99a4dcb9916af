"""An ingest and its commit load no module they do not need.

``pa.array(ndarray)`` imports ``numpy.ma`` on its first call (6-25 ms) and
``pq.read_table`` imports ``pyarrow.dataset`` (tens of milliseconds): both were paid by
every ``simstore ingest`` at its commit, after the files were done, where no worker
process overlaps them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from simstore._columns import numpy_column

_INGEST = r"""
import json, sys
from simstore.catalog import Catalog
from simstore.ingest import ingest
from simstore.storage import LocalStore

cat = Catalog.init(LocalStore(sys.argv[2]))
ingest([sys.argv[1]], dataset="d", store=cat, workers=1, snapshot=True, progress=None)
ingest([sys.argv[1]], dataset="d", store=cat, workers=1, snapshot=True, progress=None,
       mode="replace")
print(json.dumps({m: m in sys.modules for m in ("numpy.ma", "pyarrow.dataset")}))
"""


def test_an_ingest_and_commit_import_neither_numpy_ma_nor_pyarrow_dataset(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        np.savez(src / f"run{i}.npz", u=np.arange(10, dtype=np.float32) + i)
    out = subprocess.run([sys.executable, "-c", _INGEST, str(src), str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {"numpy.ma": False, "pyarrow.dataset": False}


_DTYPES = ["bool", "int8", "uint16", "int32", "int64", "uint64", "float16", "float32",
           "float64"]


@given(st.sampled_from(_DTYPES), st.integers(0, 70), st.integers(0, 2**32 - 1), st.booleans())
def test_numpy_column_equals_pyarrows_conversion(dtype, n, seed, masked):
    rng = np.random.default_rng(seed)
    values = (rng.integers(0, 2, n) if dtype == "bool" else rng.integers(0, 120, n)).astype(dtype)
    mask = rng.random(n) < 0.3 if masked else None
    got = numpy_column(values, mask=mask)
    got.validate(full=True)
    assert got.equals(pa.array(values, mask=mask))
    assert got.type == pa.array(values).type


def test_numpy_column_hands_other_arrays_to_pyarrow():
    for values in (np.array(["a", "b"]), np.zeros((2, 2))[:, 0], np.array([1 + 2j, 3j])[:1].real):
        assert numpy_column(values).equals(pa.array(values))
