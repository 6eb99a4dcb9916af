"""How simstore lays out the arrays of a Zarr v3 shard: chunk shapes, slabs, codecs.

Shared by the writer (:mod:`._zarr_write`) and the reader (:mod:`._zarr`): the chunk grid
a field gets (:func:`auto_chunks`), how much of a lazy source the writer reads at a time
(:func:`slab_axes`), fill values, the JSON form of scalars (bit for bit, NaN payloads
included), and the codecs (``bytes``, then ``zstd`` or ``blosc``) that encode a chunk and
decode it again.
"""

from __future__ import annotations

import math
import string
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from simstore.ingest import parse_compression

from ._arrow_decode import scalar_out

__all__ = [
    "CONTIGUOUS_FIELD_CHUNKS",
    "SLAB_CHUNKS",
    "ChunkCodec",
    "ChunkDecoder",
    "auto_chunks",
    "fill_value_of",
    "import_zarr",
    "json_scalar",
    "scalar_from_json",
    "slab_axes",
]


def import_zarr() -> Any:
    """zarr-python, imported when first needed (with a hint where it is missing)."""
    try:
        import zarr
    except ImportError as exc:  # pragma: no cover - zarr is a core dependency
        raise ImportError("Zarr shards need zarr-python 3: pip install 'zarr>=3'") from exc
    return zarr


CONTIGUOUS_FIELD_CHUNKS = 8
"""A field of at most this many target chunks is chunked in C order (see ``auto_chunks``)."""


def auto_chunks(shape: Sequence[int], itemsize: int, target_bytes: int) -> tuple[int, ...]:
    """A chunk shape of at most about ``target_bytes`` for a field of ``shape``.

    A field of at most ``CONTIGUOUS_FIELD_CHUNKS`` target chunks (8 MiB by default), which
    a training job reads whole, gets chunks that are contiguous runs of the C-order array
    (``[1, ..., 1, k, n, ..., n]``, ``k`` dividing its axis): a whole read then lands
    each chunk straight in its place in the batch, with no gather, and a window along the
    leading (time) axis reads whole chunks. A larger field halves its longest axis until
    a chunk fits, so chunks stay near-cubic and a crop along any axis of a big grid reads
    little it does not need.
    """
    dims = [max(1, int(n)) for n in shape]
    if math.prod(dims) * itemsize <= CONTIGUOUS_FIELD_CHUNKS * target_bytes:
        chunk = list(dims)
        for i in range(len(dims)):
            rest = math.prod(dims[i + 1 :]) * itemsize
            if rest * dims[i] <= target_bytes:
                break
            if rest <= target_bytes:
                chunk[i] = _run_length(dims[i], target_bytes // rest)
                break
            chunk[i] = 1
        return tuple(chunk)
    chunk = list(dims)
    while math.prod(chunk) * itemsize > target_bytes and max(chunk, default=1) > 1:
        i = int(np.argmax(chunk))
        chunk[i] = (chunk[i] + 1) // 2
    return tuple(chunk)


SLAB_CHUNKS = 64
"""A Zarr writer reads a field at most ``SLAB_CHUNKS * chunk_bytes`` at a time."""


def slab_axes(shape: Sequence[int], chunk: Sequence[int], itemsize: int, limit: int) -> int:
    """How many leading axes the writer steps through chunk by chunk, reading slabs.

    A slab spans one chunk on each of the first ``d`` axes and the whole field on the
    rest; ``d`` is the fewest leading axes whose slabs fit in ``limit`` bytes (at most
    every axis: one chunk per read). A slab over whole trailing axes is one contiguous
    read of a C-ordered source, and each of its chunks is cut from memory: a source
    chunked by time step (an HDF5 dataset's ``(1, ny, nx)``) is read once, where reading
    it box by box read each of its chunks once per box (16x more with ``(16, 128,
    128)`` boxes of ``(64, 512, 512)`` float32).
    """
    for d in range(len(shape) + 1):
        if math.prod(chunk[:d]) * math.prod(shape[d:]) * itemsize <= limit:
            return d
    return len(shape)


def _run_length(n: int, fit: int) -> int:
    """Rows per chunk along an axis of ``n``.

    The largest divisor of ``n`` up to ``fit`` (no padded edge chunk), unless that is
    under half of ``fit``: then ``fit``, with a padded edge chunk.
    """
    best = max(
        (d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i) if d <= fit),
        default=1,
    )
    return best if 2 * best >= fit else fit


