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


@pytest.mark.parametrize("url", ["s3://bucket/p?x=1", "s3://bucket/p#frag", "s3a://bucket/a/b?versionId=3"])
def test_an_s3_url_with_a_query_string_or_fragment_is_refused(url):
    # found by an audit: the S3 store took them into its key prefix and went to the network
    # (exit 10), where every other scheme refuses them (exit 2)
    with pytest.raises(InvalidInputError, match="cannot have a query string or fragment"):
        open_store(url)
    result = CliRunner().invoke(main, ["--store", url, "ls"])
    assert result.exit_code == 2 and "cannot have a query string or fragment" in result.output
