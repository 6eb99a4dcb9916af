"""Crafted store content: objects under their true hashes, built to make a reader misbehave.

Random damage is caught by hashes and CRC-32s (test_rel_corruption); these objects pass
those checks. Each must be a one-line error naming the object, or be read as documented,
never a traceback or a reader that does not end.
"""

from __future__ import annotations

import io
import json
import resource
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main
from simstore.formats import ZarrFormat
from simstore.loaders import SimDataset

from simstore.catalog import Catalog
from simstore.errors import FormatError
from simstore.hashing import hash_bytes
from simstore.ingest import ShardOptions, ingest
from simstore.sample import Sample

DEEP = b"[" * 100_000 + b"]" * 100_000
"""JSON nested far deeper than Python's parser recurses."""


@pytest.fixture
def store(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.arange(4.0))
    Catalog.init(str(tmp_path / "store"))
    ingest([src], dataset="d", store=str(tmp_path / "store"), snapshot=True)
    return tmp_path / "store"


def _head(store):
    return store / "datasets" / "d" / "refs" / "heads" / "main"


def _put(store, data: bytes) -> str:
    oid = hash_bytes(data)
    path = store / "objects" / oid[:2] / oid
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return oid


def _one_line_error(args) -> str:
    r = CliRunner().invoke(main, args)
    assert r.exit_code not in (0, 1), (r.exit_code, r.output, r.exception)
    assert not isinstance(r.exception, RecursionError)
    (line,) = r.output.strip().splitlines()
    assert line.startswith("error: ")
    return line


def _with_deep(data: bytes) -> bytes:
    """A JSON object's bytes with one more member, nested 100,000 deep."""
    return data.rstrip()[:-1] + b',"x":' + DEEP + b"}"


def test_deep_json_in_a_ref_the_store_metadata_or_a_staging_entry_is_one_line(store):
    ref = _head(store)
    good_ref, meta = ref.read_bytes(), (store / "simstore.json").read_bytes()
    ref.write_bytes(_with_deep(good_ref))
    assert "ref " in _one_line_error(["--store", str(store), "log", "d@main"])
    ref.write_bytes(good_ref)

    (store / "simstore.json").write_bytes(_with_deep(meta))
    assert "simstore.json" in _one_line_error(["--store", str(store), "ls"])
    (store / "simstore.json").write_bytes(meta)

    staging = store / "datasets" / "d" / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    (staging / "01796455924316166160-b0c150ffbbd9").write_bytes(
        b'{"kind":"staging","format_version":1,"x":' + DEEP + b"}")
    assert "staging entry" in _one_line_error(["--store", str(store), "ls"])


def test_a_snapshot_of_deep_json_is_one_line_in_the_cli_and_the_loader(store):
    sid = json.loads(_head(store).read_bytes())["snapshot"]
    snap = (store / "objects" / sid[:2] / sid).read_bytes()
    crafted = _put(store, _with_deep(snap))
    _head(store).write_bytes(json.dumps({"format_version": 1, "snapshot": crafted}).encode())
    for command in (["log", "d@main"], ["show", "d@main"]):
        assert crafted in _one_line_error(["--store", str(store), *command])
    # verify lists what it found, the snapshot among its problems
    r = CliRunner().invoke(main, ["--store", str(store), "verify", "d@main"])
    assert r.exit_code not in (0, 1) and not isinstance(r.exception, RecursionError)
    assert f"snapshot {crafted} is not valid JSON" in r.output
    with pytest.raises(FormatError, match=f"snapshot {crafted} is not valid JSON"):
        SimDataset(str(store), "d")


def _bounded(script: str, gib: int = 6) -> subprocess.CompletedProcess[str]:
    """``script`` run in a process whose time and address space are bounded, so a reader
    that regresses fails this test instead of taking the machine's memory."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))

    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, preexec_fn=limit)


def _crafted_zarr_shard(tmp_path, edit) -> str:
    """A Zarr shard of one sample whose array ``u``'s zarr.json is passed through ``edit``."""
    path = str(tmp_path / "shard.zip")
    ZarrFormat(ShardOptions(compression="none")).write(
        [Sample("a", {"u": np.arange(64, dtype=np.float32).reshape(8, 8)})], path)
    with zipfile.ZipFile(path) as zin:
        entries = [(i.filename, zin.read(i)) for i in zin.infolist()]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as out:
        for name, data in entries:
            if name == "0/u/zarr.json":
                data = edit(data)
            out.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return path


