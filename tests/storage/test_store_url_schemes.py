"""Store URLs: schemes are case-insensitive, and an unknown or uninstalled one is named."""

import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.errors import InvalidInputError
from simstore.storage import FsspecStore, LocalStore, open_store


def test_schemes_are_case_insensitive(tmp_path):
    local = open_store(f"FILE://{tmp_path / 'a'}")
    assert isinstance(local, LocalStore)
    memory = open_store("Memory://scheme-case")
    assert isinstance(memory, FsspecStore) and memory.url.startswith("memory://")


def test_an_unknown_scheme_is_invalid_input():
    with pytest.raises(InvalidInputError, match="unknown storage scheme 'xyz://'"):
        open_store("xyz://bucket/p")
    result = CliRunner().invoke(main, ["--store", "xyz://bucket/p", "ls"])
    assert result.exit_code == 2 and "unknown storage scheme 'xyz://'" in result.output


def test_a_scheme_whose_package_is_missing_says_so(monkeypatch):
    import fsspec

    def missing(protocol):
        raise ImportError(f"Install somefs to access {protocol}")

    monkeypatch.setattr(fsspec, "get_filesystem_class", missing)
    with pytest.raises(InvalidInputError, match="'abfs://' scheme needs a package that is not "
                                                "installed: Install somefs"):
        open_store("abfs://container/p")