def fill_value_of(dtype: np.dtype[Any]) -> Any:
    """An array's ``fill_value`` in its metadata: false or zero of its dtype."""
    if dtype.kind == "b":
        return False
    if dtype.kind == "f":
        return 0.0
    return 0


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""The strings Zarr v3 spells non-finite floats with (the ``fill_value`` convention)."""


def _native(dtype: str) -> np.dtype[Any]:
    return np.dtype(dtype).newbyteorder("=")


def json_scalar(value: Any, dtype: str) -> Any:
    """A scalar parameter as JSON, its bits kept exactly.

    A finite value is a JSON number (which gives back the same bits); ``+Inf`` and
    ``-Inf`` are Zarr's strings ``"Infinity"`` and ``"-Infinity"``; the NaN
    ``float("nan")`` gives in ``dtype`` (``0x7ff8000000000000`` for float64,
    ``0x7fc00000`` for float32) is ``"NaN"``; any other NaN (the sign bit set, as 0/0
    gives on x86, or another payload) is Zarr's raw-bits string: ``"0x"`` and the value's
    bits as an unsigned integer in ``2 * itemsize`` lower-case hex digits (its bytes in
    big-endian order), so ``"0xfff8000000000000"`` for a float64 -NaN.
    """
    arr = np.asarray(value, dtype=_native(dtype))
    v = arr.item()
    if not isinstance(v, float) or math.isfinite(v):
        return v
    if not math.isnan(v):
        return "Infinity" if v > 0 else "-Infinity"
    raw = arr.tobytes()
    if raw == np.asarray(math.nan, dtype=arr.dtype).tobytes():
        return "NaN"
    return f"0x{int.from_bytes(raw, sys.byteorder):0{2 * arr.dtype.itemsize}x}"


def scalar_from_json(value: Any, dtype: str) -> Any:
    """The inverse of :func:`json_scalar`, bit for bit.

    ``"NaN"`` (all a shard written before raw-bits strings holds for any NaN) reads as
    ``float("nan")`` in ``dtype``. Raises ``ValueError`` for a string that is neither
    one of Zarr's names nor the raw bits of a float of ``dtype``.
    """
    if isinstance(value, str):
        if value in _NON_FINITE:
            value = _NON_FINITE[value]
        else:
            native = _native(dtype)
            width = 2 * native.itemsize
            digits = value[2:]
            if (
                native.kind != "f"
                or not value.startswith("0x")
                or len(digits) != width
                or any(c not in string.hexdigits for c in digits)
            ):
                raise ValueError(f"{value!r} is not a {dtype} value")
            bits = int(digits, 16).to_bytes(native.itemsize, sys.byteorder)
            value = np.frombuffer(bits, dtype=native)[0]
    return scalar_out(np.asarray(value, dtype=dtype)[()], dtype)


_BLOSC_LOCK = threading.Lock()
_BLOSC_HELD = 0
_BLOSC_PRIOR: Any = None


def blosc_without_start_method() -> None:
    """Give numcodecs' Blosc its lock before its first use, made without side effects.

    numcodecs makes that lock with ``multiprocessing.Lock()`` on the first Blosc encode
    or decode, which fixes the process's default start method for good: a pipeline or
    training script that calls ``multiprocessing.set_start_method("spawn")`` after an
    ingest or a read of Blosc chunks got "context has already been set". The lock made
    here comes from an explicit context, which leaves the default alone (the same kind
    of lock: a fork context's, as Linux's default gives, never a named semaphore). Where
    numcodecs keeps the lock elsewhere (another version), nothing is done.
    """
    import multiprocessing

    from numcodecs import blosc

    with _BLOSC_LOCK:
        if getattr(blosc, "_MUTEX_IS_INIT", True) or not hasattr(blosc, "_MUTEX"):
            return
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else methods[0])
        blosc._MUTEX = ctx.Lock()
        blosc._MUTEX_IS_INIT = True


def _one_thread(encode: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``encode`` with Blosc's own threads off, so its output is the same every time.

    numcodecs' Blosc compresses with several threads by default, and then the bytes of a
    chunk differ from run to run (the values decode the same): equal samples must give
    equal shards and equal object ids. The switch is numcodecs' process-wide
    ``use_threads``: off while any encode runs (several chunks may encode at once, on
    threads of their own), set again at each encode, and put back when the last one
    ends. Code that sets it to True in the same process while an ingest compresses
    can still slip in between (so can any setting of a process-wide flag): don't.
    """
    from numcodecs import blosc

    def encode_one_thread(buf: Any) -> Any:
        global _BLOSC_HELD, _BLOSC_PRIOR
        with _BLOSC_LOCK:
            if _BLOSC_HELD == 0:
                _BLOSC_PRIOR = blosc.use_threads
            # set again for every encode: other code in the process may have set it since
            blosc.use_threads = False
            _BLOSC_HELD += 1
        try:
            return encode(buf)
        finally:
            with _BLOSC_LOCK:
                _BLOSC_HELD -= 1
                if _BLOSC_HELD == 0:
                    blosc.use_threads = _BLOSC_PRIOR

    return encode_one_thread


