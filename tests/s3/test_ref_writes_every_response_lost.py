"""Ref writes on S3 whose first attempt landed but whose every response was lost.

The store retries a conditional PUT or DELETE whose response never came; when every
retry's response is lost too, the retries run out and the store raises StorageError,
although the first attempt landed. The catalog reads the ref back: a ref that holds what
was written (a commit's snapshot, a created ref) or is gone (a delete) is this writer's
success; anything else, and a write that never reached the server, is still the error.
"""

from __future__ import annotations

import os
import sys

import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import StorageError
from simstore.testing.s3 import fast_retry_options

pytestmark = pytest.mark.s3

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "catalog"))
from catalog_helpers import stage_samples  # noqa: E402

MAX_ATTEMPTS = 3
KIND_DIR = {"tags": "tags", "branches": "heads"}


def _options(endpoint):
    return fast_retry_options(endpoint, MAX_ATTEMPTS)


@pytest.fixture
def lossy(s3_bucket, fault_proxy):
    """(catalog through the fault proxy, URL, two snapshot ids, the proxy)."""
    url = f"s3://{s3_bucket()}/refs"
    cat = Catalog.init(url, storage_options=_options(fault_proxy.endpoint_url))
    stage_samples(cat, "ds", {"a": b"1"})
    first = cat.commit("ds", message="one").snapshot_id
    stage_samples(cat, "ds", {"b": b"2"})
    second = cat.commit("ds", message="two").snapshot_id
    assert first != second
    return cat, url, first, second, fault_proxy


def _every(proxy, fault, method, path):
    """``fault`` for every ``method`` request whose path contains ``path``."""
    proxy.fail_share(1.0, fault, seed=0, methods=[method], path_contains=path)


def test_a_commit_whose_every_ref_response_was_lost_succeeds(lossy):
    cat, _, _, second, proxy = lossy
    entry = stage_samples(cat, "ds", {"c": b"3"})
    _every(proxy, "drop_response", "PUT", "/refs/heads/main")
    result = cat.commit("ds", message="three")
    proxy.clear()
    # the first attempt landed; it and both retries (412) lost their responses
    assert proxy.count("drop_response", "PUT") == MAX_ATTEMPTS
    assert cat.branches("ds").get("main") == result.snapshot_id
    assert result.parent == second
    assert [e.id for e in cat.staged("ds")] == []  # consumed, so cleaned up
    assert cat.snapshot(result.snapshot_id).lineage["staging"] == [entry.id]


def test_a_landed_commit_built_on_before_it_reads_back_succeeds(lossy, monkeypatch):
    cat, url, _, second, proxy = lossy
    entry = stage_samples(cat, "ds", {"c": b"3"})
    other = Catalog.open(url, storage_options=_options(os.environ["AWS_ENDPOINT_URL"]))
    real = cat.store.compare_and_swap
    theirs = []

    def then_another_writer_commits(key, expected, data):
        try:
            return real(key, expected, data)
        except StorageError:
            # between this writer's lost swap and its read-back, another commit lands
            mine = stage_samples(other, "ds", {"d": b"4"})
            theirs.append(other.commit("ds", message="other", staging_ids=[mine.id]))
            raise

    monkeypatch.setattr(cat.store, "compare_and_swap", then_another_writer_commits)
    _every(proxy, "drop_response", "PUT", "/refs/heads/main")
    result = cat.commit("ds", message="three")
    proxy.clear()
    assert proxy.count("drop_response", "PUT") == MAX_ATTEMPTS
    assert theirs[0].parent == result.snapshot_id  # the other commit built on this one
    assert result.parent == second
    assert cat.branches("ds").get("main") == theirs[0].snapshot_id
    assert cat.snapshot(result.snapshot_id).lineage["staging"] == [entry.id]
    assert cat.staged("ds") == []


def test_the_first_commit_of_a_dataset_whose_every_response_was_lost_succeeds(lossy):
    cat, _, _, _, proxy = lossy
    stage_samples(cat, "fresh", {"a": b"1"})
    _every(proxy, "drop_response", "PUT", "/datasets/fresh/refs/heads/main")
    result = cat.commit("fresh", message="first")  # creates the branch: If-None-Match
    proxy.clear()
    assert proxy.count("drop_response", "PUT") == MAX_ATTEMPTS
    assert cat.branches("fresh").get("main") == result.snapshot_id


