"""A source file rewritten in place after its change check, before its shard is written.

A columnar writer encodes its samples when the shard closes, after the task has checked
each file against its listing. It held views of the files' mapped pages, so a file
rewritten in that window put the new bytes in the shard while the manifest's sample
hash, the journal and the statistics described the old: ``verify --deep --samples``
failed on the snapshot and the loader served the new values. Now the writer keeps a copy
of what was read and hashed.
"""

from __future__ import annotations

import numpy as np
import pytest
from simstore.loaders import SimDataset

from simstore.catalog import verify
from simstore.ingest import _sources, ingest


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
@pytest.mark.parametrize("workers", [1, 2])
def test_the_shard_holds_what_was_checked(catalog, tmp_path, monkeypatch, fmt, workers):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b", "c"):
        np.save(src / f"{name}.npy", np.full(16384, 1.0, np.float32))
    real_check = _sources.ListedSource.check

    def check_then_rewrite(self):
        real_check(self)
        if self.src.path.endswith("a.npy"):  # in place: the same inode, new bytes
            with open(self.src.path, "r+b") as f:
                f.seek(-4 * 16384, 2)
                f.write(np.full(16384, 2.0, np.float32).tobytes())

    monkeypatch.setattr(_sources.ListedSource, "check", check_then_rewrite)
    ingest([src], dataset="d", store=catalog, format=fmt, workers=workers,
           start_method="fork", snapshot=True, message="m")

    report = verify(catalog, "d", deep=True, samples=True)
    assert report.ok, report.problems
    values = {s["__key__"]: s["data"] for s in SimDataset(catalog.store, "d", shuffle=False)}
    assert sorted(values) == ["a", "b", "c"]
    assert all(float(v.min()) == float(v.max()) == 1.0 for v in values.values())
