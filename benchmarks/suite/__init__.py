"""``python -m benchmarks``: simstore against the hardware ceilings, its tiers and peer loaders.

The driver (:mod:`.driver`) builds the data, has every system write it in its native format
and reads it back in fresh subprocesses (:mod:`.runner`), alternating systems, so that
every ratio compares runs made close together on the same bytes. See benchmarks/README.md.

Nothing here is imported by the simstore package; this package imports nothing heavy at
import time, so the peers' virtualenv can run :mod:`.runner` too.
"""
