"""Collate: stacking, padded and packed meshes, through the loader and directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loader_helpers import commit_samples, make_samples, open_test_shard
from simstore.loaders import Collate, SimDataLoader, SimDataset

import simstore
from simstore.catalog import Catalog
from simstore.errors import InvalidInputError


def test_pad_adds_a_mask_over_the_varying_dimensions():
    a = {"p": torch.ones(2, 3), "img": torch.ones(2, 4, 1)}
    b = {"p": torch.ones(4, 3) * 2, "img": torch.ones(3, 2, 1)}
    out = Collate(mesh="pad", pad_value=-1)([a, b])
    assert out["p"].shape == (2, 4, 3)
    assert out["p__mask"].tolist() == [[True, True, False, False], [True] * 4]
    assert (out["p"][0, 2:] == -1).all() and (out["p"][1] == 2).all()
    assert out["img"].shape == (2, 3, 4, 1) and out["img__mask"].shape == (2, 3, 4)
    assert int(out["img__mask"][0].sum()) == 8 and int(out["img__mask"][1].sum()) == 6


@pytest.mark.parametrize("pad", [float("nan"), float("inf"), 0.5, -1.0, 1e30])
def test_a_pad_value_integer_fields_cannot_hold_pads_them_with_zero(pad):
    # NaN pads the float fields; mesh cells (int64) and a uint8 field some samples lack
    # cannot hold it: a torch error mid-epoch before, now 0 where the mask says padding
    a = {"points": torch.ones(2, 3), "cells/triangle": torch.tensor([[0, 1, 1]]),
         "tag": torch.tensor([7], dtype=torch.uint8)}
    b = {"points": torch.ones(3, 3), "cells/triangle": torch.tensor([[0, 1, 2], [2, 1, 0]])}
    out = Collate(mesh="pad", pad_value=pad)([a, b])
    points = out["points"][0, 2:]
    assert (points.isnan().all() if pad != pad else (points == pad).all())
    want = int(pad) if pad == -1.0 else 0
    assert out["cells/triangle"][0, 1].tolist() == [want] * 3
    assert out["cells/triangle"].dtype == torch.int64
    assert out["tag"].tolist() == [[7], [0]] and out["tag__present"].tolist() == [True, False]


def test_a_pad_value_integer_fields_hold_pads_them():
    c = Collate(mesh="pad", pad_value=-1)
    assert c.fill_for(torch.int16) == -1 and c.fill_for(torch.uint8) == 0
    assert c.fill_for(torch.bool) is False and Collate(pad_value=1).fill_for(torch.bool) is True
    assert c.fill_for(torch.float16) == -1


def test_pack_concatenates_with_offsets_and_shifts_indices():
    a = {"points": torch.zeros(3, 3), "cells": torch.tensor([[0, 1, 2]])}
    b = {"points": torch.ones(4, 3), "cells": torch.tensor([[0, 1, 2], [1, 2, 3]])}
    out = Collate(mesh="pack", index_fields={"cells": "points"})([a, b])
    assert out["points"].shape == (7, 3)
    assert out["points__offsets"].tolist() == [0, 3, 7]
    assert out["cells"].tolist() == [[0, 1, 2], [3, 4, 5], [4, 5, 6]]
    assert out["cells__offsets"].tolist() == [0, 1, 3]


def test_pack_refuses_shapes_that_differ_beyond_the_first_dimension():
    with pytest.raises(InvalidInputError, match="cannot be packed"):
        Collate(mesh="pack")([{"x": torch.ones(2, 3)}, {"x": torch.ones(2, 4)}])


def test_a_field_some_samples_lack_is_padded_with_a_present_flag():
    a = {"u": torch.ones(2), "re": 1.5, "img": torch.ones(2, 3, dtype=torch.int32)}
    b = {"u": torch.ones(2) * 2}
    out = Collate(pad_value=-1)([b, a, b])
    assert out["re"].dtype == torch.float64 and out["re"].tolist() == [-1.0, 1.5, -1.0]
    assert out["re__present"].dtype == torch.bool
    assert out["re__present"].tolist() == [False, True, False]
    assert out["img"].shape == (3, 2, 3) and out["img"].dtype == torch.int32
    assert (out["img"][1] == 1).all() and (out["img"][[0, 2]] == -1).all()
    assert out["img__present"].tolist() == [False, True, False]
    assert "img__mask" not in out
    assert out["u"].tolist() == [[2, 2], [1, 1], [2, 2]] and "u__present" not in out


def test_samples_with_disjoint_fields_are_batched():
    out = Collate()([{"x": torch.ones(1)}, {"y": torch.full((1,), 2.0)}])
    assert out["x"].tolist() == [[1.0], [0.0]] and out["x__present"].tolist() == [True, False]
    assert out["y"].tolist() == [[0.0], [2.0]] and out["y__present"].tolist() == [False, True]


def test_a_missing_list_field_is_none():
    samples = [{"name": "a", "meta": {"k": 1}}, {"name": "b"}, {"name": "c", "meta": None}]
    out = Collate()(samples)
    assert out["name"] == ["a", "b", "c"] and "name__present" not in out
    assert out["meta"] == [{"k": 1}, None, None]
    assert out["meta__present"].tolist() == [True, False, True]


def test_a_missing_field_of_varying_shapes_is_padded_by_the_present_shapes():
    a = {"k": 0, "points": torch.ones(2, 3)}
    b = {"k": 1, "points": torch.ones(4, 3) * 2}
    out = Collate(pad_value=-1)([a, {"k": 2}, b])
    assert out["points"].shape == (3, 4, 3)
    # the mask spans only the dimension in which the present shapes vary
    assert out["points__mask"].tolist() == [[True, True, False, False], [False] * 4,
                                            [True] * 4]
    assert (out["points"][1] == -1).all() and (out["points"][2] == 2).all()
    assert out["points__present"].tolist() == [True, False, True]


def test_a_missing_packed_field_has_no_rows_and_its_indices_still_shift():
    a = {"points": torch.zeros(3, 3), "cells": torch.tensor([[0, 1, 2]])}
    b = {"points": torch.ones(4, 3), "cells": torch.tensor([[0, 1, 2], [1, 2, 3]])}
    out = Collate(mesh="pack", index_fields={"cells": "points"})([a, {}, b])
    assert out["points"].shape == (7, 3)
    assert out["points__offsets"].tolist() == [0, 3, 3, 7]
    assert out["cells"].tolist() == [[0, 1, 2], [3, 4, 5], [4, 5, 6]]
    assert out["cells__offsets"].tolist() == [0, 1, 1, 3]
    assert out["points__present"].tolist() == [True, False, True]
    assert out["cells__present"].tolist() == [True, False, True]


def test_columns_with_present_flags_match_the_samples_batch():
    samples = [{"u": torch.ones(2), "re": 2.5}, {"u": torch.zeros(2)}]
    want = Collate()(samples)
    got = Collate().columns(
        {"u": torch.stack([torch.ones(2), torch.zeros(2)]), "re": [2.5, None]},
        present={"u": [True, True], "re": [True, False]},
    )
    assert sorted(got) == sorted(want) == ["re", "re__present", "u"]
    for name in want:
        assert torch.equal(got[name], want[name])


def test_a_field_of_different_ranks_is_still_refused_when_some_samples_lack_it():
    with pytest.raises(InvalidInputError, match="different ranks"):
        Collate()([{"x": torch.ones(2)}, {}, {"x": torch.ones(2, 2)}])


@pytest.fixture(scope="module")
def evolved(tmp_path_factory):
    """A parquet store whose snapshot 1 has ``u`` (6 samples) and snapshot 2 adds ``re``
    (6 more); returns (store, {key: (u, re or None)})."""
    root = tmp_path_factory.mktemp("evolved")
    store = str(root / "store")
    Catalog.init(store)
    rng = np.random.default_rng(3)
    want: dict[str, tuple[np.ndarray, float | None]] = {}
    for part, with_re in (("a", False), ("b", True)):
        src = root / part
        src.mkdir()
        for i in range(6):
            key = f"{part}{i:02d}"
            u = rng.standard_normal((4, 5)).astype(np.float32)
            extra = {"re": np.float64(100 + len(want))} if with_re else {}
            np.savez(src / f"{key}.npz", u=u, **extra)
            want[key] = (u, 100.0 + len(want) if with_re else None)
        simstore.ingest([str(src)], dataset="d", store=store, format="parquet",
                        snapshot=True, message=part)
    return store, want


@pytest.mark.parametrize("workers", [0, 2])
def test_an_evolved_dataset_batches_through_the_loader(evolved, workers):
    store, want = evolved
    for batch_size in (3, 4):
        loader = SimDataLoader(SimDataset(store, "d", shuffle=True), batch_size=batch_size,
                               num_workers=workers,
                               multiprocessing_context="fork" if workers else None)
        seen: list[str] = []
        mixed = 0
        for batch in loader:
            keys = batch["__key__"]
            assert batch["u"].shape == (len(keys), 4, 5) and "u__present" not in batch
            has = [want[k][1] is not None for k in keys]
            if not any(has):
                assert "re" not in batch and "re__present" not in batch
            elif all(has):
                assert "re__present" not in batch
            else:
                mixed += 1
                assert batch["re__present"].tolist() == has
            for i, k in enumerate(keys):
                u, re = want[k]
                assert np.array_equal(batch["u"][i].numpy(), u)
                if any(has):
                    assert batch["re"].dtype == torch.float64
                    assert float(batch["re"][i]) == (re if re is not None else 0.0)
            seen.extend(keys)
        assert sorted(seen) == sorted(want)
        assert mixed  # the shuffle mixes the snapshots' samples in some batch


def test_a_mixture_of_sources_with_different_fields_batches(store_path):
    samples = make_samples(8)
    commit_samples(store_path, "sim", samples, per_shard=4)
    by_key = {s.key: s for s in samples}
    only_u = SimDataset(store_path, "sim", fields=["u"], shard_opener=open_test_shard, seed=1)
    with_v = SimDataset(store_path, "sim", fields=["u", "v"], shard_opener=open_test_shard)
    loader = SimDataLoader(SimDataset.mix([only_u, with_v], samples_per_epoch=16),
                           batch_size=16)
    (batch,) = list(loader)
    present = batch["v__present"]
    assert 0 < int(present.sum()) < 16
    for i, k in enumerate(batch["__key__"]):
        want = by_key[k].fields["v"] if present[i] else np.zeros(3, dtype=np.int64)
        assert np.array_equal(batch["v"][i].numpy(), want)


@pytest.mark.parametrize("mesh", ["pad", "pack"])
def test_mesh_batches_through_the_loader(store_path, mesh):
    samples = make_samples(12, mesh=True)
    commit_samples(store_path, "mesh", samples, per_shard=4)
    by_key = {s.key: s for s in samples}
    ds = SimDataset(store_path, "mesh", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=5, mesh=mesh, index_fields={"cells/triangle": "points"})
    seen = 0
    for batch in loader:
        keys = batch["__key__"]
        sizes = [by_key[k].fields["points"].shape[0] for k in keys]
        if mesh == "pad":
            assert batch["points"].shape == (len(keys), max(sizes), 3)
            assert batch["points__mask"].sum(1).tolist() == sizes
        else:
            assert batch["points__offsets"].diff().tolist() == sizes
            cells = batch["cells/triangle"]
            off = batch["cells/triangle__offsets"]
            starts = batch["points__offsets"]
            for i, k in enumerate(keys):
                want = torch.from_numpy(by_key[k].fields["cells/triangle"]) + starts[i]
                assert torch.equal(cells[off[i] : off[i + 1]], want)
        seen += len(keys)
    assert seen == 12


@pytest.mark.parametrize("mesh", ["pad", "pack"])
def test_mesh_fields_keep_their_mask_or_offsets_when_sizes_happen_to_match(mesh):
    samples = [{"points": torch.ones(4, 3), "cells/triangle": torch.zeros(2, 3, dtype=torch.int64),
                "u": torch.ones(2)} for _ in range(3)]
    out = Collate(mesh=mesh)(samples)
    suffix = "__mask" if mesh == "pad" else "__offsets"
    assert f"points{suffix}" in out and f"cells/triangle{suffix}" in out
    assert "u__mask" not in out and "u__offsets" not in out
    if mesh == "pad":
        assert out["points"].shape == (3, 4, 3) and bool(out["points__mask"].all())
        assert out["points__mask"].shape == (3, 4)
    else:
        assert out["points"].shape == (12, 3)
        assert out["points__offsets"].tolist() == [0, 4, 8, 12]


def test_an_index_field_that_is_not_integer_is_refused_naming_it():
    # found by an audit: the mapping written the wrong way round shifted the float
    # coordinates by the cells' offsets, silently
    a = {"points": torch.zeros(2, 3), "cells": torch.tensor([[0, 1]])}
    b = {"points": torch.ones(3, 3), "cells": torch.tensor([[0, 2], [1, 2]])}
    with pytest.raises(InvalidInputError, match=r"'points' holds float32 values, not integer "
                                                r"indices into 'cells'"):
        Collate(mesh="pack", index_fields={"points": "cells"})([a, b])
    out = Collate(mesh="pack", index_fields={"cells": "points"})([a, b])
    assert out["points"].tolist() == [[0.0] * 3] * 2 + [[1.0] * 3] * 3
    assert out["cells"].tolist() == [[0, 1], [2, 4], [3, 4]]


def test_a_0d_index_field_says_it_cannot_be_packed():
    samples = [{"p": torch.tensor(1), "u": torch.ones(2)}, {"p": torch.tensor(2), "u": torch.ones(3)}]
    with pytest.raises(InvalidInputError, match=r"field 'p' holds one number per sample \(0-d\)"):
        Collate(mesh="pack", index_fields={"p": "u"})(samples)


def test_a_pad_value_past_int64_pads_float_fields_and_zeroes_integer_ones():
    # found by an audit: an OverflowError from torch.full at the first padded batch
    a = {"p": torch.ones(1, 2), "c": torch.ones(1, dtype=torch.int64)}
    b = {"p": torch.ones(2, 2), "c": torch.ones(2, dtype=torch.int64)}
    out = Collate(mesh="pad", pad_value=2**70)([a, b])
    assert out["p"][0, 1].tolist() == [2.0**70] * 2 and out["c"].tolist() == [[1, 0], [1, 1]]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.uint64])
def test_packed_indices_of_a_narrow_dtype_are_shifted_in_int64(dtype):
    # found by an audit: the shift ran in the field's own dtype, so uint8 indices into a
    # batch of 3 x 200 points wrapped around ([200, 143] for [0, 199] in the second
    # sample), and int16 ones went negative
    samples = [{"nodes": torch.zeros(200, 2), "edges": torch.tensor([[0, 199]], dtype=dtype)}
               for _ in range(3)]
    out = Collate(mesh="pack", index_fields={"edges": "nodes"})(samples)
    assert out["edges"].dtype == torch.int64
    assert out["edges"].tolist() == [[0, 199], [200, 399], [400, 599]]
    assert out["nodes__offsets"].tolist() == [0, 200, 400, 600]


def test_uint64_indices_beyond_int64_are_refused_naming_the_field():
    big = torch.from_numpy(np.array([[0, 2**63]], dtype=np.uint64))
    samples = [{"nodes": torch.zeros(2, 2), "edges": big}] * 2
    with pytest.raises(InvalidInputError, match=r"'edges' holds uint64 indices beyond int64"):
        Collate(mesh="pack", index_fields={"edges": "nodes"})(samples)


def test_index_fields_shift_numpy_arrays_a_transform_returns():
    # found by an audit: the NumPy values were made tensors for the batch, but the shift
    # took the column as it came (a TypeError from torch.cat), and a float NumPy "index"
    # field skipped the check that names it
    samples = [{"points": np.zeros((n, 3), np.float32),
                "cells": np.array([[0, n - 1]], np.int64)} for n in (2, 3)]
    out = Collate(mesh="pack", index_fields={"cells": "points"})(samples)
    assert out["cells"].tolist() == [[0, 1], [2, 4]]
    as_tensors = [{k: torch.from_numpy(v) for k, v in s.items()} for s in samples]
    same = Collate(mesh="pack", index_fields={"cells": "points"})(as_tensors)
    assert all(torch.equal(out[k], same[k]) for k in same)
    with pytest.raises(InvalidInputError, match=r"'points' holds float32 values"):
        Collate(mesh="pack", index_fields={"points": "cells"})(samples)


@pytest.mark.parametrize("scalar", [np.float32(1.5), np.int8(-3), np.float16(2.0),
                                    np.bool_(True), np.uint16(7), np.complex64(1j)])
def test_numpy_scalars_keep_their_dtype_as_torchs_collate_keeps_it(scalar):
    # found by an audit: they went through Python numbers, so float32 came back float64
    # and int8 int64
    out = Collate()([{"s": scalar}, {"s": scalar}])
    expected = torch.utils.data.default_collate([scalar, scalar])
    assert out["s"].dtype == expected.dtype
    assert torch.equal(out["s"], expected)


def test_a_uint64_numpy_scalar_is_collated():
    # torch's own collate cannot take it ("an integer is required")
    out = Collate()([{"s": np.uint64(2**64 - 1)}, {"s": np.uint64(1)}])
    assert out["s"].dtype == torch.uint64
    assert out["s"].numpy().tolist() == [2**64 - 1, 1]
