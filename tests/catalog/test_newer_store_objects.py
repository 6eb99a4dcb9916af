"""A store, a ref, a staging entry, a price table or a run report written by a newer
simstore is refused as such (UnsupportedFormatError: upgrade), not as damage."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.cost import check_price_data, parse_run_report
from simstore.errors import FormatError, UnsupportedFormatError
from simstore.ingest import ingest

UPGRADE = "written by a newer simstore, upgrade to read it"


@pytest.fixture
def store(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", x=np.arange(4.0))
    cat = Catalog.init(str(tmp_path / "store"))
    ingest([src], dataset="d", store=cat, snapshot=True)
    return tmp_path / "store"


def _bump(path, version):
    obj = json.loads(path.read_bytes())
    obj["format_version"] = version
    path.write_bytes(json.dumps(obj).encode())


def test_a_newer_store_is_unsupported_and_the_cli_says_upgrade(store):
    _bump(store / "simstore.json", 2)
    with pytest.raises(UnsupportedFormatError, match=f"store format_version 2, .*: {UPGRADE}"):
        Catalog.open(str(store))
    r = CliRunner().invoke(main, ["--store", str(store), "log", "d@main"])
    assert r.exit_code != 0 and UPGRADE in r.output


@pytest.mark.parametrize("version", [0, "2", None])
def test_an_odd_store_version_is_still_plain_damage(store, version):
    _bump(store / "simstore.json", version)
    with pytest.raises(FormatError) as info:
        Catalog.open(str(store))
    assert type(info.value) is FormatError


def test_a_newer_ref_is_unsupported(store):
    _bump(store / "datasets" / "d" / "refs" / "heads" / "main", 3)
    cat = Catalog.open(str(store))
    with pytest.raises(UnsupportedFormatError, match=f"format_version 3, .*: {UPGRADE}"):
        cat.resolve("d@main")


def test_a_newer_staging_entry_is_unsupported(tmp_path, store):
    src = tmp_path / "more"
    src.mkdir()
    np.savez(src / "b.npz", x=np.arange(5.0))
    cat = Catalog.open(str(store))
    ingest([src], dataset="d", store=cat)  # staged, not committed
    (entry,) = (store / "datasets" / "d" / "staging").iterdir()
    _bump(entry, 2)
    with pytest.raises(UnsupportedFormatError, match="staging entry .* format_version 2"):
        cat.staged("d")


def test_a_newer_price_table_and_run_report_are_unsupported():
    with pytest.raises(UnsupportedFormatError, match=UPGRADE):
        check_price_data({"format_version": 2}, origin="prices.toml")
    with pytest.raises(UnsupportedFormatError, match=UPGRADE):
        parse_run_report({"kind": "simstore-loader-report", "format_version": 2},
                         origin="run.json")
