"""A shuffled tensor's bytes put back without numcodecs (``formats._arrow_decode.byte_unshuffle``).

Compressed shards store a tensor's bytes byte-shuffled as ``numcodecs.Shuffle(itemsize)``
lays them out (stock readers undo it with numcodecs); the reader undoes it with
``simstore._rows.unshuffle`` (or NumPy where that is not built), so that reading imports
no numcodecs. Both must give numcodecs' bytes back.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numcodecs import Shuffle
from simstore.formats import _arrow_decode as _arrow

from simstore import _rows


@settings(max_examples=200, deadline=None)
@given(size=st.sampled_from([1, 2, 3, 4, 8, 16]), count=st.integers(0, 300), data=st.data())
def test_unshuffle_undoes_numcodecs_shuffle_with_and_without_the_extension(size, count, data):
    raw = np.frombuffer(data.draw(st.binary(min_size=size * count, max_size=size * count)),
                        dtype=np.uint8)
    stored = np.asarray(Shuffle(elementsize=size).encode(raw), dtype=np.uint8)
    got = _arrow.byte_unshuffle(stored, size, np.empty(raw.size, dtype=np.uint8))
    np.testing.assert_array_equal(got, raw)
    saved = _arrow._rows
    try:
        _arrow._rows = None  # the NumPy path
        again = _arrow.byte_unshuffle(stored, size, np.full(raw.size, 7, dtype=np.uint8))
    finally:
        _arrow._rows = saved
    np.testing.assert_array_equal(again, raw)


def test_bad_buffers_are_refused():
    src = np.arange(16, dtype=np.uint8)
    with pytest.raises(ValueError, match="differ in length"):
        _rows.unshuffle(src, np.empty(15, np.uint8), 4)
    with pytest.raises(ValueError, match="whole number of elements"):
        _rows.unshuffle(src[:15], np.empty(15, np.uint8), 4)
    with pytest.raises(ValueError, match="positive"):
        _rows.unshuffle(src, np.empty(16, np.uint8), 0)
    with pytest.raises(ValueError, match="same buffer"):
        _rows.unshuffle(src, src, 4)
    readonly = np.empty(16, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        _rows.unshuffle(src, readonly, 4)
    with pytest.raises(ValueError, match="not whole elements"):
        _arrow.byte_unshuffle(src[:15], 4, np.empty(15, np.uint8))
