"""A third-party adapter that hands ingest field values as they are: ``.vals`` JSON files.

Each file is a JSON object (written by :mod:`json`); its members become the sample's
fields unchanged (a JSON integer is a Python int of any size), plus a small array ``x``.
The ingest, not the adapter, must refuse what cannot be stored.
"""

import json

import numpy as np

from simstore.sample import Sample


class JsonValuesAdapter:
    name = "vals"
    version = "1"
    extensions = (".vals",)

    def can_read(self, path, head):
        return path.endswith(".vals")

    def iter_samples(self, path, key, options):
        with open(path, encoding="utf-8") as f:
            fields = json.load(f)
        yield Sample(key.removesuffix(".vals"), {"x": np.arange(2.0), **fields})
