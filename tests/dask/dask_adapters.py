"""A test adapter whose files misbehave by name: the failures a cluster must survive.

``*.vals`` files hold numbers (``numpy.savetxt``); one sample per file, field ``values``.
By the file name's first word:

- ``crash...``: the first time (no marker yet in ``marker_dir``) the worker process dies
  outright, as when a library segfaults or the kernel kills it; later attempts succeed;
- ``gate...``: writes ``started`` in ``marker_dir``, then waits until ``open`` exists there
  (at most ``GATE_LIMIT_S``, then fails);
- ``vanish...``: yields a lazy array whose reads fail with a ``StorageError`` (an I/O
  failure of the environment, which the pipeline does not take for bad input: anything
  else an adapter raises is), so the whole task fails; each attempt adds a line to
  ``<name>.attempts`` in ``marker_dir``;
- ``series...``: a table (``numpy.savetxt`` of a 2-D array), one sample per row, keys
  ``<key>/r<row>``; ``ValuesAdapter`` reads sample ranges of it (``sample_range``), so a
  large one is planned as several pieces; ``WholeValuesAdapter`` does not;
- anything else: an ordinary file.
"""

import os
import time

import numpy as np

from simstore.errors import StorageError
from simstore.sample import Sample

GATE_LIMIT_S = 300.0


class _VanishingArray:
    """An ArraySource whose every read fails."""

    shape = (64,)
    dtype = np.dtype("float64")

    def __getitem__(self, key):
        raise StorageError("the source disk vanished")


class ValuesAdapter:
    name = "testvals"
    version = "1"
    extensions = (".vals",)
    supports_sample_ranges = True

    def count_samples(self, path, options):
        if os.path.basename(path).startswith("series"):
            return len(np.loadtxt(path, ndmin=2))
        return 1

    def can_read(self, path, head):
        return path.endswith(".vals")

    def iter_samples(self, path, key, options):
        stem = os.path.basename(path)
        markers = options.get("marker_dir", "")
        if stem.startswith("crash"):
            marker = os.path.join(markers, stem + ".crashed")
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(17)
        if stem.startswith("gate"):
            open(os.path.join(markers, "started"), "w").close()
            # bounded, so a test that failed before opening the gate leaves no worker
            # of the shared cluster waiting here for the tests after it
            end = time.monotonic() + GATE_LIMIT_S
            while not os.path.exists(os.path.join(markers, "open")):
                if time.monotonic() > end:
                    raise RuntimeError(f"the gate in {markers} stayed shut {GATE_LIMIT_S:g} s")
                time.sleep(0.02)
        if stem.startswith("vanish"):
            with open(os.path.join(markers, stem + ".attempts"), "a") as f:
                f.write("attempt\n")
            yield Sample(key, {"values": _VanishingArray()})
            return
        if stem.startswith("series"):
            table = np.loadtxt(path, dtype=np.float64, ndmin=2)
            start, stop = options.get("sample_range") or (0, len(table))
            for i in range(start, stop):
                yield Sample(f"{key}/r{i:04d}", {"row": table[i], "index": np.int64(i)})
            return
        yield Sample(key, {"values": np.loadtxt(path, dtype=np.float64, ndmin=1)})


class WholeValuesAdapter(ValuesAdapter):
    """The same files, without the sample-range capability: a file is always one task."""

    supports_sample_ranges = False


def write_values(folder, names):
    """One small text file of numbers per name (``<name>.vals``), for ``testvals``."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        values = np.arange(i, i + 5 + i, dtype=np.float64)
        np.savetxt(folder / f"{name}.vals", values)
    return folder
