"""The decoded chunks kept around a read stay within their bound, whatever the layout.

A compressed array chunked across the window's axis (``(T, 4, nx)`` read in windows along
T) made every window's region the whole array, kept until its last window: memory grew
with the source. Above the bound a read decodes its chunks for itself instead.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import simstore.formats.adapters._tree as tree
from simstore.formats.adapters._tree import SlicedArray


@pytest.fixture
def across_time(tmp_path):
    values = np.random.default_rng(0).standard_normal((32, 16, 64)).astype(np.float32)
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:  # each chunk spans every time step
        f.create_dataset("u", data=values, chunks=(32, 2, 64), compression="gzip")
    f = h5py.File(path, "r")
    yield f["u"], values, str(path)
    f.close()
    tree.release_region()


def _windows(handle, values, path):
    got = []
    for t in range(0, 32, 4):
        window = SlicedArray(handle, path=path, field="u", offset=t, length=4,
                             chunks=handle.chunks)
        got.append((window[()], tree._REGION[0]))
        np.testing.assert_array_equal(got[-1][0], values[t : t + 4])
    return got


def test_a_region_over_the_bound_is_not_kept(across_time, monkeypatch):
    handle, values, path = across_time
    # the whole array (128 KiB) around each window: over a bound of 64 KiB and two chunks
    monkeypatch.setattr(tree, "REGION_BYTES", 64 << 10)
    monkeypatch.setattr(tree, "_CHUNK_REGION_MIN", 0)
    assert all(held is None for _, held in _windows(handle, values, path))


def test_a_region_within_the_bound_serves_the_next_windows(across_time, monkeypatch):
    handle, values, path = across_time
    monkeypatch.setattr(tree, "_CHUNK_REGION_MIN", 0)
    held = [h for _, h in _windows(handle, values, path)]
    assert held[0] is not None and held[0][2].nbytes == values.nbytes  # decoded once
