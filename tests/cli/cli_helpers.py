"""Running the command line in tests."""

from __future__ import annotations

from click.testing import CliRunner
from simstore.cli import main


def cli(*args: str, code: int, env: dict[str, str] | None = None) -> str:
    """Run simstore; a failure must be one ``error:`` line on stderr and nothing on stdout."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)
    assert result.exit_code == code, (result.stdout, result.stderr)
    if code:
        assert result.stdout == "", result.stdout
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        return lines[0]
    return result.stdout