def _bomb(shape, chunks):
    def edit(data):
        meta = json.loads(data)
        meta["shape"] = shape
        meta["chunk_grid"]["configuration"]["chunk_shape"] = chunks
        return json.dumps(meta).encode()

    return edit


def _refusal_of_u(path: str, gib: int = 6) -> str:
    """The FormatError a bounded process gets reading field ``u`` of the shard at ``path``
    (the bounds only stop a reader that does not end or takes the machine's memory)."""
    done = _bounded(textwrap.dedent(f"""
        from simstore.errors import FormatError
        from simstore.formats import ZarrFormat
        reader = ZarrFormat().open({path!r})
        try:
            list(reader.read([0], fields=["u"]))
        except FormatError as exc:
            print(exc)
    """), gib)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_array_of_deep_json_metadata_is_a_format_error(tmp_path):
    path = _crafted_zarr_shard(tmp_path, _with_deep)
    reader = ZarrFormat().open(path)
    try:
        with pytest.raises(FormatError, match="0/u/zarr.json is not JSON"):
            list(reader.read([0], fields=["u"]))
    finally:
        reader.close()


def test_a_chunk_grid_of_two_to_the_forty_cells_is_counted_by_the_entries_it_has(tmp_path):
    """The first read of an unchecked shard counts the chunk bytes it will check; a shape
    declaring 2^40 one-element chunks made that count walk them all (it never ended)."""
    path = _crafted_zarr_shard(tmp_path, _bomb([2**20, 2**20 + 1], [1, 1]))
    with zipfile.ZipFile(path) as z:
        stored = sum(i.compress_size for i in z.infolist() if i.filename.startswith("0/u/c"))
    script = textwrap.dedent(f"""
        from simstore.formats import ZarrFormat
        reader = ZarrFormat().open({path!r})
        print(reader.checked_bytes([0], ["u"]))
        reader.close()
    """)
    # the timeout only stops a reader that does not end; it measures nothing
    done = _bounded(script)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == stored > 0


def test_a_json_field_value_of_deep_json_is_a_format_error_naming_the_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from simstore.formats import ParquetFormat

    path = str(tmp_path / "shard.parquet")
    ParquetFormat(ShardOptions(compression="none")).write(
        [Sample("a", {"meta": {"solver": "x"}, "u": np.arange(3.0)})], path)
    table = pq.read_table(path)
    i = table.schema.get_field_index("meta")
    deep = pa.array([DEEP.decode()], type=table.schema.field(i).type)
    pq.write_table(table.set_column(i, table.schema.field(i), deep), path,
                   write_page_checksum=True)
    reader = ParquetFormat().open(path)
    try:
        assert list(reader.read([0], fields=["u"]))[0]["u"].tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(FormatError, match="field 'meta' holds a value that is not readable"):
            list(reader.read([0], fields=["meta"]))
    finally:
        reader.close()


def test_a_journal_record_of_deep_json_is_no_record(tmp_path):
    """A re-run reads the file again instead of failing on the record."""
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.arange(4.0))
    cat = Catalog.init(str(tmp_path / "store"))
    ingest([src], dataset="d", store=cat, snapshot=True)
    records = [p for p in (tmp_path / "store" / "journal" / "d").iterdir()
               if not p.name.startswith("task-")]
    for record in records:
        record.write_bytes(_with_deep(record.read_bytes()))
    again = ingest([src], dataset="d", store=cat, snapshot=True)
    assert again.files_reused == 0 and again.files_ingested == 1


def test_a_gc_record_of_deep_json_counts_as_a_gc_that_may_be_running():
    from simstore.catalog._gc import gc_overlapped

    record = b'{"state":"done","x":' + DEEP + b"}"
    assert gc_overlapped(record, record)  # unreadable: the worst assumed, a check made
    assert not gc_overlapped(b'{"state":"done"}', b'{"state":"done"}')


