"""Lance shards of fields whose names Lance refuses as column names (``velocity.units``).

The source adapters name an array's attribute ``<array>.<attr>``, and Lance refuses a
top-level column name with a ``.``; the Lance writer stores such a field under an escaped
column name (``%`` and the characters Lance cannot take as ``%XX``) and the reader gives
it back under its real name.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import h5py
import lance.file
import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from simstore.cli import main
from simstore.formats import LanceFormat, open_shard
from simstore.formats._arrow import KEY_COLUMN, arrow_schema, encode_table, plan_columns
from simstore.formats._lance import column_name, field_name
from simstore.formats.testing import example_samples
from simstore.loaders import SimDataset

from simstore.catalog import Catalog
from simstore.errors import FormatError
from simstore.ingest import ShardOptions, parse_compression
from simstore.sample import Sample

TRICKY = [
    "velocity.units",
    "velocity.scale",
    "a.b.c",
    "p%2Ex",  # looks like an escaped "p.x"
    "p.x",
    "100%",
    "%",
    "%%2E.",
    "tick`name",
    "nul\x00name",
    "grid/x",
    "plain",
    "Re",
]


@pytest.mark.parametrize("name", TRICKY)
def test_column_names_round_trip_and_need_no_dot(name):
    col = column_name(name)
    assert field_name(col) == name
    assert urllib.parse.unquote(col) == name  # what docs/format-shards.md tells stock users
    assert not set(col) & {".", "`", "\x00"}
    if not set(name) & {".", "%", "`", "\x00"}:
        assert col == name  # nothing to escape: the column is the field name


def test_escaped_column_names_are_distinct():
    assert len({column_name(n) for n in TRICKY}) == len(TRICKY)
    assert column_name("p.x") == "p%2Ex"
    assert column_name("p%2Ex") == "p%252Ex"  # the escape character is escaped too


def _old_lance_write(samples, path, options):
    """The Lance writer as it was before names were escaped (one row group, no escaping)."""
    codec, _ = parse_compression(options.compression)
    plans = plan_columns(samples, shuffle=codec == "shuffle-zstd", fixed_bytes=64 << 10)
    meta = {b"lance-encoding:compression": b"none" if codec == "none" else b"zstd"}
    schema = arrow_schema(plans, None, tensor_extension=False, field_metadata=meta)
    writer = lance.file.LanceFileWriter(path, schema)
    writer.write_batch(encode_table(samples, plans, schema))
    writer.close()


@pytest.mark.parametrize("compression", ["none", "zstd:1", "shuffle-zstd:1"])
def test_shards_of_plain_names_keep_their_bytes(tmp_path, compression):
    options = ShardOptions(compression=compression, row_group_bytes=1 << 30)
    samples = example_samples()
    LanceFormat(options).write(samples, str(tmp_path / "new.lance"))
    _old_lance_write(samples, str(tmp_path / "old.lance"), options)
    assert (tmp_path / "new.lance").read_bytes() == (tmp_path / "old.lance").read_bytes()


def _dotted_samples():
    rng = np.random.default_rng(1)
    return [
        Sample(
            f"s{i}",
            {
                "velocity": rng.standard_normal((3, 4)).astype(np.float32),
                "velocity.units": "m/s",
                "velocity.scale": 2.0 + i,
                "p%2Ex": np.arange(i + 1, dtype=np.int32),
                "p.x": np.full(5, i, dtype=np.float64),
                "100%": f"pct{i}",
                "tick`name": i,
            },
        )
        for i in range(4)
    ]


def test_dotted_fields_write_read_and_project(tmp_path):
    samples = _dotted_samples()
    path = str(tmp_path / "s.lance")
    LanceFormat().write(samples, path)
    reader = open_shard(path)
    assert [s.name for s in reader.schema] == sorted(samples[0].fields)
    assert reader.keys() == [s.key for s in samples]
    for got, want in zip(reader.read(range(4)), samples, strict=True):
        assert set(got) == set(want.fields)
        for k, v in want.fields.items():
            np.testing.assert_array_equal(got[k], v)
    # projections, in order, shuffled and repeated positions, and with out=
    got = list(reader.read([3, 0, 3], fields=["velocity.units", "p.x", "p%2Ex", "nope"]))
    assert [set(g) for g in got] == [{"velocity.units", "p.x", "p%2Ex"}] * 3
    assert [g["p%2Ex"].tolist() for g in got] == [[0, 1, 2, 3], [0], [0, 1, 2, 3]]
    assert [g["p.x"][0] for g in got] == [3.0, 0.0, 3.0]
    bufs = {}

    def out(i, name, shape, dtype):
        bufs[i, name] = np.empty(shape, dtype)
        return bufs[i, name]

    got = list(reader.read([1, 2], fields=["velocity"], out=out))
    np.testing.assert_array_equal(bufs[0, "velocity"], samples[1].fields["velocity"])
    assert got[1]["velocity"] is bufs[1, "velocity"]
    reader.close()
    # a stock lance reader gets the escaped columns, which unquote maps back
    table = lance.file.LanceFileReader(path).read_all().to_table()
    names = [urllib.parse.unquote(n) for n in table.column_names]
    assert names == [KEY_COLUMN, *sorted(samples[0].fields)]
    assert "velocity%2Eunits" in table.column_names and "p%252Ex" in table.column_names
    col = table.column(column_name("velocity.scale")).to_pylist()
    assert col == [s.fields["velocity.scale"] for s in samples]


def test_a_shard_written_before_escaping_still_reads(tmp_path):
    """A field name with a ``%`` but no ``.`` was stored as it is: it still reads."""
    samples = [Sample(f"s{i}", {"100%": i, "p%2Ex": f"v{i}", "u": float(i)}) for i in range(3)]
    path = str(tmp_path / "old.lance")
    _old_lance_write(samples, path, ShardOptions())
    reader = open_shard(path)
    assert list(reader.read([2, 0], fields=["p%2Ex", "100%"])) == [
        {"p%2Ex": "v2", "100%": 2},
        {"p%2Ex": "v0", "100%": 0},
    ]
    assert list(reader.read([1])) == [{"100%": 1, "p%2Ex": "v1", "u": 1.0}]


def test_a_column_that_names_no_field_is_refused(tmp_path):
    samples = [Sample("a", {"x.y": 1})]
    path = str(tmp_path / "s.lance")
    LanceFormat().write(samples, path)
    table = lance.file.LanceFileReader(path).read_all().to_table()
    bad = pa.schema(
        [table.schema.field(0), table.schema.field(1).with_name("other")],
        metadata=table.schema.metadata,
    )
    writer = lance.file.LanceFileWriter(str(tmp_path / "bad.lance"), bad)
    writer.write_batch(pa.Table.from_arrays(table.columns, schema=bad))
    writer.close()
    with pytest.raises(FormatError, match="other"):
        open_shard(str(tmp_path / "bad.lance"))


def _h5_source(root):
    """An HDF5 file whose arrays and root carry attributes (fields named ``array.attr``)."""
    root.mkdir()
    rng = np.random.default_rng(0)
    with h5py.File(root / "run.h5", "w") as f:
        v = f.create_dataset("velocity", data=rng.standard_normal((4, 3, 2)).astype(np.float32))
        v.attrs["units"] = "m/s"
        v.attrs["scale"] = 2.0
        v.attrs["100%"] = "percent"  # the escape character in a field name
        v.attrs["tick`mark"] = 7
        p = f.create_dataset("p%2Ex", data=np.arange(5, dtype=np.int64))
        p.attrs["units"] = "Pa"
        f.create_dataset("p.x", data=np.linspace(0, 1, 6))
        f.attrs["Re"] = 250.0
        f.attrs["solver"] = "demo-solver"
        f.attrs["mesh.kind"] = "cartesian"
    expected = {
        "velocity": None,
        "velocity.units": "m/s",
        "velocity.scale": 2.0,
        "velocity.100%": "percent",
        "velocity.tick`mark": 7,
        "p%2Ex": np.arange(5, dtype=np.int64),
        "p%2Ex.units": "Pa",
        "p.x": np.linspace(0, 1, 6),
        "Re": 250.0,
        "solver": "demo-solver",
        "mesh.kind": "cartesian",
    }
    with h5py.File(root / "run.h5", "r") as f:
        expected["velocity"] = f["velocity"][()]
    return expected


def _value(v):
    return v.numpy() if hasattr(v, "numpy") else v


@pytest.mark.parametrize("fmt", ["lance", "parquet"])
def test_cli_ingest_of_hdf5_attributes_reads_back_with_simdataset(tmp_path, fmt):
    expected = _h5_source(tmp_path / "src")
    store = str(tmp_path / "store")
    Catalog.init(store)
    result = CliRunner().invoke(
        main,
        ["--store", store, "ingest", str(tmp_path / "src"), "--dataset", "d", "--format", fmt,
         "--snapshot", "-m", "x", "--no-progress"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    (sample,) = list(SimDataset(store, "d", shuffle=False))
    got = {k: _value(v) for k, v in sample.items() if k not in ("__key__", "__pad__")}
    assert set(got) == set(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    (only,) = list(SimDataset(store, "d", fields=["velocity.units", "p%2Ex", "p.x"]))
    assert set(only) - {"__key__", "__pad__"} == {"velocity.units", "p%2Ex", "p.x"}
    assert only["velocity.units"] == "m/s"
    np.testing.assert_array_equal(_value(only["p%2Ex"]), expected["p%2Ex"])
    np.testing.assert_array_equal(_value(only["p.x"]), expected["p.x"])


def _documented_lance_recipe() -> str:
    """The stock-lance reading recipe of docs/format-shards.md, as written there."""
    here = Path(__file__).resolve().parents[2] / "docs" / "format-shards.md"
    blocks = re.findall(r"```python\n(.*?)```", here.read_text(), flags=re.S)
    (recipe,) = [b for b in blocks if "lance.file.LanceFileReader" in b]
    return recipe


@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_the_documented_stock_lance_recipe_reads_every_kind_back(tmp_path, dtype):
    # bool: pyarrow converts a bool array to NumPy only as a copy (zero_copy_only=False)
    rng = np.random.default_rng(5)
    velocity = (rng.standard_normal((2, 3)) > 0).astype(dtype)
    pressure = rng.standard_normal((100, 200)).astype(np.float32)  # 78 KiB: a blob
    sample = Sample("run0", {"velocity": velocity, "velocity.units": "m/s",
                             "pressure": pressure})
    for compression in ("none", "shuffle-zstd"):
        path = str(tmp_path / f"{compression}.lance")
        LanceFormat(ShardOptions(compression=compression)).write([sample], path)
        scope: dict = {"path": path}
        exec(_documented_lance_recipe(), scope)
        assert scope["units"] == "m/s"
        np.testing.assert_array_equal(scope["velocity"], velocity)
        np.testing.assert_array_equal(scope["pressure"], pressure)
        shuffled = {c["name"]: c for c in scope["meta"]["columns"]}["pressure"]["shuffle"]
        assert bool(shuffled) == (compression == "shuffle-zstd")