class ChunkCodec:
    """Chunk encoder for one array: its Zarr v3 codec list and the bytes it produces."""

    def __init__(self, compression: str, dtype: np.dtype[Any]) -> None:
        codec, level = parse_compression(compression)
        self.codecs: list[dict[str, Any]] = (
            [{"name": "bytes", "configuration": {"endian": "little"}}]
            if dtype.itemsize > 1
            else [{"name": "bytes"}]
        )
        self._encode: Any = None
        if codec == "shuffle-zstd" and dtype.kind == "f":
            from numcodecs import Blosc

            blosc_without_start_method()

            self.codecs.append(
                {
                    "name": "blosc",
                    "configuration": {
                        "typesize": dtype.itemsize,
                        "cname": "zstd",
                        "clevel": level,
                        "shuffle": "shuffle",
                        "blocksize": 0,
                    },
                }
            )
            self._encode = _one_thread(
                Blosc(cname="zstd", clevel=level, shuffle=Blosc.SHUFFLE, blocksize=0).encode
            )
        elif codec != "none":
            from numcodecs import Zstd

            self.codecs.append(
                {"name": "zstd", "configuration": {"level": level, "checksum": False}}
            )
            self._encode = Zstd(level=level, checksum=False).encode

    @property
    def compresses(self) -> bool:
        """Whether chunks are encoded (compressed), not stored as their bytes."""
        return self._encode is not None

    def encode(self, chunk: np.ndarray) -> bytes | memoryview:
        raw = np.ascontiguousarray(chunk.astype(chunk.dtype.newbyteorder("<"), copy=False))
        if self._encode is None:
            return raw.reshape(-1).view(np.uint8).data  # the zip entry's bytes, uncopied
        return bytes(self._encode(raw))


class ChunkDecoder:
    """Decodes the chunks of one array written with the codecs simstore uses."""

    def __init__(self, meta: Mapping[str, Any]) -> None:
        self.shape = tuple(int(n) for n in meta["shape"])
        self.chunks = tuple(int(n) for n in meta["chunk_grid"]["configuration"]["chunk_shape"])
        self.dtype = np.dtype(str(meta["data_type"]))
        self.fill = meta.get("fill_value", 0)
        codecs = list(meta["codecs"])
        if not codecs or codecs[0]["name"] != "bytes":
            raise ValueError("first codec is not bytes")
        endian = codecs[0].get("configuration", {}).get("endian", "little")
        self.stored = self.dtype.newbyteorder("<" if endian == "little" else ">")
        self._decode: Any = None
        if len(codecs) == 2 and codecs[1]["name"] == "zstd":
            from numcodecs import Zstd

            self._decode = Zstd().decode
        elif len(codecs) == 2 and codecs[1]["name"] == "blosc":
            from numcodecs import Blosc

            blosc_without_start_method()

            self._decode = Blosc().decode
        elif len(codecs) != 1:
            raise ValueError(f"codecs {[c['name'] for c in codecs]} are not simstore's")

    def decode(self, raw: bytes) -> np.ndarray:
        data = self._decode(raw) if self._decode is not None else raw
        arr = np.frombuffer(data, dtype=self.stored).reshape(self.chunks)
        return arr if self.stored == self.dtype else arr.astype(self.dtype)
