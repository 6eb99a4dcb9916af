"""An adapter that misbehaves makes its file a bad one, never wrong values or a crash.

Each case was found with a plugin written the way a hurried pipeline writes one
(``bad_adapters``): a buffer reused for every sample stored the last sample's values under
every hash; an array source whose reads disagreed with its shape or dtype was stored as
it came; exceptions of odd classes, a sample that is no ``Sample``, a ``can_read`` or
``check_options`` that raised were tracebacks that ended the run; a plugin named ``hdf5``
replaced the built-in; a new adapter version reused the old one's journal records; a
``print`` broke ``ingest --json``; and a shard writer whose ``abort`` raised turned Ctrl-C
into a traceback and left the scratch folder.
"""

from __future__ import annotations

import json
import logging
import os

import bad_adapters
import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.errors import InvalidInputError, SourceError
from simstore.ingest import ingest, load_adapters
from simstore.testing.adapters import add_adapters

PLUGINS = {"bad": "bad_adapters:Bad", "judge": "bad_adapters:Judge",
           "fussy": "bad_adapters:Fussy"}


@pytest.fixture(autouse=True)
def plugins(monkeypatch):
    add_adapters(monkeypatch, PLUGINS)


def _files(tmp_path, **texts):
    root = tmp_path / "src"
    root.mkdir(exist_ok=True)
    for name, text in texts.items():
        (root / name.replace("_", ".")).write_text(text)
    return root


@pytest.mark.parametrize(("how", "fmt"), [("reuse", "parquet"), ("mutate", "parquet"),
                                          ("reuse", "lance"), ("reuse-big", "zarr"),
                                          ("reuse-big", "parquet")])
def test_a_reused_buffer_stores_each_sample_as_it_was_yielded(catalog, tmp_path, read, how,
                                                              fmt):
    root = _files(tmp_path, a_bad=how)
    r = ingest([root], dataset="d", store=catalog, adapter="bad", format=fmt, snapshot=True)
    _, samples = read(catalog, f"d@{r.snapshot_id}")
    assert {k: float(np.asarray(v["x"]).ravel()[0]) for k, v in samples.items()} == \
        {"a.bad/0": 0.0, "a.bad/1": 1.0, "a.bad/2": 2.0}
    assert all(np.unique(np.asarray(v["x"])).size == 1 for v in samples.values())


@pytest.mark.parametrize(("how", "said"), [("rows", "float32[99, 4]"),
                                           ("dtype", "float64[100, 4]"),
                                           ("shape", "float32[100, 2]")])
def test_an_array_source_whose_reads_disagree_with_it_is_a_bad_file(catalog, tmp_path, how,
                                                                     said):
    root = _files(tmp_path, a_bad=how)
    with pytest.raises(SourceError) as err:
        ingest([root], dataset="d", store=catalog, adapter="bad", format="zarr", snapshot=True)
    assert f"field 'big': a read gave {said}" in str(err.value)
    assert "declares float32[100, 4]" in str(err.value) and "\n" not in str(err.value)
    assert catalog.staged("d") == [] and not catalog.has_dataset("d")


def test_a_read_failing_while_its_sample_is_written_stops_even_a_skipping_run(catalog,
                                                                             tmp_path):
    """The Zarr shard holds part of the sample: skipped, the next one took its place."""
    root = _files(tmp_path, a_bad="raise2", b_bad="good")
    with pytest.raises(SourceError) as err:
        ingest([root], dataset="d", store=catalog, adapter="bad", format="zarr",
               on_error="skip", snapshot=True)
    assert "OSError: disk hiccup" in str(err.value)
    assert "cannot be skipped" in str(err.value)
    assert catalog.staged("d") == [] and not catalog.has_dataset("d")


@pytest.mark.parametrize(("how", "said"), [
    ("notsample", "the adapter gave a dict where a simstore.sample.Sample is due"),
    ("none", "the adapter gave a NoneType where"),
    ("badstr", "_BadStr: (its message could not be formatted: RuntimeError)"),
    ("base", "_Base: out of the ordinary"),
    ("sysexit", "SystemExit: 3"),
    ("eager", "RuntimeError: refused before the first sample"),
])
def test_what_an_adapter_gets_wrong_is_a_skipped_file(catalog, tmp_path, how, said):
    root = _files(tmp_path, a_bad=how, b_bad="good")
    r = ingest([root], dataset="d", store=catalog, adapter="bad", on_error="skip",
               snapshot=True)
    assert r.samples == 1
    [skipped] = r.files_skipped
    assert skipped.path.endswith("a.bad") and said in skipped.reason
    with pytest.raises(SourceError, match="a.bad"):  # and without skip, the run's error
        ingest([_files(tmp_path, c_bad=how)], dataset="e", store=catalog, adapter="bad")


