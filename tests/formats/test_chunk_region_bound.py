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


def test_the_old_region_is_gone_before_the_next_one_is_read(tmp_path, monkeypatch):
    """Windows that straddle chunks: each new region is read after the previous one's
    memory is let go (the reading frame kept a reference to it: both were held at once)."""
    import weakref

    monkeypatch.setattr(tree, "_CHUNK_REGION_MIN", 0)
    values = np.arange(64 * 8 * 16, dtype=np.float32).reshape(64, 8, 16)
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("u", data=values, chunks=(16, 8, 16), compression="gzip")
    regions = []
    alive_at_read = []

    class Spy:
        def __init__(self, ds):
            self.ds, self.shape, self.dtype, self.chunks = ds, ds.shape, ds.dtype, ds.chunks

        def __getitem__(self, box):
            alive_at_read.append(sum(r() is not None for r in regions))
            out = np.asarray(self.ds[box])
            regions.append(weakref.ref(out))
            return out

    with h5py.File(path, "r") as f:
        spy = Spy(f["u"])
        for start in range(0, 64 - 6 + 1, 5):  # windows of 6 every 5: across 16-step chunks
            window = SlicedArray(spy, path=str(path), field="u", offset=start, length=6,
                                 chunks=f["u"].chunks)
            np.testing.assert_array_equal(window[()], values[start : start + 6])
    tree.release_region()
    assert len(regions) > 2 and alive_at_read == [0] * len(regions)
