"""A fresh process's first batch imports nothing: every module it needs comes with
``simstore.loaders`` (an import inside the first batch is part of the training loop's
wait; torch's DataLoader imports an optional profiler module at its first ``__next__``,
0.7 ms here, which the loader's import now makes instead)."""

import json
import subprocess
import sys

import pytest
from loader_helpers import npz_parquet_store

_JOB = r"""
import json, sys
from simstore.loaders import SimDataLoader, SimDataset
before = set(sys.modules)
ds = SimDataset(sys.argv[1], "d@main", seed=1)
loader = SimDataLoader(ds, batch_size=4, num_workers=0)
batch = next(iter(loader))
print(json.dumps({"new": sorted(set(sys.modules) - before), "rows": len(batch["__key__"])}))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return npz_parquet_store(tmp_path_factory, seed=5)


def test_the_first_batch_of_a_parquet_dataset_imports_no_module(store):
    out = subprocess.run([sys.executable, "-c", _JOB, store], capture_output=True, text=True,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rows"] == 4
    assert got["new"] == []
