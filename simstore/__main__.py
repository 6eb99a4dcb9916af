"""``python -m simstore``: the same as the ``simstore`` command."""

from simstore._launch import main

main()