def test_a_commit_whose_ref_write_never_arrived_still_fails(lossy):
    cat, _, _, second, proxy = lossy
    entry = stage_samples(cat, "ds", {"c": b"3"})
    _every(proxy, "drop", "PUT", "/refs/heads/main")  # the server never sees them
    with pytest.raises(StorageError, match=f"refs/heads/main: .*failed after {MAX_ATTEMPTS}"):
        cat.commit("ds", message="three")
    proxy.clear()
    assert proxy.count("drop", "PUT") == MAX_ATTEMPTS
    assert cat.branches("ds").get("main") == second
    assert [e.id for e in cat.staged("ds")] == [entry.id]


@pytest.mark.parametrize("kind", ["tags", "branches"])
def test_a_create_whose_every_response_was_lost_succeeds(lossy, kind):
    cat, _, first, _, proxy = lossy
    refs = getattr(cat, kind)("ds")
    _every(proxy, "drop_response", "PUT", f"/refs/{KIND_DIR[kind]}/v1")
    refs.create("v1", first)
    proxy.clear()
    assert proxy.count("drop_response", "PUT") == MAX_ATTEMPTS
    assert refs.get("v1") == first


@pytest.mark.parametrize("kind", ["tags", "branches"])
def test_a_create_that_never_arrived_still_fails(lossy, kind):
    cat, _, first, _, proxy = lossy
    refs = getattr(cat, kind)("ds")
    _every(proxy, "drop", "PUT", f"/refs/{KIND_DIR[kind]}/v1")
    with pytest.raises(StorageError, match=f"failed after {MAX_ATTEMPTS} attempts"):
        refs.create("v1", first)
    proxy.clear()
    assert not refs.exists("v1")


@pytest.mark.parametrize("kind", ["tags", "branches"])
def test_a_delete_whose_every_response_was_lost_succeeds(lossy, kind):
    cat, _, first, _, proxy = lossy
    refs = getattr(cat, kind)("ds")
    refs.create("v1", first)
    _every(proxy, "drop_response", "DELETE", f"/refs/{KIND_DIR[kind]}/v1")
    refs.delete("v1")
    proxy.clear()
    assert proxy.count("drop_response", "DELETE") == MAX_ATTEMPTS
    assert not refs.exists("v1")


@pytest.mark.parametrize("kind", ["tags", "branches"])
def test_a_delete_that_never_arrived_still_fails(lossy, kind):
    cat, _, first, _, proxy = lossy
    refs = getattr(cat, kind)("ds")
    refs.create("v1", first)
    _every(proxy, "drop", "DELETE", f"/refs/{KIND_DIR[kind]}/v1")
    with pytest.raises(StorageError, match=f"failed after {MAX_ATTEMPTS} attempts"):
        refs.delete("v1")
    proxy.clear()
    assert refs.get("v1") == first


def test_cli_snapshot_and_tag_delete_whose_every_response_was_lost_exit_0(lossy):
    cat, url, _, second, proxy = lossy
    opts = [x for k, v in _options(proxy.endpoint_url).items()
            for x in ("--storage-option", f"{k}={v}")]

    def cli(*args):
        return CliRunner().invoke(main, ["--store", url, *opts, *args], catch_exceptions=False)

    stage_samples(cat, "ds", {"c": b"3"})
    _every(proxy, "drop_response", "PUT", "/refs/heads/main")
    result = cli("snapshot", "ds", "-m", "three")
    proxy.clear()
    assert result.exit_code == 0, result.output
    head = cat.branches("ds").get("main")
    assert head != second and head in result.output
    assert cli("tag", "ds", "v1").exit_code == 0
    _every(proxy, "drop_response", "DELETE", "/refs/tags/v1")
    result = cli("tag", "ds", "v1", "--delete")
    proxy.clear()
    assert result.exit_code == 0, result.output
    assert proxy.count("drop_response") == 2 * MAX_ATTEMPTS
    assert not cat.tags("ds").exists("v1")


def test_unstage_whose_every_delete_response_was_lost_discards(lossy):
    # found by an audit: the entry was gone, but unstage exited 10 ("delete failed after
    # 3 attempts"), and with --all the entries after it were not tried
    cat, _, _, _, proxy = lossy
    entries = [stage_samples(cat, "ds", {k: k.encode()}) for k in ("x", "y")]
    _every(proxy, "drop_response", "DELETE", "/staging/")
    cat.discard_staged("ds", [e.id for e in entries])
    proxy.clear()
    assert proxy.count("drop_response", "DELETE") >= 2 * MAX_ATTEMPTS
    assert cat.staged("ds") == []
