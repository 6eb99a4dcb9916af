"""Collate: stacking, padded and packed meshes, through the loader and directly."""

from __future__ import annotations

import pytest
import torch
from loader_helpers import commit_samples, make_samples, open_test_shard
from simstore.loaders import Collate, SimDataLoader, SimDataset

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


def test_samples_with_different_fields_are_refused():
    with pytest.raises(InvalidInputError, match="different fields"):
        Collate()([{"x": torch.ones(1)}, {"y": torch.ones(1)}])


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
