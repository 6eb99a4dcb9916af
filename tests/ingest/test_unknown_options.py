"""An adapter option or a chunks entry that nothing takes is an error naming it, never a
silent ingest with defaults (``time_windw=4`` once ingested whole runs)."""

import json

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main
from simstore.formats.adapters import AutoAdapter

from simstore.catalog import Catalog
from simstore.errors import InvalidInputError
from simstore.ingest import IngestConfig, ingest
from simstore.sample import Sample
from simstore.testing.adapters import add_adapters


@pytest.fixture
def mixed(tmp_path):
    """A folder with two HDF5 runs of 8 time steps and one .npz."""
    root = tmp_path / "runs"
    root.mkdir()
    rng = np.random.default_rng(3)
    for i in range(2):
        with h5py.File(root / f"run{i}.h5", "w") as f:
            f["time"] = np.arange(8, dtype=np.float64)
            f["velocity"] = rng.standard_normal((8, 4, 4, 2)).astype(np.float32)
    np.savez(root / "grid.npz", x=np.linspace(0, 1, 5), y=np.linspace(0, 2, 3))
    return root


def _keys(catalog):
    return sorted(catalog.store.list(""))


def _refused(catalog, root, match, **options):
    """The ingest fails with one InvalidInputError line matching ``match``, writing nothing."""
    before = _keys(catalog)
    with pytest.raises(InvalidInputError) as err:
        ingest([root], dataset="d", store=catalog, snapshot=True, **options)
    message = str(err.value)
    assert "\n" not in message
    assert match in message, message
    assert _keys(catalog) == before
    return message


def test_a_mistyped_option_is_named_with_the_options_there_are(catalog, mixed):
    message = _refused(catalog, mixed, "unknown adapter option 'time_windw' for adapter 'auto'",
                       adapter_options={"time_windw": 4})
    for known in ("time_window", "stride", "time_name", "npy_field", "cad_tolerance"):
        assert known in message
    message = _refused(catalog, mixed, "unknown adapter options 'a', 'b' for adapter 'hdf5'",
                       adapter="hdf5", adapter_options={"b": 1, "a": 2, "time_name": "time"})
    assert message.endswith("(options it takes: stride, time_name, time_window)")


def test_an_option_of_another_adapter_is_refused_when_that_adapter_is_not_chosen(
    catalog, mixed
):
    npz = mixed / "grid.npz"
    _refused(catalog, npz, "unknown adapter option 'time_window' for adapter 'npz' "
             "(options it takes: none)", adapter="npz", adapter_options={"time_window": 2})
    # --time-window reaches the adapter as the same option
    _refused(catalog, npz, "unknown adapter option 'time_window' for adapter 'npz'",
             adapter="npz", time_window=2)
    _refused(catalog, npz, "unknown adapter options 'stride', 'time_window' for adapter 'npz'",
             adapter="npz", time_window=2, stride=1)
    _refused(catalog, npz, "unknown adapter option 'npy_field' for adapter 'npz'",
             adapter="npz", adapter_options={"npy_field": "u"})


def test_with_auto_an_option_of_any_adapter_it_may_pick_is_accepted(catalog, mixed):
    # npy_field is the npy adapter's: no .npy here, but auto may pick npy, so it is known
    r = ingest([mixed], dataset="d", store=catalog, snapshot=True,
               adapter_options={"time_window": 4, "time_name": "time", "npy_field": "v"})
    assert r.samples == 2 * 2 + 1  # two windows of four steps per run, and the .npz
    assert sorted(Catalog.open(catalog.store.url).snapshot(r.snapshot_id).lineage["ingests"][0][
        "parameters"]["adapter_options"]) == [
        "max_in_memory_bytes", "npy_field", "time_name", "time_window"]


def test_an_adapters_own_options_still_work(catalog, tmp_path):
    path = tmp_path / "p.npy"
    np.save(path, np.arange(6, dtype=np.int16))
    r = ingest([path], dataset="d", store=catalog, adapter="npy",
               adapter_options={"npy_field": "pressure"})
    assert [s.name for s in r.schema] == ["pressure"]


@pytest.mark.parametrize("key, words", [
    ("max_in_memory_bytes", "from dense_threshold, --dense-threshold"),
    ("tmp_dir", "from tmp_dir, --tmp-dir"),
    ("source_hash", "content hash"),
    ("sample_range", "one piece of a large file"),
    ("checked_crcs", "CRC-32s"),  # a user's map would stand in for the adapter's check
])
def test_options_ingest_sets_itself_are_refused(catalog, mixed, key, words):
    message = _refused(catalog, mixed, f"adapter option {key!r} is set by ingest itself",
                       adapter_options={key: 1})
    assert words in message


