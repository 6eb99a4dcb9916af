"""Test doubles for the loader: a tiny shard format and a dataset builder.

The ``SIMTEST1`` format stores each field of all samples contiguously (column-major), so a
read of some fields touches only their bytes, and keeps an index in a JSON footer::

    b"SIMTEST1" | field bytes ... | footer JSON | footer length (8 bytes LE) | b"SIMTEST1"

Arrays come back read-only (``np.frombuffer`` over ``bytes``), like Arrow's zero-copy
views. It is registered nowhere: tests pass ``open_test_shard`` as ``shard_opener``.
"""

from __future__ import annotations

import io
import json
import os
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np
import pytest

from simstore.catalog import Catalog
from simstore.errors import FormatError, InvalidInputError
from simstore.manifest import ManifestRow, rows_from_list
from simstore.sample import Sample, hash_sample, infer_schema, sample_size_bytes
from simstore.stats import StatsAccumulator
from simstore.storage import LocalStore

MAGIC = b"SIMTEST1"


def encode_shard(samples: Sequence[Sample]) -> bytes:
    """The bytes of one test shard holding ``samples`` in order."""
    body = io.BytesIO()
    body.write(MAGIC)
    names = sorted({n for s in samples for n in s.fields})
    index: list[dict[str, Any]] = [{} for _ in samples]
    for name in names:
        for i, s in enumerate(samples):
            if name not in s.fields:
                continue
            value = s.fields[name]
            if isinstance(value, np.ndarray):
                arr = np.ascontiguousarray(value)
                offset = body.tell()
                body.write(arr.tobytes())
                index[i][name] = {
                    "kind": "tensor", "dtype": arr.dtype.str, "shape": list(arr.shape),
                    "offset": offset, "length": arr.nbytes,
                }
            elif isinstance(value, bytes):
                offset = body.tell()
                body.write(value)
                index[i][name] = {"kind": "bytes", "offset": offset, "length": len(value)}
            elif isinstance(value, bool | int | float | str):
                index[i][name] = {"kind": "value", "value": value}
            else:
                index[i][name] = {"kind": "json", "value": dict(value)}  # type: ignore[arg-type]
    footer = json.dumps({"samples": index}).encode()
    body.write(footer)
    body.write(struct.pack("<Q", len(footer)))
    body.write(MAGIC)
    return body.getvalue()


class FakeShardReader:
    """Reads a test shard from a path or a seekable file object."""

    def __init__(self, source: str | BinaryIO) -> None:
        self._owned = isinstance(source, str)
        self.file: BinaryIO = open(source, "rb") if isinstance(source, str) else source
        self.file.seek(0)
        if self.file.read(8) != MAGIC:
            self.close()
            raise FormatError("not a SIMTEST1 shard (bad magic)")
        self.file.seek(-16, os.SEEK_END)
        tail = self.file.read(16)
        if tail[8:] != MAGIC:
            self.close()
            raise FormatError("not a SIMTEST1 shard (bad trailer)")
        (length,) = struct.unpack("<Q", tail[:8])
        self.file.seek(-16 - length, os.SEEK_END)
        try:
            self.index = json.loads(self.file.read(length))["samples"]
        except (ValueError, KeyError) as exc:
            self.close()
            raise FormatError(f"SIMTEST1 footer is unreadable: {exc}") from exc
        self.bytes_read = 0
        self.fields_asked: list[tuple[str, ...] | None] = []

    def read(
        self, positions: Sequence[int], fields: Sequence[str] | None = None
    ) -> Iterator[dict[str, Any]]:
        self.fields_asked.append(tuple(fields) if fields is not None else None)
        for p in positions:
            entry = self.index[p]
            out: dict[str, Any] = {}
            for name in fields if fields is not None else entry:
                meta = entry[name]
                if meta["kind"] in ("value", "json"):
                    out[name] = meta["value"]
                    continue
                self.file.seek(meta["offset"])
                data = self.file.read(meta["length"])
                self.bytes_read += len(data)
                if meta["kind"] == "bytes":
                    out[name] = data
                else:
                    out[name] = np.frombuffer(data, dtype=meta["dtype"]).reshape(meta["shape"])
            yield out

    def close(self) -> None:
        if self._owned:
            self.file.close()


def open_test_shard(source: str | BinaryIO) -> FakeShardReader:
    """The ``shard_opener`` of the test format."""
    return FakeShardReader(source)


def commit_samples(
    store: str,
    dataset: str,
    samples: Sequence[Sample],
    *,
    per_shard: int = 10,
    message: str = "test data",
    target_rows: int | None = None,
    with_stats: bool = False,
) -> str:
    """Write ``samples`` (in order) as test shards, commit them, return the snapshot id.

    ``with_stats``: the snapshot carries the field statistics ingest would merge into it.
    """
    cat = Catalog.init(store)
    if target_rows is not None:
        cat.target_rows = target_rows
    rows: list[ManifestRow] = []
    shards = []
    acc = StatsAccumulator()
    for start in range(0, len(samples), per_shard):
        chunk = samples[start : start + per_shard]
        oid, _ = cat.put_object(encode_shard(chunk))
        shards.append(oid)
        for pos, s in enumerate(chunk):
            rows.append(ManifestRow(key=s.key, sample_hash=hash_sample(s), shard=oid,
                                    position=pos, size_bytes=sample_size_bytes(s)))
            for name, value in s.fields.items() if with_stats else ():
                if isinstance(value, np.ndarray):
                    acc.add_array(name, value)
                elif isinstance(value, int | float):
                    acc.add_scalar(name, value)
    table = rows_from_list(rows)
    stats = {"fields": acc.to_json(), "exact": True} if with_stats else None
    cat.stage(dataset, changes=table, shards=shards, schema=infer_schema(samples), stats=stats)
    return str(cat.commit(dataset, message=message).snapshot_id)


