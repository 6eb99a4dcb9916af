"""``file://`` URLs: an empty or ``localhost`` host is this machine; any other is refused.

``file://data/simstore`` made ``./data/simstore`` (the host ``data`` read as a relative
folder) and ``file://otherhost/x`` made ``./otherhost/x``.
"""

from __future__ import annotations

import pytest

from simstore.errors import InvalidInputError
from simstore.storage import LocalStore, local_path, open_store


@pytest.mark.parametrize(("url", "path"), [
    ("file:///data/my%20store", "/data/my store"),
    ("file://localhost/data/st", "/data/st"),
    ("file://LocalHost/data/st", "/data/st"),
    ("FILE:///data/st", "/data/st"),
])
def test_an_empty_or_localhost_host_is_this_machine(url, path):
    assert local_path(url) == path


@pytest.mark.parametrize(("url", "host"), [
    ("file://data/simstore", "data"),
    ("file://otherhost/x", "otherhost"),
    ("FILE://otherhost/x", "otherhost"),
    ("file://data", "data"),
    ("file://localhost:8080/x", "localhost:8080"),
])
def test_another_host_is_refused_naming_the_url(tmp_path, monkeypatch, url, host):
    monkeypatch.chdir(tmp_path)
    for call in (local_path, open_store):
        with pytest.raises(InvalidInputError) as info:
            call(url)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"{url}: ")
        assert f"host must be empty or localhost, got {host!r}" in message
    assert list(tmp_path.iterdir()) == []


def test_open_store_opens_the_absolute_path(tmp_path):
    store = open_store(f"file://localhost{tmp_path / 'a b'}".replace(" ", "%20"))
    assert isinstance(store, LocalStore)
    store.put("k", b"x")
    assert (tmp_path / "a b" / "k").read_bytes() == b"x"



@pytest.mark.parametrize("url", ["s3:/bkt/data", "s3:bkt/data", "S3:/bkt", "file:/data/st",
                                 "memory:/x", "https:/host/p"])
def test_a_url_with_its_slashes_mistyped_is_refused(tmp_path, monkeypatch, url):
    # "s3:/bkt/data" made a local store in ./s3:/bkt/data, and ingest wrote there
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInputError, match=r"looks like a mistyped URL \(write .*://"):
        open_store(url)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["./s3:/bkt", "notes:2026", "run:7/store"])
def test_a_folder_whose_name_holds_a_colon_is_still_a_folder(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    assert local_path(path) == path
    assert isinstance(open_store(path), LocalStore)