def test_stride_needs_a_time_window(catalog, mixed):
    _refused(catalog, mixed, "adapter option 'stride' needs a time_window",
             adapter_options={"stride": 2})


class _Points:
    """A third-party adapter: ``.pts`` files of numbers, optionally scaled."""

    name = "pts"
    version = "1"
    extensions = (".pts",)

    def can_read(self, path, head):
        return path.endswith(".pts")

    def iter_samples(self, path, key, options):
        values = np.loadtxt(path, ndmin=1) * float(options.get("scale", 1))
        yield Sample(key, {"values": values})


class _DeclaredPoints(_Points):
    options = frozenset({"scale"})


def _install(monkeypatch, adapter_class):
    add_adapters(monkeypatch, {"pts": adapter_class})


@pytest.fixture
def pts_dir(tmp_path):
    root = tmp_path / "pts"
    root.mkdir()
    (root / "a.pts").write_text("1 2 3\n")
    return root


def test_a_third_party_adapter_declares_its_options(catalog, pts_dir, monkeypatch):
    _install(monkeypatch, _DeclaredPoints)
    _refused(catalog, pts_dir, "unknown adapter option 'scael' for adapter 'pts' "
             "(options it takes: scale)", adapter="pts", adapter_options={"scael": 2})
    # auto may pick it: its options join the built-ins'
    assert "scale" in AutoAdapter().options
    _refused(catalog, pts_dir, "unknown adapter option 'scael' for adapter 'auto'",
             adapter_options={"scael": 2})
    r = ingest([pts_dir], dataset="d", store=catalog, snapshot=True,
               adapter_options={"scale": 2})
    assert r.samples == 1 and r.schema[0].name == "values"


def test_an_adapter_that_declares_no_options_takes_any(catalog, pts_dir, monkeypatch):
    _install(monkeypatch, _Points)
    r = ingest([pts_dir], dataset="d", store=catalog, adapter="pts",
               adapter_options={"scale": 2, "anything": 1})
    assert r.samples == 1
    # and auto, which may pick it, can no longer tell an unknown option
    assert AutoAdapter().options is None
    r = ingest([pts_dir], dataset="e", store=catalog, adapter_options={"anything": 1})
    assert r.samples == 1


def test_cli_option_typo_is_exit_code_2_and_stages_nothing(tmp_path, mixed):
    store = str(tmp_path / "cli-store")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", store, "init"]).exit_code == 0
    result = runner.invoke(main, ["--store", store, "ingest", str(mixed), "--dataset", "d",
                                  "--option", "time_windw=4", "--snapshot", "-m", "x"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown adapter option 'time_windw'" in lines[0]
    cat = Catalog.open(store)
    assert cat.datasets() == [] and not any(cat.store.list("objects/"))


def test_a_chunks_entry_for_a_field_no_sample_has_is_refused_before_staging(catalog, mixed):
    with pytest.raises(InvalidInputError) as err:
        ingest([mixed], dataset="d", store=catalog, snapshot=True, format="zarr",
               chunks={"velocty": (1, 4, 4, 2)})
    message = str(err.value)
    assert "\n" not in message
    assert message == ("chunks names field 'velocty', which no sample of this ingest has as an "
                       "array; array fields: time, velocity, x, y")
    # in Parquet shards (small fields) a wrong rank was never seen by the Zarr writer
    with pytest.raises(InvalidInputError, match="chunks for field 'velocity' has 3 axes; "
                       "the field has 4"):
        ingest([mixed], dataset="d", store=catalog, chunks={"velocity": (1, 4, 4)})
    assert catalog.datasets() == []  # nothing staged, no branch
    r = ingest([mixed], dataset="d", store=catalog, snapshot=True, format="zarr",
               chunks={"velocity": (1, 4, 4, 2)})
    shard_options = catalog.snapshot(r.snapshot_id).lineage["ingests"][0]["parameters"][
        "shard_options"]
    assert json.dumps(shard_options["chunks"]) == '{"velocity": [1, 4, 4, 2]}'


@pytest.mark.parametrize("chunks", [{"velocity": 64}, {"velocity": (0, 4)}, {"velocity": ()},
                                    {"velocity": "1,4"}, {3: (1,)}, [("velocity", (1,))]])
def test_a_malformed_chunks_setting_is_refused_when_configured(chunks):
    with pytest.raises(InvalidInputError, match="invalid chunks"):
        IngestConfig(chunks=chunks)


def test_malformed_adapter_options_are_refused_when_configured():
    for options in (["time_window"], {4: 1}):
        with pytest.raises(InvalidInputError, match="invalid adapter_options"):
            IngestConfig(adapter_options=options)
