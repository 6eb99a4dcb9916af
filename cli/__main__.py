"""``python -m simstore.cli``: the same as the ``simstore`` command."""

from simstore.cli import main

main()
