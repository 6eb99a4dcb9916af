"""Adapters written the way a hurried pipeline writes them, for the tests of what ingest
holds an adapter to (``simstore.ingest._guard``).

``Bad`` reads ``.bad`` files; the file's text says what it does wrong. ``Judge`` raises in
``can_read`` on ``.boom`` files; ``Fussy`` raises a ``ValueError`` in ``check_options``.
"""

from __future__ import annotations

import sys

import numpy as np

from simstore.sample import Sample

BUFFER = np.zeros(8, np.float32)
BIG = np.zeros(1 << 19, np.float32)  # 2 MiB: a Zarr shard, written on the writer thread


class _Lying:
    """An array source whose reads disagree with what it declares."""

    def __init__(self, how: str) -> None:
        self.how, self.shape, self.dtype, self.reads = how, (100, 4), np.dtype(np.float32), 0

    def __getitem__(self, box):
        self.reads += 1
        full = np.arange(400, dtype=np.float32).reshape(100, 4)[box]
        if self.how == "rows":
            return full[:-1]
        if self.how == "dtype":
            return full.astype(np.float64)
        if self.how == "shape":
            return full[:, :2]
        if self.how == "raise2" and self.reads > 1:
            raise OSError("disk hiccup")
        return full


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class _Base(BaseException):
    pass


class Bad:
    name = "bad"
    version = "1"
    extensions = (".bad",)
    value = 1.0  # what a ``value`` file's sample holds (a test changes it with the version)

    def can_read(self, path, head):
        return path.endswith(".bad")

    def iter_samples(self, path, key, options):
        with open(path) as f:
            how = f.read().strip()
        if how == "eager":
            raise RuntimeError("refused before the first sample")
        return self._samples(how, key)

    def _samples(self, how, key):
        if how in ("reuse", "mutate"):
            for i in range(3):
                BUFFER[:] = i
                yield Sample(f"{key}/{i}", {"x": BUFFER})
                if how == "mutate":
                    BUFFER[:] = -1
        elif how == "reuse-big":
            for i in range(3):
                BIG[:] = i
                yield Sample(f"{key}/{i}", {"x": BIG})
        elif how in ("rows", "dtype", "shape", "raise2"):
            yield Sample(key, {"big": _Lying(how)})
        elif how == "notsample":
            yield {"key": key}
        elif how == "none":
            yield None
        elif how == "badstr":
            raise _BadStr()
        elif how == "base":
            raise _Base("out of the ordinary")
        elif how == "sysexit":
            sys.exit(3)
        elif how == "print":
            print("reading", key)
            yield Sample(key, {"x": np.ones(2, np.float32)})
        elif how == "interrupt":
            raise KeyboardInterrupt
        else:  # "good", "value"
            yield Sample(key, {"x": np.full(2, self.value, np.float32)})


class Judge(Bad):
    name = "judge"
    extensions = (".boom",)

    def can_read(self, path, head):
        if path.endswith(".boom"):
            return head.decode("ascii") == "x"  # UnicodeDecodeError on binary files
        return False


class Fussy(Bad):
    name = "fussy"
    options = frozenset({"level"})

    @staticmethod
    def check_options(options):
        int(options.get("level", 0))
