"""What a store records about conditional writes stays true to the endpoint in use.

``init`` of an existing store probes again through its endpoint; a store recorded without
conditional writes refuses commits before it writes anything; the store marker must be a
simstore store's.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import FormatError, StorageError
from simstore.ingest import ingest
from simstore.storage import open_store

STRIP = frozenset({"If-None-Match", "If-Match"})


def _sources(root):
    root.mkdir()
    for i in range(3):
        np.savez(root / f"run{i}.npz", u=np.full(8, i, dtype=np.float32))
    return str(root)


def _meta(url, opts=None):
    return json.loads(open_store(url, storage_options=opts).get("simstore.json"))


def test_init_through_an_endpoint_that_ignores_conditional_writes_is_refused(
    s3_bucket, fault_proxy, tmp_path
):
    url = f"s3://{s3_bucket()}/st"
    cat = Catalog.init(url)  # straight to moto: conditional writes enforced
    assert cat.conditional_writes is True
    ingest([_sources(tmp_path / "src")], dataset="d", store=cat, snapshot=True, message="m")
    head = cat.resolve("d")
    fault_proxy.strip_headers = STRIP
    proxied = {"endpoint_url": fault_proxy.endpoint_url}
    with pytest.raises(StorageError, match="ignores conditional writes.*initialised through"):
        Catalog.init(url, storage_options=proxied)
    result = CliRunner().invoke(
        main, ["--store", url, "--storage-option", f"endpoint_url={fault_proxy.endpoint_url}",
               "init"])
    assert result.exit_code == 10
    assert "ignores conditional writes" in result.output and "yes" not in result.output
    assert _meta(url)["conditional_writes"] is True  # the record is left as it was
    assert Catalog.open(url).resolve("d") == head


def test_a_store_recorded_without_conditional_writes_commits_nothing_then_is_fixed(
    s3_bucket, fault_proxy, tmp_path
):
    url = f"s3://{s3_bucket()}/st"
    fault_proxy.strip_headers = STRIP
    proxied = {"endpoint_url": fault_proxy.endpoint_url}
    cat = Catalog.init(url, storage_options=proxied)
    assert cat.conditional_writes is False and _meta(url)["conditional_writes"] is False
    src = _sources(tmp_path / "src")
    store = open_store(url)
    before = sorted(store.list(""))
    with pytest.raises(StorageError, match="ignores conditional writes"):
        ingest([src], dataset="d", store=Catalog.open(url), snapshot=True, message="m")
    assert sorted(store.list("")) == before  # refused before any upload
    # init through an endpoint that enforces them records it; commits work from then on
    fault_proxy.strip_headers = frozenset()
    assert Catalog.init(url).conditional_writes is True
    assert _meta(url)["conditional_writes"] is True
    ingest([src], dataset="d", store=Catalog.open(url), snapshot=True, message="m")
    assert Catalog.open(url).resolve("d")


@pytest.mark.parametrize("text", [b"[1]", b"null", b'"x"', b'{"kind": "other", "format_version": 1}'])
def test_a_store_marker_that_is_not_a_stores_is_a_format_error(tmp_path, text):
    url = str(tmp_path / "st")
    Catalog.init(url)
    (tmp_path / "st" / "simstore.json").write_bytes(text)
    with pytest.raises(FormatError, match="is not a simstore store's metadata"):
        Catalog.open(url)
    result = CliRunner().invoke(main, ["--store", url, "ls"])
    assert result.exit_code == 7
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
