"""A local (or memory://) store takes no storage options: giving it some is an error naming
them, not options silently dropped (an S3 endpoint meant for another store, say)."""

import pytest
from click.testing import CliRunner
from simstore.cli import main

import simstore
from simstore.catalog import Catalog
from simstore.errors import InvalidInputError
from simstore.storage import LocalStore, open_store


@pytest.mark.parametrize("form", ["path", "file", "local"])
def test_a_local_store_refuses_storage_options_by_name(tmp_path, form):
    root = tmp_path / "store"
    url = {"path": str(root), "file": f"file://{root}", "local": f"local://{root}"}[form]
    with pytest.raises(InvalidInputError) as err:
        open_store(url, storage_options={"region_name": "eu-west-1", "endpoint_url": "x"})
    assert str(err.value) == (
        f"{url}: a local store takes no storage options; got storage options "
        "'endpoint_url', 'region_name'"
    )
    with pytest.raises(InvalidInputError, match="got storage option 'fsync'$"):
        open_store(url, storage_options={"fsync": False}, read_only=True)
    assert not root.exists()
    # no options, or an empty mapping (what the CLI passes without --storage-option): fine
    assert open_store(url, storage_options={}) == open_store(url) == LocalStore(str(root))


def test_catalog_and_dataset_refuse_them_before_writing_anything(tmp_path):
    root = tmp_path / "store"
    options = {"anon": True}
    with pytest.raises(InvalidInputError, match="a local store takes no storage options"):
        Catalog.init(str(root), storage_options=options)
    assert not root.exists()
    Catalog.init(str(root))
    with pytest.raises(InvalidInputError, match="got storage option 'anon'"):
        Catalog.open(str(root), storage_options=options)
    with pytest.raises(InvalidInputError, match="got storage option 'anon'"):
        simstore.SimDataset(str(root), "ds", storage_options=options)
    assert sorted(p.name for p in root.iterdir()) == ["simstore.json"]


def test_a_memory_store_refuses_them_too():
    with pytest.raises(InvalidInputError, match=r"^memory://opts: a memory:// store takes no "
                       "storage options; got storage option 'key'$"):
        open_store("memory://opts", storage_options={"key": "k"})


def test_options_for_a_store_already_open_are_refused(tmp_path):
    store = LocalStore(str(tmp_path))
    assert open_store(store, storage_options=None) is store
    assert open_store(store, storage_options={}) is store
    with pytest.raises(InvalidInputError, match="storage options 'key' apply when a store is "
                       "opened from its URL"):
        open_store(store, storage_options={"key": "k"})


@pytest.mark.parametrize("options", [["key=k"], "key=k"])
def test_storage_options_must_be_a_mapping(tmp_path, options):
    with pytest.raises(InvalidInputError, match="invalid storage_options"):
        open_store(str(tmp_path), storage_options=options)


def test_cli_storage_option_on_a_local_store_is_exit_code_2(tmp_path):
    root = tmp_path / "store"
    result = CliRunner().invoke(
        main, ["--store", str(root), "--storage-option", "max_attempts=8", "init"]
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        f"error: {root}: a local store takes no storage options; "
        "got storage option 'max_attempts'"
    ]
    assert not root.exists()