def test_a_can_read_that_raises_makes_that_file_a_bad_one(catalog, tmp_path):
    root = _files(tmp_path, a_boom="x", good_bad="good")
    (root / "b.boom").write_bytes(b"\xff\xfe binary")
    r = ingest([root], dataset="d", store=catalog, on_error="skip", snapshot=True)
    assert sorted(os.path.basename(s.path) for s in r.files_skipped) == ["b.boom"]
    assert "adapter 'judge' failed to judge the file" in r.files_skipped[0].reason
    assert "UnicodeDecodeError" in r.files_skipped[0].reason


def test_a_check_options_that_raises_is_one_line_naming_the_adapter(catalog, tmp_path):
    root = _files(tmp_path, a_bad="good")
    with pytest.raises(InvalidInputError, match=r"adapter 'fussy': .* 'level' failed: "
                                                 r"ValueError"):
        ingest([root], dataset="d", store=catalog, adapter="fussy",
               adapter_options={"level": "abc"})


def test_a_plugin_named_like_a_builtin_does_not_replace_it(monkeypatch, caplog):
    add_adapters(monkeypatch, {"hdf5": "bad_adapters:Bad"})
    with caplog.at_level(logging.WARNING, logger="simstore.ingest"):
        adapters = load_adapters()
    assert type(adapters["hdf5"]).__module__.startswith("simstore.formats.adapters")
    assert "'hdf5' (bad_adapters:Bad) ignored" in caplog.text


def test_a_new_adapter_version_reads_its_files_again(catalog, tmp_path, read, monkeypatch):
    root = _files(tmp_path, a_bad="value")
    ingest([root], dataset="d", store=catalog, adapter="bad", snapshot=True)
    monkeypatch.setattr(bad_adapters.Bad, "version", "2")
    monkeypatch.setattr(bad_adapters.Bad, "value", 2.0)
    r = ingest([root], dataset="d", store=catalog, adapter="bad", snapshot=True)
    assert r.files_reused == 0
    _, samples = read(catalog, f"d@{r.snapshot_id}")
    assert samples["a.bad"]["x"].tolist() == [2.0, 2.0]


def test_what_an_adapter_prints_stays_out_of_the_json_summary(tmp_path):
    root = _files(tmp_path, a_bad="print")
    store = str(tmp_path / "cli-store")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", store, "init"]).exit_code == 0
    result = runner.invoke(main, ["--store", store, "ingest", str(root), "--dataset", "d",
                                  "--adapter", "bad", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["samples"] == 1
    assert "reading a.bad" in result.stderr


def test_a_writer_whose_abort_raises_still_leaves_no_scratch(catalog, tmp_path, monkeypatch):
    from simstore.formats._parquet import ParquetShardWriter

    def abort(self):
        raise RuntimeError("abort failed")

    monkeypatch.setattr(ParquetShardWriter, "abort", abort)
    root = _files(tmp_path, a_bad="good", b_bad="interrupt")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(KeyboardInterrupt):
        ingest([root], dataset="d", store=catalog, adapter="bad", tmp_dir=str(scratch))
    assert os.listdir(scratch) == []


def test_arrays_nothing_can_write_are_not_copied_and_masked_ones_are_refused(tmp_path):
    """A read-only mapping of a file is taken as it is (a field larger than memory
    ingests in bounded memory); a read-only view of a writable buffer is copied."""
    from simstore.ingest._guard import owned_sample
    from simstore.sample import Sample

    np.save(tmp_path / "a.npy", np.arange(6.0))
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    view = np.arange(4.0).view()
    view.flags.writeable = False
    owned = owned_sample(Sample("k", {"m": mapped, "v": view}), "a", fresh=False)
    assert owned.fields["m"] is mapped
    assert owned.fields["v"] is not view and owned.fields["v"].tolist() == view.tolist()
    with pytest.raises(SourceError, match="field 'x': a masked array"):
        owned_sample(Sample("k", {"x": np.ma.masked_array([1, 2], mask=[0, 1])}), "a", True)
