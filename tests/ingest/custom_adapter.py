"""A third-party adapter, as docs/adapters.md writes one: CSV-like ``.xyz`` point clouds."""

import numpy as np

from simstore.errors import SourceError
from simstore.sample import Sample


class XyzAdapter:
    name = "xyz"
    version = "1"
    extensions = (".xyz",)

    def can_read(self, path, head):
        return path.endswith(".xyz")

    def iter_samples(self, path, key, options):
        try:
            points = np.loadtxt(path, ndmin=2)
        except ValueError as exc:
            raise SourceError(f"{path}: field 'points': {exc}") from exc
        yield Sample(key.removesuffix(".xyz"), {"points": points, "n": int(len(points))})
