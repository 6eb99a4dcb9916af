"""simstore._rows.gather: fixed-width rows from a mapped file into a batch, each once.

The Parquet reader's direct path uses it for a tensor column's rows; where it is not
built, the NumPy gather gives the same bytes (compared here on a real shard read).
"""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simstore.formats import _mapped_pages, open_shard

from simstore import _rows
from tests.formats.test_parquet_pages import BulkOut, _samples, _write

WIDTH = 24


def _source(rows=10):
    """rows of WIDTH bytes, each after a 4-byte little-endian length (a plain page)."""
    parts = []
    for i in range(rows):
        parts.append(np.uint32(WIDTH).tobytes())
        parts.append(bytes([i]) * WIDTH)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def _offsets(rows):
    return np.array([4 + r * (WIDTH + 4) for r in rows], dtype=np.int64)


def test_rows_go_to_their_slots():
    src = _source()
    dst = np.full((5, WIDTH), 255, dtype=np.uint8)
    assert _rows.gather(src, _offsets([7, 2, 9]), WIDTH, dst,
                        np.array([4, 0, 2], dtype=np.int64), True)
    assert (dst[4] == 7).all() and (dst[0] == 2).all() and (dst[2] == 9).all()
    assert (dst[1] == 255).all() and (dst[3] == 255).all()  # untouched


def test_a_wrong_length_prefix_copies_nothing():
    src = _source().copy()
    src[4 + 3 * (WIDTH + 4) - 4] = WIDTH + 1  # row 3's length
    dst = np.zeros((2, WIDTH), dtype=np.uint8)
    assert not _rows.gather(src, _offsets([1, 3]), WIDTH, dst,
                            np.array([0, 1], dtype=np.int64), True)
    assert not dst.any()
    # unchecked, the same rows are copied
    assert _rows.gather(src, _offsets([1, 3]), WIDTH, dst, np.array([0, 1], dtype=np.int64),
                        False)
    assert (dst[1] == 3).all()


@pytest.mark.parametrize("offset", [-1, 10 * (WIDTH + 4) - WIDTH + 1, 1 << 40])
def test_an_offset_outside_the_source_is_an_index_error(offset):
    dst = np.zeros((1, WIDTH), dtype=np.uint8)
    with pytest.raises(IndexError, match="outside the"):
        _rows.gather(_source(), np.array([offset], dtype=np.int64), WIDTH, dst,
                     np.array([0], dtype=np.int64), False)
    assert not dst.any()


@pytest.mark.parametrize("slot", [-1, 2])
def test_a_slot_outside_the_batch_is_an_index_error(slot):
    dst = np.zeros((2, WIDTH), dtype=np.uint8)
    with pytest.raises(IndexError, match="slot"):
        _rows.gather(_source(), _offsets([0, 1]), WIDTH, dst,
                     np.array([0, slot], dtype=np.int64), False)
    assert not dst.any()


def test_bad_arguments_are_refused():
    src = _source()
    dst = np.zeros((2, WIDTH), dtype=np.uint8)
    with pytest.raises(TypeError, match="offsets must be an int64 array"):
        _rows.gather(src, np.array([4], dtype=np.int32), WIDTH, dst,
                     np.array([0], dtype=np.int64), False)
    with pytest.raises(ValueError, match="differ in length"):
        _rows.gather(src, _offsets([0, 1]), WIDTH, dst, np.array([0], dtype=np.int64), False)
    with pytest.raises(ValueError, match="whole number of rows"):
        _rows.gather(src, _offsets([0]), WIDTH, np.zeros(WIDTH + 1, np.uint8),
                     np.array([0], dtype=np.int64), False)
    with pytest.raises(ValueError, match="width"):
        _rows.gather(src, _offsets([0]), 0, dst, np.array([0], dtype=np.int64), False)
    with pytest.raises((TypeError, ValueError, BufferError)):
        _rows.gather(src, _offsets([0]), WIDTH, dst[:, ::2], np.array([0], dtype=np.int64),
                     False)  # not contiguous
    readonly = np.zeros((2, WIDTH), dtype=np.uint8)
    readonly.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        _rows.gather(src, _offsets([0]), WIDTH, readonly, np.array([0], dtype=np.int64), False)


class _ShuffledOut(BulkOut):
    """The pages tests' ``out=``, its rows in a shuffled order (a scatter, as a batch's)."""

    def __init__(self, n):
        super().__init__(n)
        self.slots = np.random.default_rng(5).permutation(n)

    def many(self, rows, name, shape, dtype):
        return super().many(self.slots[np.asarray(list(rows), dtype=np.intp)], name, shape,
                            dtype)


