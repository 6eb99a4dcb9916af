"""Bad command lines: one ``error:`` line on stderr naming the command or flag, exit 2.

Click printed a four-line usage block (Usage, Try --help, a blank line, Error) for an
unknown option or a bad value; library errors about a flag's value named the library's
parameter (``max_workers``, ``time_window``) or no option at all (``invalid size 'x'``);
and ``--store FILE init`` failed on ``FILE/simstore.json`` with "File exists" (exit 10).
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from cli_helpers import cli
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import SimstoreError


@pytest.fixture
def store():
    url = f"memory://usage-{uuid.uuid4().hex}"
    Catalog.init(url)
    return url


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, fields=np.ones((2, 3), np.float32))
    return str(path)


# -- click's usage errors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["ingest", "SRC", "--dataset", "d", "--wokers", "3"],
         ["simstore ingest: no such option", "--wokers"]),
        (["ingest", "SRC", "--dataset", "d", "--workers", "x"],
         ["simstore ingest: invalid value for '--workers': 'x' is not a valid integer"]),
        (["ingest", "SRC", "--dataset", "d", "--on-error", "maybe"],
         ["simstore ingest: invalid value for '--on-error'", "'maybe'"]),
        (["ingest", "SRC", "--dataset", "d", "--option", "x"],
         ["simstore ingest: invalid value for --option: 'x': expected key=value"]),
        (["ingest", "SRC"], ["simstore ingest: missing option '--dataset'"]),
        (["ingest"], ["simstore ingest: missing argument 'SOURCES...'"]),
        (["log", "ds", "-n"], ["simstore log: option '-n' requires an argument"]),
        (["log", "ds", "-n", "x"], ["simstore log: invalid value for '-n' / '--limit'"]),
        (["log"], ["simstore log: missing argument 'REF'"]),
        (["init", "extra"], ["simstore init: got unexpected extra argument (extra)"]),
        (["nosuch"], ["simstore: no such command 'nosuch'"]),
        (["--bogus", "ls"], ["simstore: no such option", "--bogus"]),
        (["--storage-option", "x", "ls"],
         ["simstore: invalid value for --storage-option: 'x': expected key=value"]),
        (["cost", "ds", "--last", "x"], ["simstore cost: invalid value for '--last'"]),
        (["pull", "ds", "--cache", "C", "--jobs", "1.5"],
         ["simstore pull: invalid value for '--jobs'"]),
    ],
)  # fmt: skip
def test_a_usage_error_is_one_line_naming_the_command_and_the_flag(store, args, words):
    line = cli("--store", store, *args, code=2)
    for w in words:
        assert w in line


def test_a_bad_directory_option_is_one_line(store, tmp_path):
    (tmp_path / "f").write_text("x")
    line = cli("--store", store, "pull", "ds", "--cache", str(tmp_path / "f"), code=2)
    assert line.startswith("error: simstore pull: invalid value for '--cache'")


def test_help_is_unchanged():
    out = cli("ingest", "--help", code=0)
    assert out.startswith("Usage: simstore ingest [OPTIONS] SOURCES...")
    assert "--shard-size" in out and len(out.splitlines()) > 20
    top = cli("--help", code=0)
    assert "Commands:" in top and "ingest" in top


def test_simstore_alone_still_prints_the_help():
    result = CliRunner().invoke(main, [], catch_exceptions=False)
    assert "Usage:" in result.output and "Commands:" in result.output
    assert "error:" not in result.output


# -- --store that is a file ------------------------------------------------------------


@pytest.mark.parametrize("form", ["path", "file-url"])
def test_init_on_a_regular_file_is_refused_and_leaves_it_alone(tmp_path, form):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"keep me")
    url = str(path) if form == "path" else f"file://{path}"
    line = cli("--store", url, "init", code=2)
    assert line == f"error: --store {url}: {path} is a file, not a store directory"
    assert path.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_store_under_a_file_names_the_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"keep me")
    line = cli("--store", str(path / "store"), "init", code=2)
    assert line == f"error: --store {path / 'store'}: {path} is a file, not a directory"
    assert path.read_bytes() == b"keep me"


def test_a_trailing_slash_or_a_dangling_link_is_refused_too(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"keep me")
    line = cli("--store", f"{path}/", "init", code=2)
    assert line == f"error: --store {path}/: {path} is a file, not a store directory"
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    line = cli("--store", str(tmp_path / "link"), "init", code=2)
    assert line == f"error: --store {tmp_path / 'link'}: {tmp_path / 'link'} is not a directory"
    assert path.read_bytes() == b"keep me" and not (tmp_path / "gone").exists()


def test_other_commands_on_a_file_say_the_same(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"keep me")
    assert "is a file, not a store directory" in cli("--store", str(path), "ls", code=2)
    line = cli("ls", code=2, env={"SIMSTORE_STORE": str(path)})
    assert line == f"error: SIMSTORE_STORE={path}: {path} is a file, not a store directory"


def test_init_still_creates_a_store_in_a_new_or_empty_directory(tmp_path):
    assert "initialised" in cli("--store", str(tmp_path / "new" / "store"), "init", code=0)
    (tmp_path / "empty").mkdir()
    assert "initialised" in cli("--store", str(tmp_path / "empty"), "init", code=0)


# -- a bad flag value names the flag ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "invalid --workers 0: must be at least 1"),
        (["--workers", "-2"], "invalid --workers -2: must be at least 1"),
        (["--time-window", "0"], "invalid --time-window 0: must be at least 1"),
        (["--time-window", "2", "--stride", "0"], "invalid --stride 0: must be at least 1"),
        (["--stride", "2"], "--stride needs --time-window"),
        (["--address", "tcp://127.0.0.1:1"],
         "--address tcp://127.0.0.1:1 names a dask scheduler: it needs engine='dask' (--engine dask)"),
        (["--compression", "foo"], "--compression: invalid compression 'foo'"),
        (["--compression", "zstd:99"], "--compression: invalid compression level 99"),
        (["--format", "foo"], "invalid --format 'foo': installed: "),
        (["--adapter", "foo"], "invalid --adapter 'foo': installed: "),
        (["--shard-size", "1XB"], "--shard-size: invalid size '1XB': unknown unit 'XB'"),
        (["--shard-size", "0.5"], "--shard-size: invalid size '0.5': must be positive, got 0 bytes"),
        (["--shard-size", "-1KB"], "--shard-size: invalid size '-1KB': a size cannot be negative"),
        (["--piece-size", "inf"], "--piece-size: invalid size 'inf': not a finite number"),
        (["--chunk-bytes", "lots"], "--chunk-bytes: invalid size 'lots': not a size"),
        (["--dense-threshold", ""], "--dense-threshold: invalid size '': empty"),
        (["--zarr-threshold", "0"], "--zarr-threshold: invalid size '0': must be positive"),
    ],
)  # fmt: skip
def test_bad_ingest_flags_are_named(store, source, args, message):
    line = cli("--store", store, "ingest", source, "--dataset", "d", *args, code=2)
    assert message in line
    assert Catalog.open(store).staged("d") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["log", "ds", "-n", "-1"], "invalid -n/--limit -1: must be at least 0"),
        (["cost", "ds", "--last", "0"], "invalid --last 0: must be at least 1"),
        (["pull", "ds", "--cache", "C", "--jobs", "0"], "invalid --jobs 0: must be at least 1"),
        (["pull", "ds", "--cache", "C", "--limit", "-1"],
         "--limit: invalid size '-1': a size cannot be negative"),
        (["pull", "ds", "--cache", "C", "--limit", "2XB"],
         "--limit: invalid size '2XB': unknown unit 'XB'"),
        (["pull", "ds", "--cache", "C", "--fields", ","], "invalid --fields ',': an empty field"),
        (["pull", "ds", "--cache", "C", "--fields", "u,,p"], "invalid --fields 'u,,p'"),
        (["prices", "--price", "x"], "invalid price override --price 'x': expected TIER.FIELD="),
        (["prices", "--price", "=1"], "invalid price override --price '=1'"),
        (["gc", "--grace", "soon"], "--grace: invalid duration 'soon'"),
        (["gc", "--grace", "-1h"], "--grace: invalid duration '-1h'"),
        # an empty --cache was the working folder to du, a folder named "" to pull (exit 10)
        (["pull", "ds", "--cache", ""], "invalid value for '--cache': an empty path"),
        (["du", "--cache", ""], "invalid value for '--cache': an empty path"),
        (["cost", "--run", ""], "invalid value for '--run': an empty path"),
    ],
)  # fmt: skip
def test_bad_flags_of_other_commands_are_named(store, tmp_path, args, message):
    args = [str(tmp_path / "cache") if a == "C" else a for a in args]
    assert message in cli("--store", store, *args, code=2)
    assert not (tmp_path / "cache").exists()


# -- size flags follow the one rule ----------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("--shard-size", "shard_size"),
        ("--piece-size", "piece_bytes"),
        ("--chunk-bytes", "chunk_bytes"),
        ("--dense-threshold", "dense_threshold"),
        ("--zarr-threshold", "zarr_threshold"),
    ],
)
@pytest.mark.parametrize(
    ("text", "size"), [("1KB", 1000), ("1KiB", 1024), ("1k", 1024), ("2.5MB", 2_500_000)]
)
def test_ingest_size_flags_follow_the_rule(store, source, monkeypatch, flag, field, text, size):
    seen = {}

    def fake_ingest(sources, *, dataset, store, config, progress):
        seen["config"] = config
        raise SimstoreError("stop here")

    monkeypatch.setattr("simstore.cli._ingest.ingest", fake_ingest)
    cli("--store", store, "ingest", source, "--dataset", "d", flag, text, code=1)
    assert getattr(seen["config"], field) == size


@pytest.mark.parametrize(("text", "size"), [("1KB", 1000), ("1KiB", 1024), ("3gb", 3 * 10**9)])
def test_pull_limit_follows_the_rule(store, tmp_path, monkeypatch, text, size):
    seen = {}

    def fake_warm_cache(catalog, ref, cache_dir, opener, *, limit_bytes, fields, max_workers):
        seen["limit"] = limit_bytes
        raise SimstoreError("stop here")

    monkeypatch.setattr("simstore.cli._cost.warm_cache", fake_warm_cache)
    cli("--store", store, "pull", "ds", "--cache", str(tmp_path / "c"), "--limit", text, code=1)
    assert seen["limit"] == size


def test_credentials_and_names_in_storage_options_stay_text():
    # an access key of digits (a MinIO user's) is a key, not a number; tuning stays typed
    from simstore.cli._common import parse_storage_options

    got = parse_storage_options((
        "key=12345678", "secret=007", "token=true", "region_name=1", "max_attempts=3",
        "anon=true", "multipart_part_bytes=6e6",
    ))
    assert got == {"key": "12345678", "secret": "007", "token": "true", "region_name": "1",
                   "max_attempts": 3, "anon": True, "multipart_part_bytes": 6e6}


def test_python_spelled_booleans_in_storage_options_are_booleans():
    # the docs show anon=True; as text it was refused (anon must be True or False)
    from simstore.cli._common import parse_storage_options

    got = parse_storage_options(("anon=True", "use_ssl=False", "conditional_writes=false",
                                 "key=True"))
    assert got == {"anon": True, "use_ssl": False, "conditional_writes": False, "key": "True"}
