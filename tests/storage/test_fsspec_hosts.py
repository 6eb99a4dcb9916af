"""fsspec URLs that name a host: the host goes to the filesystem, the path is the root."""

import functools
import http.server
import threading

import numpy as np
from click.testing import CliRunner
from simstore.cli import main
from simstore.loaders import SimDataset

from simstore.catalog import Catalog
from simstore.ingest import ingest
from simstore.storage import FsspecStore, open_store


def test_the_host_port_and_user_of_a_url_are_the_filesystems():
    store = open_store("ftp://user@127.0.0.1:2121/data/store/")
    assert isinstance(store, FsspecStore)
    assert store.root == "/data/store"
    assert store._url_options == {"host": "127.0.0.1", "port": 2121, "username": "user"}
    assert store._path("simstore.json") == "/data/store/simstore.json"


def test_a_store_served_over_http_reads(tmp_path):
    # a store's folder behind a plain HTTP server (read only): refs, objects, listings
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        np.savez(src / f"a{i}.npz", u=np.arange(4.0) + i)
    Catalog.init(str(tmp_path / "st"))
    ingest([str(src)], dataset="ds", store=str(tmp_path / "st"), snapshot=True, message="m")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/st"
    try:
        store = open_store(url)
        assert store.root == url
        assert store.get("simstore.json") == (tmp_path / "st" / "simstore.json").read_bytes()
        infos = {i.key: i.size_bytes for i in store.list_info("objects/")}
        assert infos and all(size == (tmp_path / "st" / key).stat().st_size
                             for key, size in infos.items())
        result = CliRunner().invoke(main, ["--store", url, "ls"])
        assert result.exit_code == 0 and "3 samples" in result.output, result.output
        ds = SimDataset(url, "ds", shuffle=False)
        got = {s["__key__"]: s["u"].numpy() for s in ds}
        assert sorted(got) == ["a0", "a1", "a2"]
        assert np.array_equal(got["a2"], np.arange(4.0) + 2)
    finally:
        server.shutdown()
        server.server_close()
