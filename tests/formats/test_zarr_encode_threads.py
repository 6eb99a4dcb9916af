"""A Zarr shard's chunks compressed side by side give the bytes compressed one by one."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from numcodecs import blosc
from simstore.formats import ZarrFormat, open_shard
from simstore.formats._zarr_layout import ChunkCodec, _one_thread

from simstore.ingest import ShardOptions
from simstore.sample import Sample


def _samples() -> list[Sample]:
    rng = np.random.default_rng(2)
    smooth = np.cumsum(rng.standard_normal((48, 96, 96)), axis=0).astype(np.float32)
    return [
        Sample("a", {"u": smooth, "w": smooth[:5].astype(np.float64), "re": 3.5}),
        Sample("b", {"u": smooth[::-1].copy(), "w": smooth[5:10].astype(np.float64), "re": 1.0}),
    ]


def _write(path, compression: str, threads: int) -> bytes:
    writer = ZarrFormat(ShardOptions(compression=compression)).open_writer(str(path))
    writer.encode_threads = threads
    for i, sample in enumerate(_samples()):
        writer.add(sample, sample_hash=f"{i:032x}", size_bytes=1)
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("compression", ["shuffle-zstd:1", "zstd:3"])
def test_chunks_encoded_side_by_side_are_the_same_bytes(tmp_path, monkeypatch, compression):
    encoders: set[str] = set()
    real = ChunkCodec.encode

    def encode(self, chunk):
        encoders.add(threading.current_thread().name)
        return real(self, chunk)

    monkeypatch.setattr(ChunkCodec, "encode", encode)
    prior = blosc.use_threads
    one = _write(tmp_path / "one.zip", compression, 1)
    assert encoders == {threading.current_thread().name}
    encoders.clear()
    four = _write(tmp_path / "four.zip", compression, 4)
    assert any(name.startswith("simstore-chunk-encoder") for name in encoders)
    assert one == four
    assert blosc.use_threads == prior  # put back once the last encode ended
    shard = open_shard(str(tmp_path / "four.zip"))
    try:
        got = next(iter(shard.read([0])))
    finally:
        shard.close()
    np.testing.assert_array_equal(got["u"], _samples()[0].fields["u"])


def test_blosc_threads_stay_off_while_any_encode_runs(monkeypatch):
    """Two encodes at once, the first to start ends first: Blosc's own threads stay off
    for the second, and are put back once it ends too."""
    codec = ChunkCodec("shuffle-zstd:1", np.dtype(np.float32))
    a_in, b_in, a_gone = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def slow(buf):
        if not a_in.is_set():  # the first encode
            seen["a"] = blosc.use_threads
            a_in.set()
            b_in.wait(5)
        else:
            seen["b"] = blosc.use_threads
            b_in.set()
            a_gone.wait(5)
            seen["b after a"] = blosc.use_threads
        return b""

    monkeypatch.setattr(codec, "_encode", _one_thread(slow))
    monkeypatch.setattr(blosc, "use_threads", True)
    chunk = np.zeros(16, np.float32)
    a = threading.Thread(target=ChunkCodec.encode, args=(codec, chunk))
    b = threading.Thread(target=ChunkCodec.encode, args=(codec, chunk))
    a.start()
    assert a_in.wait(5)
    b.start()
    a.join(10)
    a_gone.set()
    b.join(10)
    assert seen == {"a": False, "b": False, "b after a": False}
    assert blosc.use_threads is True


def test_an_encode_turns_blosc_threads_off_though_other_code_turned_them_on(monkeypatch):
    """Another encode is running, other code sets ``use_threads``: the next encode still
    runs on one thread (its bytes would differ otherwise)."""
    codec = ChunkCodec("shuffle-zstd:1", np.dtype(np.float32))
    a_in, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def slow(buf):
        seen.append(blosc.use_threads)
        if not a_in.is_set():
            a_in.set()
            release.wait(5)
        return b""

    monkeypatch.setattr(codec, "_encode", _one_thread(slow))
    monkeypatch.setattr(blosc, "use_threads", None)
    chunk = np.zeros(16, np.float32)
    a = threading.Thread(target=ChunkCodec.encode, args=(codec, chunk))
    a.start()
    assert a_in.wait(5)
    blosc.use_threads = True  # a user's code, meanwhile
    codec.encode(chunk)
    release.set()
    a.join(10)
    assert seen == [False, False]
