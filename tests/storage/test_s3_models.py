"""The per-user cache of botocore's parsed data files (simstore.storage._s3_models)."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

from simstore.storage import _s3_models


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "models"
    monkeypatch.setenv(_s3_models.ENV, str(directory))
    return directory


def data_file(tmp_path: Path, data: Any) -> str:
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps(data))
    return str(path)


def parser(path: str, calls: list[str]) -> Any:
    def parse() -> Any:
        calls.append(path)
        with open(path, "rb") as f:
            return json.loads(f.read())

    return parse


def test_a_parsed_file_is_read_back_from_the_cache(cache: Path, tmp_path: Path) -> None:
    data = {"partitions": [{"services": {"s3": {"endpoints": {"us-east-1": {}}}}}],
            "version": 3, "x": [1.5, None, True, "é"]}
    path = data_file(tmp_path, data)
    calls: list[str] = []
    assert _s3_models.load(path, parser(path, calls)) == data
    assert calls == [path]
    entries = list(cache.iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".marshal"
    assert (cache.stat().st_mode & 0o777) == 0o700  # private to the user
    assert _s3_models.load(path, parser(path, calls)) == data
    assert calls == [path]  # the second load did not parse


def test_an_edited_file_gets_a_new_entry(cache: Path, tmp_path: Path) -> None:
    path = data_file(tmp_path, {"v": 1})
    calls: list[str] = []
    assert _s3_models.load(path, parser(path, calls)) == {"v": 1}
    data_file(tmp_path, {"v": 22})  # another size (and mtime): another entry
    assert _s3_models.load(path, parser(path, calls)) == {"v": 22}
    assert len(calls) == 2 and len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_entry_is_parsed_again_and_replaced(
    damage: str, cache: Path, tmp_path: Path
) -> None:
    path = data_file(tmp_path, {"services": list(range(100))})
    calls: list[str] = []
    _s3_models.load(path, parser(path, calls))
    (entry,) = cache.iterdir()
    blob = bytearray(entry.read_bytes())
    if damage == "flip":
        blob[-5] ^= 0x40
    elif damage == "truncate":
        del blob[len(blob) // 2 :]
    else:
        blob.clear()
    entry.write_bytes(bytes(blob))
    assert _s3_models.load(path, parser(path, calls)) == {"services": list(range(100))}
    assert len(calls) == 2
    assert _s3_models.load(path, parser(path, calls)) == {"services": list(range(100))}
    assert len(calls) == 2  # rewritten whole by the second load


def test_off_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_s3_models.ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = data_file(tmp_path, {"v": 1})
    calls: list[str] = []
    assert _s3_models.load(path, parser(path, calls)) == {"v": 1}
    assert _s3_models.load(path, parser(path, calls)) == {"v": 1}
    assert len(calls) == 2 and not (tmp_path / "xdg").exists()


def test_default_directory_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_s3_models.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _s3_models.cache_directory() == str(tmp_path / "xdg" / "simstore" / "botocore")


def test_a_cache_path_that_is_a_file_still_loads(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv(_s3_models.ENV, str(blocker))
    path = data_file(tmp_path, {"v": 1})
    calls: list[str] = []
    assert _s3_models.load(path, parser(path, calls)) == {"v": 1}
    assert blocker.read_text() == "x" and calls == [path]


def test_gc_paused_restores_the_collector() -> None:
    assert gc.isenabled()
    with _s3_models.gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with _s3_models.gc_paused():
            pass
        assert not gc.isenabled()  # it was off: it stays off
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), _s3_models.gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_many_threads_filling_one_entry_leave_one_valid_entry(cache: Path, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    data = {"partitions": [{"region": f"r{i}", "v": list(range(200))} for i in range(200)]}
    path = data_file(tmp_path, data)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: _s3_models.load(path, parser(path, [])), range(32)))
    assert all(g == data for g in got)
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 1 and entries[0].endswith(".marshal")  # no temporary left
    calls: list[str] = []
    assert _s3_models.load(path, parser(path, calls)) == data and calls == []
