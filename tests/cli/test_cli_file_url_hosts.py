"""``--store file://HOST/...``: a host other than empty or ``localhost`` is exit 2.

``simstore --store file://data/simstore init`` made ``./data/simstore`` (the host ``data``
read as a relative folder) and ``file://otherhost/x`` meant ``./otherhost/x``.
"""

from __future__ import annotations

import pytest
from cli_helpers import cli


@pytest.mark.parametrize("command", [["init"], ["ls"]])
def test_another_host_is_refused_with_exit_2(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    line = cli("--store", "file://data/simstore", *command, code=2)
    assert line == (
        "error: file://data/simstore: a file URL's host must be empty or localhost, got "
        "'data'; write file:///absolute/path, or a relative path as a plain path"
    )
    assert "got 'otherhost'" in cli("--store", "file://otherhost/x", *command, code=2)
    assert "got 'otherhost'" in cli(*command, code=2,
                                    env={"SIMSTORE_STORE": "file://otherhost/x"})
    assert list(tmp_path.iterdir()) == []  # no ./data/simstore, no ./otherhost/x


def test_an_empty_or_localhost_host_still_opens_the_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli("--store", f"file://{tmp_path}/st", "init", code=0)
    assert (tmp_path / "st" / "simstore.json").is_file()
    assert cli("--store", f"file://localhost{tmp_path}/st", "ls", code=0).strip() == (
        "(no datasets)"
    )
