"""Deterministic, physics-shaped samples: the same bytes for every system.

Three profiles:

- ``large``: ``fields`` float32 [4, 64, 64, 64] (4 MiB: smooth fields plus noise) and the
  scalar parameters ``Re`` and ``Ma`` (float64);
- ``small``: ``fields`` float32 [2, 32, 32] (8 KiB) and ``Re``;
- ``mesh``: variable-size point clouds and tetra meshes: ``points`` float32 [n, 3],
  ``pressure`` float32 [n], ``cells`` int32 [m, 4] (m = 0 for a point cloud).

The samples are generated once into a *pool*: one uncompressed ``.npz`` per sample under
``.bench/data/<profile>-<count>/``. Every system's writer reads the pool, so every system
stores exactly the same arrays. This module needs only NumPy, so the runners of both
virtual environments (the project's and the peers') import it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

MiB = 1 << 20
POOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class Profile:
    """A sample shape, its sample counts (full and quick) and the batch size read with."""

    name: str
    samples: int
    quick_samples: int
    batch_size: int | None  # None: one sample at a time (variable shapes)
    description: str


PROFILES: dict[str, Profile] = {
    "large": Profile("large", 96, 24, 8,
                     "float32 fields 4 x 64 x 64 x 64 (4 MiB) + 2 scalar parameters"),
    "small": Profile("small", 12288, 4096, 256, "float32 fields 2 x 32 x 32 (8 KiB) + 1 scalar"),
    "mesh": Profile("mesh", 768, 192, None,
                    "point clouds and tetra meshes, 500-8000 points (~145 KiB mean)"),
}


def _smooth(rng: np.random.Generator, shape: tuple[int, ...], width: float) -> np.ndarray:
    """A low-pass-filtered random field, unit standard deviation (float64)."""
    freqs = np.meshgrid(*[np.fft.fftfreq(n) for n in shape[:-1]], np.fft.rfftfreq(shape[-1]),
                        indexing="ij")
    filt = np.exp(-sum(f**2 for f in freqs) / (2 * width**2))
    spec = rng.standard_normal(filt.shape) + 1j * rng.standard_normal(filt.shape)
    field = np.fft.irfftn(spec * filt, s=shape)
    return field / (field.std() + 1e-12)


def make_sample(profile: str, i: int) -> dict[str, np.ndarray]:
    """Sample ``i`` of ``profile``: a pure function of (profile, i)."""
    rng = np.random.default_rng([POOL_VERSION, list(PROFILES).index(profile), i])
    if profile == "large":
        fields = np.empty((4, 64, 64, 64), dtype=np.float32)
        for c in range(4):
            smooth = _smooth(rng, (64, 64, 64), 0.05)
            fields[c] = smooth * (1.0 + c) + 0.02 * rng.standard_normal((64, 64, 64))
        return {"fields": fields, "Re": np.float64(100.0 + 10.0 * rng.random()),
                "Ma": np.float64(0.1 + 0.5 * rng.random())}
    if profile == "small":
        fields = np.stack([_smooth(rng, (32, 32), 0.08) for _ in range(2)])
        fields += 0.02 * rng.standard_normal(fields.shape)
        return {"fields": fields.astype(np.float32), "Re": np.float64(100.0 + rng.random())}
    if profile == "mesh":
        n = int(rng.integers(500, 8001))
        points = rng.standard_normal((n, 3)).astype(np.float32)
        pressure = (points[:, 0] ** 2 + 0.01 * rng.standard_normal(n)).astype(np.float32)
        m = 0 if i % 2 else 2 * n  # odd samples are point clouds: no cells
        cells = rng.integers(0, n, size=(m, 4), dtype=np.int32)
        return {"points": points, "pressure": pressure, "cells": cells}
    raise ValueError(f"unknown profile {profile!r}")


def sample_key(i: int) -> str:
    """The key of sample ``i`` (its pool file name without ``.npz``)."""
    return f"sample-{i:06d}"


def pool_dir(root: str, profile: str, count: int) -> str:
    """Where the pool of ``count`` samples of ``profile`` lives under ``root``."""
    return os.path.join(root, "data", f"{profile}-{count}-v{POOL_VERSION}")


def ensure_pool(root: str, profile: str, count: int) -> str:
    """Write the pool once (idempotent: a finished pool has ``pool.json``); return its path."""
    path = pool_dir(root, profile, count)
    done = os.path.join(path, "pool.json")
    if os.path.exists(done):
        return path
    os.makedirs(path, exist_ok=True)
    total = 0
    for i in range(count):
        sample = make_sample(profile, i)
        total += sum(a.nbytes for a in sample.values())
        np.savez(os.path.join(path, sample_key(i) + ".npz"), **sample)
    with open(done, "w") as f:
        json.dump({"profile": profile, "samples": count, "logical_bytes": total}, f)
    return path


def pool_info(path: str) -> dict[str, int | str]:
    """``{"profile", "samples", "logical_bytes"}`` of a finished pool."""
    with open(os.path.join(path, "pool.json")) as f:
        info: dict[str, int | str] = json.load(f)
    return info


def iter_pool(path: str) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """(key, arrays) for every sample of a pool, in key order; 0-d arrays stay 0-d."""
    count = int(pool_info(path)["samples"])
    for i in range(count):
        key = sample_key(i)
        with np.load(os.path.join(path, key + ".npz")) as z:
            yield key, {name: z[name] for name in z.files}
