"""A naive baseline: one uncompressed .npz (a zip of .npy arrays) per sample, ``np.load``
in a map-style ``Dataset``, shuffled by the ``DataLoader``'s sampler."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from benchmarks.suite.systems.common import to_tensors


def write(pool: str, out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.suite.data import iter_pool

    os.makedirs(out, exist_ok=True)
    for key, arrays in iter_pool(pool):
        np.savez(os.path.join(out, key + ".npz"), **arrays)
    return {}


def prepare(out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    return {}


class NpzFiles:
    """``ds[i]``: the arrays of the i-th file, as tensors."""

    def __init__(self, root: str) -> None:
        self.paths = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".npz"))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        with np.load(self.paths[i]) as z:
            return to_tensors({name: z[name] for name in z.files})


def loader(out: str, profile: str, workers: int, batch_size: int | None,
           options: dict[str, Any], prepared: dict[str, Any]) -> Iterable[Any]:
    import torch
    from torch.utils.data import DataLoader

    gen = torch.Generator()
    gen.manual_seed(0)
    return DataLoader(NpzFiles(out), batch_size=batch_size, shuffle=True, generator=gen,
                      num_workers=workers)

