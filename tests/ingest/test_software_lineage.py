"""An ingest's lineage names the versions its files were read and written with.

Equal samples give equal shard bytes for one set of versions, not across them (a Parquet
file names the pyarrow that wrote it), so a snapshot says which simstore, NumPy, pyarrow,
xxhash, Python, shard-format and adapter libraries wrote its files: those of the process
that read each file, or those its journal record kept when a re-run reused it.
"""

import json
import os
import platform
from importlib import metadata

import h5py
import numpy as np
from click.testing import CliRunner
from simstore.cli import main

from simstore.ingest._driver import _joined_software
from simstore.ingest._records import FileResult
from simstore.ingest._software import libraries_of, software
from simstore.ingest._stage import software_sets as _software_sets


def _cli(store, *args):
    result = CliRunner().invoke(main, ["--store", store, *args])
    assert result.exit_code == 0, result.output
    return result.output


def _written_with(store, ref="d@main"):
    return json.loads(_cli(store, "show", ref, "--json"))["software"]


def test_a_snapshot_names_the_versions_of_its_adapter_and_format(tmp_path):
    store = str(tmp_path / "store")
    _cli(store, "init")
    src = tmp_path / "src"
    src.mkdir()
    with h5py.File(src / "run.h5", "w") as f:
        f["u"] = np.arange(12, dtype=np.float32).reshape(3, 4)
    _cli(store, "ingest", str(src), "--dataset", "d", "--format", "lance", "--snapshot",
         "-m", "x", "--no-progress")
    [versions] = _written_with(store)
    for name in ("simstore", "numpy", "pyarrow", "xxhash", "h5py", "pylance", "numcodecs"):
        assert versions[name] == metadata.version(name), name
    assert versions["python"] == platform.python_version()
    assert "meshio" not in versions and "gmsh" not in versions  # only what wrote the files
    shown = _cli(store, "show", "d@main")
    assert f"written with  simstore {metadata.version('simstore')}, python " in shown
    assert f"h5py {metadata.version('h5py')}" in shown


def test_every_shard_format_names_numcodecs():
    """Zarr chunks are compressed by numcodecs, Parquet and Lance blobs byte-shuffled by it:
    its version is one their bytes depend on."""
    from simstore.formats import LanceFormat, ParquetFormat, ZarrFormat

    for fmt in (ParquetFormat, LanceFormat, ZarrFormat):
        assert "numcodecs" in libraries_of(fmt()), fmt.name


def test_a_reused_journal_record_keeps_the_versions_that_wrote_its_shards(tmp_path):
    store = str(tmp_path / "store")
    _cli(store, "init")
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", u=np.zeros(4, np.float32))
    np.savez(src / "b.npz", u=np.ones(4, np.float32))
    np.savez(src / "z.npz", u=np.zeros(4, np.int64))  # breaks the schema: the run fails
    failed = CliRunner().invoke(main, ["--store", store, "ingest", str(src), "--dataset", "d",
                                       "--no-progress"])
    assert failed.exit_code == 8, failed.output  # a and b journaled, nothing staged
    (src / "z.npz").unlink()
    records = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(store, "journal"))
               for n in names if not n.startswith("task-")]
    assert len(records) == 2
    older = {**software(), "pyarrow": "0.0.1-older"}
    with open(records[0]) as f:
        rec = json.load(f)
    rec["software"] = older  # as if an earlier release had written that file's shards
    with open(records[0], "w") as f:
        json.dump(rec, f)
    with open(records[1]) as f:
        rec = json.load(f)
    del rec["software"]  # a record from before records kept versions
    with open(records[1], "w") as f:
        json.dump(rec, f)
    out = _cli(store, "ingest", str(src), "--dataset", "d", "--snapshot", "-m", "again",
               "--json", "--no-progress")
    assert json.loads(out)["files_reused"] == 2
    # the first record's versions; the second record adds none
    assert _written_with(store) == [older]


def test_libraries_of_takes_only_names_a_plugin_declares():
    class Declares:
        libraries = ("h5py", 3, "", "netCDF4")

    class One:
        libraries = "zarr"

    assert libraries_of(Declares(), One(), object()) == ("h5py", "netCDF4", "zarr")
    assert software(["no-such-distribution-here"])["no-such-distribution-here"] == "not installed"


def test_pieces_read_with_other_versions_show_each_and_sets_are_distinct():
    a = FileResult("p", "k", 1, software={"numpy": "2.0", "pyarrow": "26"})
    b = FileResult("p", "k", 1, software={"numpy": "2.0", "pyarrow": "27"})
    assert _joined_software([a, b, a]) == {"numpy": "2.0", "pyarrow": "26 / 27"}
    old = FileResult("q", "j", 1)  # a record without versions adds no set
    assert _software_sets([b, a, old, b]) == [a.software, b.software]
