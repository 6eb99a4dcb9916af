"""A Lance shard opened from a file object that cannot be read leaves nothing behind.

Lance reads files by path, so a shard given as a file object (a remote store read
without a disk cache) is copied to a temporary folder first; a copy that fails to open
must go with the error, which names the object when the file object has a name.
"""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np
import pytest
from simstore.formats import open_shard
from simstore.formats._lance import LanceFormat

from simstore.errors import FormatError
from simstore.sample import Sample


@pytest.fixture
def damaged(tmp_path, monkeypatch):
    """A Lance shard's bytes with its footer damaged (magic kept); temp files in a folder."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    path = str(tmp_path / "shard.lance")
    LanceFormat().write(
        [Sample(f"k{i}", {"x": np.full(1000, i, np.float32)}) for i in range(4)], path
    )
    raw = bytearray((tmp_path / "shard.lance").read_bytes())
    raw[-40:-4] = b"\xff" * 36
    return bytes(raw), temp


def test_a_failed_open_removes_its_temporary_copy(damaged):
    raw, temp = damaged
    for _ in range(3):
        with pytest.raises(FormatError, match="not a readable Lance file"):
            open_shard(io.BytesIO(raw))
    assert os.listdir(temp) == []


def test_the_error_names_a_named_file_object(damaged, tmp_path):
    raw, temp = damaged
    path = tmp_path / "objects" / "ab12.lance"
    path.parent.mkdir()
    path.write_bytes(raw)
    with open(path, "rb") as f, pytest.raises(FormatError, match="ab12.lance"):
        open_shard(f)
    assert os.listdir(temp) == []


def test_a_good_shard_from_a_file_object_reads_and_cleans_up(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    path = str(tmp_path / "shard.lance")
    LanceFormat().write([Sample("k0", {"x": np.arange(5, dtype=np.float32)})], path)
    with open(path, "rb") as f:
        reader = open_shard(io.BytesIO(f.read()))
    assert len(os.listdir(temp)) == 1
    reader.close()
    assert os.listdir(temp) == []


def test_lance_shards_name_their_file_format_version(tmp_path, monkeypatch):
    """The file format is simstore's choice, not the library's default, which an upgrade
    may move (other bytes for the same samples, unreadable by older readers)."""
    import lance.file
    from simstore.formats import _lance

    path = str(tmp_path / "shard.lance")
    calls = []
    real = lance.file.LanceFileWriter

    def writer(*args, **kwargs):
        calls.append(kwargs.get("version"))
        return real(*args, **kwargs)

    monkeypatch.setattr(lance.file, "LanceFileWriter", writer)
    LanceFormat().write([Sample("k0", {"x": np.arange(5, dtype=np.float32)})], path)
    assert calls == [_lance.LANCE_FILE_VERSION] == ["2.2"]
    meta = lance.file.LanceFileReader(path).metadata()
    assert f"{meta.major_version}.{meta.minor_version}" == "2.2"
