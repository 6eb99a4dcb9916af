"""``simstore`` with global options and no command prints the help, as ``simstore`` alone.

``simstore --store s1`` printed ``error: simstore: missing command`` (click's answer) while
docs/cli.md promised the help for ``simstore`` with no command.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from simstore.cli import main


def _run(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.mark.parametrize("args", [
    ["--store", "s1"],
    ["--debug"],
    ["--store", "memory://x", "--storage-option", "a=1"],
], ids=["store", "debug", "store-and-option"])
def test_global_options_and_no_command_print_the_help(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    bare = _run([])
    result = _run(args)
    assert result.exit_code == bare.exit_code == 2
    assert "missing command" not in result.output
    assert result.stdout == ""
    assert result.stderr == bare.stderr
    assert "Usage:" in result.stderr and "Commands:" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no store opened or made


def test_a_command_after_global_options_still_runs(tmp_path):
    store = str(tmp_path / "st")
    result = _run(["--store", store, "init"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "st" / "simstore.json").is_file()