def test_the_reader_gives_the_same_rows_with_and_without_it(tmp_path, monkeypatch):
    samples = _samples(40)
    path = _write(tmp_path, samples)  # small row groups: a read spans several
    positions = [int(p) for p in np.random.default_rng(1).permutation(40)[:25]]

    def read():
        reader = open_shard(path)
        try:
            out = _ShuffledOut(len(positions))
            values = list(reader.read(positions, ["u", "Re"], out=out))
            assert reader.direct_rows == len(positions)  # the direct path ran
            return values, out.buffers["u"].copy()
        finally:
            reader.close()

    (with_it, batch), calls = read(), []
    real = _rows.gather
    monkeypatch.setattr(_rows, "gather", lambda *a: calls.append(a) or real(*a))
    read()
    assert calls  # the reader copies through it when it is built
    monkeypatch.setattr(_mapped_pages, "_rows", None)
    without, batch_without = read()
    np.testing.assert_array_equal(batch, batch_without)
    for p, a, b in zip(positions, with_it, without, strict=True):
        np.testing.assert_array_equal(a["u"], b["u"])
        np.testing.assert_array_equal(a["u"], samples[p].fields["u"])


@settings(max_examples=200, deadline=None)
@given(width=st.integers(1, 40), src_len=st.integers(0, 300), rows=st.integers(0, 6),
       data=st.data())
def test_matches_numpy_indexing_or_refuses_like_it(width, src_len, rows, data):
    src = np.frombuffer(bytes(range(256)) * 2, dtype=np.uint8)[:src_len]
    n = data.draw(st.integers(0, 8))
    offsets = np.array(data.draw(st.lists(st.integers(-5, src_len + 5), min_size=n,
                                          max_size=n)), dtype=np.int64)
    slots = np.array(data.draw(st.lists(st.integers(-1, rows), min_size=n, max_size=n)),
                     dtype=np.int64)
    dst = np.zeros((rows, width), dtype=np.uint8)
    inside = all(0 <= a <= src_len - width for a in offsets.tolist())
    fits = all(0 <= s < rows for s in slots.tolist())
    if not (inside and fits):
        with pytest.raises(IndexError):
            _rows.gather(src, offsets, width, dst, slots, False)
        assert not dst.any()
        return
    assert _rows.gather(src, offsets, width, dst, slots, False)
    expected = np.zeros_like(dst)
    for a, s in zip(offsets.tolist(), slots.tolist(), strict=True):
        expected[s] = src[a:a + width]  # a repeated slot: the last row written wins
    np.testing.assert_array_equal(dst, expected)


INDEX_IN_DST = r"""
import sys
import numpy as np
from simstore import _rows

W = 8
far = np.frombuffer(np.int64(1 << 40).tobytes(), dtype=np.uint8)
src = np.concatenate([far, np.full(W, 7, dtype=np.uint8)])  # row 0 holds 2**40, row 1 sevens
mem = np.zeros(4 * W, dtype=np.uint8)
dst = mem.reshape(4, W)
if sys.argv[1] == "slots":  # slots in dst's rows 1 and 2; row 0 goes to row 2 (slots[1])
    offsets = np.array([0, W], dtype=np.int64)
    slots = mem[W:3 * W].view(np.int64)
    slots[:] = [2, 0]
else:  # offsets in dst's rows 0 and 1; row 0 goes to row 1 (offsets[1])
    offsets = mem[:2 * W].view(np.int64)
    offsets[:] = [0, W]
    slots = np.array([1, 0], dtype=np.int64)
expected = dst.copy()
expected[slots.copy()] = src.reshape(2, W)[offsets.copy() // W]  # indexes read first
assert _rows.gather(src, offsets, W, dst, slots, False)
assert (dst == expected).all(), (dst.tolist(), expected.tolist())
print("ok")
"""


@pytest.mark.parametrize("which", ["slots", "offsets"])
def test_offsets_and_slots_are_used_as_checked_when_a_row_copied_overwrites_them(which):
    # a row copied into dst changes a later slot (or offset) that lies in dst: the value
    # checked, not the new one (2**40, far outside both buffers), must be the one used.
    # In a new process: used unchecked, it writes or reads outside the buffers (SIGSEGV)
    done = subprocess.run([sys.executable, "-c", INDEX_IN_DST, which], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]
