"""Adapter option values are checked before anything is read (``check_options``): a bad
``cad_tolerance`` or ``cad_timeout_s``, or a ``time_window``/``stride`` that is not a whole
number, fails the ingest once with one line naming the option and value, even under
``on_error="skip"`` (which once skipped every CAD file and still committed a snapshot)."""

import h5py
import numpy as np
import pytest
import source_files as sf
from click.testing import CliRunner
from simstore.cli import main
from simstore.formats.adapters import AutoAdapter, CadAdapter, HDF5Adapter

from simstore.catalog import Catalog
from simstore.errors import InvalidInputError
from simstore.ingest import ingest


@pytest.fixture
def parts(tmp_path):
    """A STEP box (gmsh) and an HDF5 run of 8 time steps."""
    root = tmp_path / "parts"
    root.mkdir()
    sf.write_step(root / "box.step")
    with h5py.File(root / "run.h5", "w") as f:
        f["u"] = np.zeros((8, 3, 3), np.float32)
    return root


def _keys(catalog):
    return sorted(catalog.store.list(""))


BAD_CAD = [
    ({"cad_tolerance": "0.0.1"}, "adapter option cad_tolerance '0.0.1': "),
    ({"cad_tolerance": "0"}, "adapter option cad_tolerance '0': "),
    ({"cad_mesh": "volumes"}, "adapter option cad_mesh 'volumes': "),
    ({"cad_timeout_s": "abc"}, "adapter option cad_timeout_s 'abc': "),
    ({"cad_timeout_s": "nan"}, "adapter option cad_timeout_s 'nan': "),
    ({"cad_timeout_s": "inf"}, "adapter option cad_timeout_s 'inf': "),
    ({"cad_timeout_s": "-5"}, "adapter option cad_timeout_s '-5': "),
    ({"cad_timeout_s": "0"}, "adapter option cad_timeout_s '0': "),
    ({"cad_timeout_s": 0}, "adapter option cad_timeout_s 0: "),
    ({"cad_timeout_s": True}, "adapter option cad_timeout_s True: "),
]
BAD_TIME = [
    ({"time_window": "abc"}, "adapter option time_window 'abc': a whole number"),
    ({"time_window": "0"}, "adapter option time_window '0': "),
    ({"time_window": "2.5"}, "adapter option time_window '2.5': "),
    ({"time_window": 2.0}, "adapter option time_window 2.0: "),
    ({"time_window": "4", "stride": "x"}, "adapter option stride 'x': "),
    ({"time_window": "4", "stride": "-1"}, "adapter option stride '-1': "),
]


@pytest.mark.parametrize("adapter", ["auto", "cad"])
@pytest.mark.parametrize("options, words", BAD_CAD)
def test_a_bad_cad_option_value_fails_before_anything_is_read(
    catalog, parts, adapter, options, words, monkeypatch
):
    import simstore.formats.adapters._cad as cad

    def never(*args, **kwargs):
        raise AssertionError("a part was meshed")

    monkeypatch.setattr(cad, "mesh_isolated", never)
    before = _keys(catalog)
    src = parts if adapter == "auto" else parts / "box.step"
    with pytest.raises(InvalidInputError) as err:
        ingest([src], dataset="d", store=catalog, snapshot=True, on_error="skip",
               adapter=adapter, adapter_options=options)
    message = str(err.value)
    assert "\n" not in message and message.startswith(words), message
    assert _keys(catalog) == before


@pytest.mark.parametrize("adapter", ["auto", "hdf5"])
@pytest.mark.parametrize("options, words", BAD_TIME)
def test_a_bad_time_window_option_fails_before_anything_is_read(
    catalog, parts, adapter, options, words
):
    before = _keys(catalog)
    src = parts if adapter == "auto" else parts / "run.h5"
    with pytest.raises(InvalidInputError) as err:
        ingest([src], dataset="d", store=catalog, on_error="skip", adapter=adapter,
               adapter_options=options)
    message = str(err.value)
    assert "\n" not in message and message.startswith(words), message
    assert _keys(catalog) == before


def test_good_option_values_ingest(catalog, parts):
    r = ingest([parts], dataset="d", store=catalog, snapshot=True,
               adapter_options={"cad_tolerance": "0.2", "cad_timeout_s": "60",
                                "time_window": "4", "stride": "2"})
    assert r.files_skipped == ()
    keys = catalog.manifest(catalog.snapshot(r.snapshot_id)).column("key").to_pylist()
    assert sorted(keys) == ["box.step", "run.h5/t0000", "run.h5/t0002", "run.h5/t0004"]


def test_the_hooks_take_good_values_and_auto_passes_each_adapter_its_own():
    CadAdapter.check_options({"cad_tolerance": 0.5, "cad_timeout_s": 1e6, "cad_mesh": "volume"})
    HDF5Adapter.check_options({"time_window": 3, "stride": np.int64(1), "time_name": "t"})
    seen = []

    class Spy:
        name = "spy"
        options = frozenset({"spy_level"})

        def check_options(self, options):
            seen.append(dict(options))

    auto = AutoAdapter()
    auto._adapters = [Spy(), CadAdapter()]
    auto.check_options({"spy_level": "3", "cad_tolerance": "0.1"})
    assert seen == [{"spy_level": "3"}]
    with pytest.raises(InvalidInputError, match="cad_tolerance '2'"):
        auto.check_options({"spy_level": "3", "cad_tolerance": "2"})


def test_cli_a_bad_cad_timeout_is_exit_2_and_writes_nothing(tmp_path, parts):
    store = str(tmp_path / "cli-store")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", store, "init"]).exit_code == 0
    result = runner.invoke(main, ["--store", store, "ingest", str(parts), "--dataset", "d",
                                  "--option", "cad_timeout_s=abc", "--on-error", "skip",
                                  "--snapshot", "-m", "x"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "adapter option cad_timeout_s 'abc'" in lines[0], result.output
    cat = Catalog.open(store)
    assert cat.datasets() == [] and not any(cat.store.list("objects/"))
