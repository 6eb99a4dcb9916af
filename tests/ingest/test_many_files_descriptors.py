"""An ingest of many small files into one shard stays within the limit on open files.

A source array mapped from its file holds a file descriptor (CPython's mmap keeps a
duplicate of it) for as long as the array lives, and arrays live until their shard is
written: one shard of many one-sample files held one descriptor per file, and the ingest
failed with "Too many open files". Mappings are limited to a share of the soft limit;
past it, arrays are read, with the same values.
"""

import subprocess
import sys
import textwrap

import numpy as np

_SCRIPT = textwrap.dedent(
    """
    import os, resource, sys
    import numpy as np
    import simstore
    from simstore.catalog import Catalog

    src, store = sys.argv[1], sys.argv[2]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    from simstore.formats.adapters import _numpy
    calls = []
    mapped = _numpy.FileArray.mapped
    _numpy.FileArray.mapped = lambda self: calls.append(1) or mapped(self)
    cat = Catalog.init(store)
    r = simstore.ingest([src], dataset="d", store=cat, workers=1, snapshot=True)
    ds = simstore.SimDataset(store, "d@main", shuffle=False)
    got = {s["__key__"]: s for s in ds}
    for name in sorted(os.listdir(src)):
        with np.load(os.path.join(src, name)) as want:
            for field in want.files:
                assert np.array_equal(got[name[:-4]][field].numpy(), want[field]), name
    print(r.files, r.shards, len(got), len(calls))
    """
)


def test_three_hundred_mapped_files_in_one_shard_under_a_limit_of_128_descriptors(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(300):  # members whose values sit aligned in the file are mapped
        np.savez(src / f"run{i:03d}.npz",
                 velocity=rng.standard_normal((16, 3)).astype(np.float32),
                 pressure=rng.standard_normal(16).astype(np.float32), re=np.float64(i))
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(src), str(tmp_path / "store")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    files, shards, read, mapped = map(int, done.stdout.split())
    assert (files, shards, read) == (300, 1, 300)
    assert mapped >= 300  # a mapping asked for in every file: more than the limit allows
