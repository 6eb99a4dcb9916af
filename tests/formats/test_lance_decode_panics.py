"""A damaged Lance shard read without its hash check: an error, never a Rust panic.

Lance's decoders panic on some damaged pages (an assertion, an ``unwrap`` of an unknown
enum value); pyo3 raises that as ``PanicException``, a ``BaseException``, which a training
loop's ``except Exception`` (and ``on_corrupt="skip"``) would not catch. Whatever a flipped
byte does, a read gives the samples' own values or a ``FormatError`` naming the shard.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from simstore.formats import open_shard
from simstore.formats._lance import LanceFormat, LanceShardReader, _is_panic

from simstore.errors import FormatError
from simstore.ingest import ShardOptions
from simstore.sample import Sample


def _samples():
    rng = np.random.default_rng(3)
    return [
        Sample(f"s{i}", {"blob": rng.standard_normal(20000).astype(np.float32),
                         "fx": np.arange(4.0) + i, "zd": np.array(i)})
        for i in range(10)
    ]


PANICKING = (-494, -390, -322, -262, -200, -143)
"""Bytes (from the end of the shard :func:`_samples` makes with zstd) whose flip makes
pylance 1.x's decoders panic; flips at -521, -260 and -141 panic in a runtime thread
and abort the process (documented: keep ``verify`` on for Lance shards)."""

_FLIPS = r"""
import json, sys
import numpy as np
from simstore.errors import FormatError
from simstore.formats import open_shard

path, damaged, offsets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
raw = open(path, "rb").read()

def read_all(p):
    shard = open_shard(p)
    try:
        return [{k: np.asarray(v).tobytes() for k, v in r.items()}
                for r in shard.read(range(shard.num_samples))]
    finally:
        shard.close()

good = read_all(path)
out = []
for offset in offsets:
    flipped = bytearray(raw)
    flipped[offset] ^= 0x5A
    with open(damaged, "wb") as f:
        f.write(flipped)
    try:
        out.append(["same" if read_all(damaged) == good else "different", ""])
    except FormatError as exc:
        out.append(["FormatError", str(exc)])
    except BaseException as exc:
        out.append([type(exc).__name__, str(exc)])
print(json.dumps(out))
"""


def test_a_flipped_byte_that_makes_lance_panic_is_a_format_error(tmp_path):
    path = str(tmp_path / "shard.lance")
    LanceFormat(ShardOptions(compression="zstd")).write(_samples(), path)
    damaged = str(tmp_path / "damaged.lance")
    # in a child: a damaged Lance file can abort the process that reads it
    child = subprocess.run(
        [sys.executable, "-c", _FLIPS, path, damaged, json.dumps(list(PANICKING))],
        capture_output=True, text=True, env={**os.environ, "RUST_BACKTRACE": "0"},
        timeout=300, check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    outcomes = json.loads(child.stdout.strip().splitlines()[-1])
    assert len(outcomes) == len(PANICKING)
    for offset, (kind, message) in zip(PANICKING, outcomes, strict=True):
        assert kind in ("same", "FormatError"), (offset, kind, message)
        if kind == "FormatError":
            assert "damaged.lance" in message and "\n" not in message, (offset, message)


class _Panic(BaseException):
    """Stands in for pyo3's ``pyo3_runtime.PanicException`` (made only by a real panic)."""


_Panic.__module__ = "pyo3_runtime"
_Panic.__name__ = _Panic.__qualname__ = "PanicException"


def test_a_panic_in_a_read_is_a_one_line_format_error(tmp_path, monkeypatch):
    path = str(tmp_path / "shard.lance")
    LanceFormat().write(_samples(), path)
    shard = open_shard(path)
    assert _is_panic(_Panic()) and not _is_panic(KeyboardInterrupt())

    def panics(self, columns):
        raise _Panic("assertion `left == right` failed\n  left: 1\n right: 2")

    monkeypatch.setattr(LanceShardReader, "_reader", panics)
    with pytest.raises(FormatError, match=r"shard\.lance: read failed: .*left == right") as err:
        list(shard.read([0, 1]))
    assert "\n" not in str(err.value)
    with pytest.raises(FormatError, match=r"shard\.lance"):
        shard.keys()


def test_an_interrupt_during_a_read_is_not_taken_for_damage(tmp_path, monkeypatch):
    path = str(tmp_path / "shard.lance")
    LanceFormat().write(_samples(), path)
    shard = open_shard(path)

    def interrupted(self, columns):
        raise KeyboardInterrupt

    monkeypatch.setattr(LanceShardReader, "_reader", interrupted)
    with pytest.raises(KeyboardInterrupt):
        list(shard.read([0]))


def test_lance_errors_quoting_damaged_bytes_are_one_line(tmp_path, monkeypatch):
    path = str(tmp_path / "shard.lance")
    LanceFormat().write(_samples(), path)
    shard = open_shard(path)

    def fails(self, columns):
        raise OSError('failed to decode Protobuf message: got "\x07\n/lance.enc\x00"')

    monkeypatch.setattr(LanceShardReader, "_reader", fails)
    with pytest.raises(FormatError, match=r"shard\.lance: read failed: failed to decode") as err:
        list(shard.read([0]))
    assert str(err.value).isprintable()
