"""Tags and branches created or deleted on S3 when a conditional request's response is lost.

The store retries a request whose response never came; when the first attempt landed,
the retry's 412 (create) or 404 (delete) is against this writer's own write. The refs
read the ref back, as a commit does, and report success when it holds what was asked; a
ref at another snapshot is still an error.
"""

from __future__ import annotations

import os
import sys

import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import AlreadyExistsError, ConflictError
from simstore.testing.s3 import fast_retry_options

pytestmark = pytest.mark.s3

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "catalog"))
from catalog_helpers import stage_samples  # noqa: E402

KIND_DIR = {"tags": "tags", "branches": "heads"}


def _options(endpoint):
    return fast_retry_options(endpoint)


@pytest.fixture
def lossy(s3_bucket, fault_proxy):
    """(catalog through the fault proxy, URL, two snapshot ids, the proxy)."""
    url = f"s3://{s3_bucket()}/refs"
    cat = Catalog.init(url, storage_options=_options(fault_proxy.endpoint_url))
    stage_samples(cat, "ds", {"a": b"1"})  # a dataset is made by its first staged change
    first = cat.commit("ds", message="one").snapshot_id
    second = cat.commit("ds", message="two").snapshot_id
    assert first != second
    return cat, url, first, second, fault_proxy


def _lose_next(proxy, method, kind, name):
    proxy.fail_next(
        "drop_response", methods=[method], path_contains=f"/refs/{KIND_DIR[kind]}/{name}"
    )


@pytest.mark.parametrize("kind", ["tags", "branches"])
def test_a_create_whose_response_was_lost_succeeds(lossy, kind):
    cat, _, first, _, proxy = lossy
    refs = getattr(cat, kind)("ds")
    _lose_next(proxy, "PUT", kind, "v1")
    refs.create("v1", first)
    assert proxy.count("drop_response", "PUT") == 1
    assert refs.get("v1") == first


@pytest.mark.parametrize("kind", ["tags", "branches"])
def test_a_create_over_a_ref_elsewhere_still_fails_after_a_lost_response(
    lossy, kind, monkeypatch
):
    cat, _, first, second, proxy = lossy
    refs = getattr(cat, kind)("ds")
    # a create reads the ref before it writes (a ref there already is answered without a
    # write); another writer's create lands just after that read, at another snapshot
    real_get, landed = refs._store.get, []

    def get(key, byte_range=None, *, max_bytes=None):
        try:
            return real_get(key, byte_range, max_bytes=max_bytes)
        finally:
            if key == refs.key("v1") and not landed:
                landed.append(True)
                refs.create("v1", second)
                _lose_next(proxy, "PUT", kind, "v1")

    monkeypatch.setattr(refs._store, "get", get)
    with pytest.raises(AlreadyExistsError, match="'v1' already exists"):
        refs.create("v1", first)
    assert landed
    assert proxy.count("drop_response", "PUT") == 1
    assert refs.get("v1") == second


@pytest.mark.parametrize("kind", ["tags", "branches"])
def test_a_delete_whose_response_was_lost_succeeds(lossy, kind):
    cat, _, first, _, proxy = lossy
    refs = getattr(cat, kind)("ds")
    refs.create("v1", first)
    _lose_next(proxy, "DELETE", kind, "v1")
    refs.delete("v1")
    assert proxy.count("drop_response", "DELETE") == 1
    assert not refs.exists("v1")


def test_a_delete_of_a_tag_that_changed_meanwhile_is_still_a_conflict(lossy, monkeypatch):
    cat, _, first, second, _ = lossy
    tags = cat.tags("ds")
    tags.create("v1", first)
    stale = tags._store.get_versioned(tags.key("v1"))  # the ref as the delete reads it
    tags.delete("v1")
    tags.create("v1", second)  # deleted and made again by another writer
    monkeypatch.setattr(tags._store, "get_versioned", lambda key, **_: stale)
    with pytest.raises(ConflictError):
        tags.delete("v1")
    assert tags.get("v1") == second


def test_cli_tag_branch_and_tag_delete_survive_lost_responses(lossy):
    _, url, first, second, proxy = lossy
    opts = [x for k, v in _options(proxy.endpoint_url).items()
            for x in ("--storage-option", f"{k}={v}")]

    def cli(*args):
        return CliRunner().invoke(main, ["--store", url, *opts, *args], catch_exceptions=False)

    for args, method, kind, name in [
        (["tag", "ds", "v1"], "PUT", "tags", "v1"),
        (["branch", "ds", "dev"], "PUT", "branches", "dev"),
        (["tag", "ds", "v1", "--delete"], "DELETE", "tags", "v1"),
    ]:
        _lose_next(proxy, method, kind, name)
        result = cli(*args)
        assert result.exit_code == 0, (args, result.output)
    assert proxy.count("drop_response") == 3
    assert cli("show", "ds@v1").exit_code == 3
    assert cli("show", "ds@dev", "--json").output.count(second) == 1
    # A genuine conflict is still exit 4, lost response or not.
    assert cli("tag", f"ds@{first}", "old").exit_code == 0
    _lose_next(proxy, "PUT", "tags", "old")
    result = cli("tag", "ds", "old")
    assert result.exit_code == 4 and "already exists" in result.output, result.output
