"""``simstore.ingest`` from Python refuses what the command line refuses, naming it, before
it reads a file: arguments of the wrong kind were raw TypeErrors, an empty path ingested
the working folder, and a message without ``snapshot=True`` was dropped."""

import os

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.errors import InvalidInputError
from simstore.ingest import ingest


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A folder with one .npz; the working folder holds another, which must stay unread."""
    root = tmp_path / "runs"
    root.mkdir()
    np.savez(root / "a.npz", x=np.arange(4.0))
    work = tmp_path / "work"
    work.mkdir()
    np.savez(work / "stray.npz", x=np.arange(3.0))
    monkeypatch.chdir(work)
    return root


def _refused(catalog, match, sources, **options):
    before = sorted(catalog.store.list(""))
    with pytest.raises(InvalidInputError) as err:
        ingest(sources, dataset="d", store=catalog, **options)
    assert "\n" not in str(err.value)
    assert match in str(err.value), str(err.value)
    assert sorted(catalog.store.list("")) == before  # nothing read, nothing written


@pytest.mark.parametrize(("sources", "match"), [
    ("", "invalid source '': an empty path"),  # "$RUNS" unset ingested the working folder
    ([""], "invalid source '': an empty path"),
    (b"runs", "invalid sources b'runs': give a path"),  # iterated as integers
    (None, "invalid sources None"),
    ([123], "invalid source 123: a source is a path"),
    ([], "no sources given"),
])
def test_sources_of_the_wrong_kind_are_refused(catalog, runs, sources, match):
    _refused(catalog, match, sources)


@pytest.mark.parametrize(("options", "match"), [
    ({"message": "hi"}, "message names a snapshot: it needs snapshot=True"),
    ({"snapshot": True, "message": ""}, "invalid message '': a snapshot needs a message"),
    ({"snapshot": True, "message": "  "}, "invalid message '  '"),
    ({"snapshot": True, "author": ""}, "invalid author '': empty"),
    ({"config": {"workers": 2}}, "invalid config {'workers': 2}: an IngestConfig"),
    ({"progress": 123}, "invalid progress 123: a callable or None"),
    ({"dataset": 123}, "invalid dataset name 123: must be a string"),
])
def test_options_the_command_line_refuses_are_refused(catalog, runs, options, match):
    options = {"dataset": "d", **options}
    before = sorted(catalog.store.list(""))
    with pytest.raises(InvalidInputError, match=match):
        ingest([runs], store=catalog, **options)
    assert sorted(catalog.store.list("")) == before


def test_the_same_ingest_with_good_arguments_reads_only_what_it_names(catalog, runs):
    result = ingest(os.fspath(runs), dataset="d", store=catalog, snapshot=True,
                    message="first", author="me")
    assert result.samples == 1
    snap = catalog.snapshot(catalog.resolve("d"))
    assert (snap.message, snap.author) == ("first", "me")


def test_cli_refuses_an_empty_source(catalog, runs):
    res = CliRunner().invoke(main, ["--store", catalog.store.url, "ingest", "", "--dataset", "d"])
    assert res.exit_code == 2, res.output
    assert "invalid source '': an empty path" in res.output
    assert not catalog.staged("d")
