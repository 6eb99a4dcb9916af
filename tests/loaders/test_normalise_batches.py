"""``normalise=`` alone scales whole batches, bit for bit as sample by sample.

It used to run as a transform, which sends every batch down the per-sample path: with
DataLoader workers an epoch of 4 MiB samples took about ten times as long as without it
(docs/performance.md). A transform of the caller's besides keeps the per-sample path, so
the two are compared here field by field.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from simstore.loaders import SimDataLoader, SimDataset

import simstore
from simstore.catalog import Catalog


def _same(sample: dict) -> dict:
    return sample


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("norm")
    src = root / "src"
    src.mkdir()
    rng = np.random.default_rng(5)
    for i in range(40):
        np.savez(
            src / f"s{i:03d}.npz",
            vec=(rng.standard_normal((300, 3)) * [1, 10, 100] + i).astype(np.float32),
            big=rng.standard_normal((64, 64, 64)).astype(np.float32),  # 1 MiB: pooled
            half=rng.standard_normal(16).astype(np.float16),
            count=rng.integers(0, 1000, 8).astype(np.int32),
            re=np.float64(100.0 + i * 1.7),
            n=np.int64(i),
        )
    url = str(root / "store")
    Catalog.init(url)
    simstore.ingest([src], dataset="d", store=url, snapshot=True)
    return url


def _epoch(store: str, workers: int, transform, fmt_epoch: int) -> dict[str, dict]:
    ds = SimDataset(store, "d", seed=3, normalise=True, transform=transform,
                    prefetch={"chunk_bytes": 4 << 20})
    ds.set_epoch(fmt_epoch)
    loader = SimDataLoader(ds, batch_size=6, num_workers=workers)
    out: dict[str, dict] = {}
    for batch in loader:
        for j, key in enumerate(batch["__key__"]):
            out[key] = {n: batch[n][j].clone() for n in ("vec", "big", "half", "count", "re", "n")}
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_normalised_batches_equal_normalised_samples(store, workers):
    batched = _epoch(store, workers, None, 1)
    alone = _epoch(store, 0, _same, 1)  # a transform besides: sample by sample
    assert sorted(batched) == sorted(alone) and len(batched) == 40
    for key, fields in alone.items():
        for name, value in fields.items():
            got = batched[key][name]
            assert got.dtype == value.dtype and torch.equal(got, value), (key, name)
    some = next(iter(batched.values()))
    assert some["count"].dtype == torch.float32 and some["re"].dtype == torch.float64
    assert some["half"].dtype == torch.float16
    # normalised, not passed through: the vector field's components are near mean 0, std 1
    vec = torch.stack([f["vec"] for f in batched.values()]).reshape(-1, 3).double()
    assert torch.allclose(vec.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(vec.std(0), torch.ones(3, dtype=torch.float64), atol=1e-3)


def test_normalise_alone_takes_the_batch_path(store, monkeypatch):
    from simstore.loaders._normalise import Normalise

    calls = []
    real = Normalise.__call__
    monkeypatch.setattr(Normalise, "__call__", lambda self, s: calls.append(1) or real(self, s))
    assert len(_epoch(store, 0, None, 2)) == 40
    assert calls == []  # no sample went through the per-sample normaliser
    assert len(_epoch(store, 0, _same, 2)) == 40
    assert len(calls) == 40  # with a transform besides, every sample did


@pytest.fixture(scope="module")
def params_store(tmp_path_factory):
    """Scalar parameters a columnar shard gives back as Python numbers (HDF5 attributes)."""
    import h5py

    root = tmp_path_factory.mktemp("norm-params")
    src = root / "src"
    src.mkdir()
    for i in range(30):
        with h5py.File(src / f"s{i:03d}.h5", "w") as f:
            f["u"] = np.full(16, i, np.float32)
            f.attrs["steps"] = np.int64(i * 7 + 3)
            f.attrs["big"] = np.int64(1_000_003 * i + 17)
            f.attrs["on"] = bool(i % 3 == 0)
            f.attrs["re"] = 100.0 + i * 1.7
    url = str(root / "store")
    Catalog.init(url)
    simstore.ingest([src], dataset="d", store=url, snapshot=True)
    return url


def test_integer_and_bool_parameters_scale_as_they_do_sample_by_sample(params_store):
    """Scaled in float64 and then rounded, they were 1 ulp off the per-sample float32."""
    def epoch(transform):
        ds = SimDataset(params_store, "d", seed=1, normalise=True, transform=transform)
        out = {}
        for batch in SimDataLoader(ds, batch_size=4):
            for j, key in enumerate(batch["__key__"]):
                out[key] = {n: batch[n][j] for n in ("steps", "big", "on", "re", "u")}
        return out

    batched, alone = epoch(None), epoch(_same)
    assert sorted(batched) == sorted(alone) and len(batched) == 30
    for key, fields in alone.items():
        for name, value in fields.items():
            got = batched[key][name]
            assert got.dtype == value.dtype and torch.equal(got, value), (key, name)
    assert batched["s001.h5"]["steps"].dtype == torch.float32