def refused(match: str, call: Any, *args: Any, **kwargs: Any) -> Exception:
    """``call`` raises an InvalidInputError whose one-line message matches ``match``."""
    with pytest.raises(InvalidInputError, match=match) as info:
        call(*args, **kwargs)
    assert type(info.value) is InvalidInputError
    assert "\n" not in str(info.value)
    return info.value


def make_samples(
    n: int, *, runs: int = 5, size: int = 8, mesh: bool = False, seed: int = 0
) -> list[Sample]:
    """``n`` samples keyed ``run<r>/t<t>`` (a run stands for a source file)."""
    rng = np.random.default_rng(seed)
    per_run = -(-n // runs)
    out = []
    for i in range(n):
        r, t = divmod(i, per_run)
        fields: dict[str, Any] = {
            "u": rng.standard_normal(size).astype(np.float32),
            "v": np.full(3, i, dtype=np.int64),
            "step": t,
            "name": f"run{r}",
        }
        if mesh:
            npts = int(rng.integers(3, 9))
            fields["points"] = rng.standard_normal((npts, 3)).astype(np.float32)
            fields["cells/triangle"] = rng.integers(0, npts, (npts - 2, 3)).astype(np.int64)
        out.append(Sample(key=f"run{r:03d}/t{t:05d}", fields=fields))
    return out


def keys_of(batches: Any) -> list[str]:
    """Keys of non-padding samples, from samples or batches."""
    out: list[str] = []
    for b in batches:
        keys = b["__key__"]
        pads = b["__pad__"]
        if isinstance(keys, str):
            if not bool(pads):
                out.append(keys)
            continue
        out.extend(k for k, p in zip(keys, pads.tolist(), strict=True) if not p)
    return out


def write_npz_sources(root: str, count: int, seed: int) -> dict[str, np.ndarray]:
    """``count`` .npz files ``tNNN.npz`` in ``root``: ``u`` (8, 16, 16) float32 (8 KiB) and
    a scalar ``p``; returns ``u`` by sample key (the file name without ``.npz``)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for t in range(count):
        u = rng.standard_normal((8, 16, 16)).astype(np.float32)
        np.savez(os.path.join(root, f"t{t:03d}.npz"), u=u, p=np.float64(t))
        arrays[f"t{t:03d}"] = u
    return arrays


def npz_parquet_store(tmp_path_factory: Any, seed: int) -> str:
    """A local store of dataset ``d``: 24 of :func:`write_npz_sources`' files ingested
    into Parquet shards of about 60 KB (several shards), committed to ``main``."""
    import simstore

    root = tmp_path_factory.mktemp("src")
    write_npz_sources(str(root), 24, seed=seed)
    path = str(tmp_path_factory.mktemp("store") / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, format="parquet", snapshot=True,
                    message="t", shard_size=60_000, zarr_threshold=1 << 30)
    return path


def snapshot_shards(store: str, ref: str = "d") -> list[str]:
    """The shard ids ``ref``'s snapshot references, sorted."""
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve(ref))
    return sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})


def flip_byte_keeping_times(path: str) -> None:
    """Flip the middle byte of a file and put its access and modification times back
    (its change time moves: no user can set that back)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def corrupt_object(root: str, object_id: str) -> None:
    """Flip a byte in the middle of a stored object (bypassing the store API)."""
    path = os.path.join(root, "objects", object_id[:2], object_id)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(bytes(data))


def assert_filled_again(cache: str, shard: str) -> None:
    """``shard``'s cache copy, found damaged, was taken out and filled again from the
    store: it is there and hashes to its id."""
    from simstore.hashing import hash_file

    copy = os.path.join(cache, "objects", shard[:2], shard)
    assert os.path.exists(copy), f"{copy} was not filled again"
    assert hash_file(copy)[0] == shard


__all__ = [
    "FakeShardReader",
    "RemoteLikeStore",
    "assert_filled_again",
    "commit_samples",
    "corrupt_object",
    "encode_shard",
    "keys_of",
    "make_samples",
    "open_test_shard",
    "write_npz_sources",
]


class RemoteLikeStore(LocalStore):
    """A local directory that pretends to be remote: no local paths, its own tier name.

    Unlike ``memory://`` it is shared by worker processes under any start method.
    """

    def __init__(self, root: str, *, read_only: bool = False, delay_s: float = 0.0) -> None:
        super().__init__(root, read_only=read_only, fsync=False)
        self.url = f"fake-remote://{self.root}"
        self.delay_s = delay_s

    def local_path(self, key: str) -> str | None:
        return None

    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        if self.delay_s:
            time.sleep(self.delay_s)
        return super().get(key, byte_range, max_bytes=max_bytes)