def test_a_price_table_nested_too_deeply_is_one_line(tmp_path, store):
    from simstore.cost import parse_price_table

    text = "format_version = 1\na = " + "[" * 100_000 + "]" * 100_000 + "\n"
    prices = tmp_path / "prices.toml"
    prices.write_text(text)
    line = _one_line_error(["--store", str(store), "cost", "d", "--prices", str(prices)])
    assert "prices.toml is not valid TOML: nested too deeply" in line
    # the same text given to the library
    with pytest.raises(FormatError, match="prices is not valid TOML: nested too deeply"):
        parse_price_table(text, origin="prices")


def test_reading_an_array_of_more_chunks_than_the_shard_holds_is_refused_at_once(tmp_path):
    """A sample read walked and allocated the declared grid (14 GB resident and still
    going after two minutes for 2^40 chunks); the count is checked before anything."""
    path = _crafted_zarr_shard(tmp_path, _bomb([2**20, 2**20 + 1], [1, 1]))
    assert _refusal_of_u(path).endswith(
        f"array 0/u declares {2**40 + 2**20} chunks; the shard holds 4 entries in all: "
        "its metadata is damaged")


def test_chunks_that_do_not_fit_their_metadata_are_a_format_error_naming_the_field(tmp_path):
    path = _crafted_zarr_shard(tmp_path, _bomb([8, 8], [4, 4]))  # one 8 x 8 chunk stored
    reader = ZarrFormat().open(path)
    try:
        with pytest.raises(FormatError, match=r"sample at position 0: field 'u': cannot reshape"):
            list(reader.read([0], fields=["u"]))
    finally:
        reader.close()


def test_a_zip_entry_declaring_more_bytes_than_the_shard_has_is_refused_unread(tmp_path):
    """Its bytes were read into memory of the declared size (4 GiB here, up to 2^64
    through zip64) before the short read was noticed: a MemoryError with no message."""
    path = _crafted_zarr_shard(tmp_path, lambda data: data)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    name = b"0/u/c/0/0"
    record = data.find(b"PK\x01\x02")  # the central directory's first record
    while record >= 0:
        n = int.from_bytes(data[record + 28 : record + 30], "little")
        if data[record + 46 : record + 46 + n] == name:
            break
        record = data.find(b"PK\x01\x02", record + 4)
    assert record >= 0
    data[record + 20 : record + 24] = (0xFFFFFFFE).to_bytes(4, "little")  # compressed size
    with open(path, "wb") as f:
        f.write(bytes(data))
    refused = _refusal_of_u(path, gib=3)  # less than the declared size plus the interpreter
    assert f"zip entry 0/u/c/0/0 declares {0xFFFFFFFE} bytes at byte" in refused
    assert "past the end of the shard" in refused


@pytest.mark.parametrize("value", [b"1" * 5000, b"NaN", b"-Infinity"])
def test_a_snapshot_with_a_huge_integer_or_a_nan_is_one_line(store, value):
    sid = json.loads(_head(store).read_bytes())["snapshot"]
    snap = json.loads((store / "objects" / sid[:2] / sid).read_bytes())
    text = json.dumps({**snap, "created": "@"}).encode().replace(b'"@"', value)
    crafted = _put(store, text)
    _head(store).write_bytes(json.dumps({"format_version": 1, "snapshot": crafted}).encode())
    line = _one_line_error(["--store", str(store), "log", "d@main"])
    assert f"snapshot {crafted} is not valid JSON" in line
    with pytest.raises(FormatError, match=f"snapshot {crafted} is not valid JSON"):
        SimDataset(str(store), "d")


def test_a_numeric_column_stored_as_another_type_than_its_plan_is_refused(tmp_path):
    """An int64 field's column written as float64 (2.7, -3.9, 1e300) was cast to int64
    when read: 2, -3 and the int64 minimum, without a word."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from simstore.formats import ParquetFormat

    path = str(tmp_path / "shard.parquet")
    ParquetFormat(ShardOptions(compression="none")).write(
        [Sample(f"k{i}", {"s": i, "u": np.arange(3.0)}) for i in range(3)], path)
    table = pq.read_table(path)
    i = table.schema.get_field_index("s")
    assert table.schema.field(i).type == pa.int64()
    table = table.set_column(i, pa.field("s", pa.float64()), pa.array([0.0, 2.7, 1e300]))
    pq.write_table(table, path, compression="none", store_schema=True)
    with pytest.raises(FormatError, match="column 's' is stored as double, where its plan "
                                          "says int64"):
        ParquetFormat().open(path)
