"""Batches of a field whose dtype or kind changed between snapshots, and float16 scaling.

Found by an audit of schema evolution: a padded batch took its first sample's dtype
(0.5 in a later float64 sample became 0 in an int64 batch); an unsigned and a signed
integer made torch raise without the field's name; a scalar stored as a number in old
files and as a 0-d array in new ones batched as a mixed list; ``normalise=`` worked out
float16 fields in float16 (a mean of 300.109 became 300.0, a std of 2e-8 became 0).
"""

import numpy as np
import pytest
import torch
from simstore.loaders._collate import Collate
from simstore.loaders._normalise import Normalise

from simstore.errors import InvalidInputError


def test_a_padded_batch_takes_the_promoted_dtype_of_its_samples():
    old = {"u": torch.tensor([1, 2], dtype=torch.int64)}
    new = {"u": torch.tensor([0.5, 1.75, 2.25], dtype=torch.float64)}
    batch = Collate()([old, new])
    assert batch["u"].dtype == torch.float64
    assert batch["u"][1].tolist() == [0.5, 1.75, 2.25]
    assert batch["u__mask"].tolist() == [[True, True, False], [True, True, True]]
    wide = {"u": torch.tensor([1e300, 1e-300], dtype=torch.float64)}
    narrow = {"u": torch.tensor([1.0], dtype=torch.float32)}
    batch = Collate()([narrow, wide])  # the narrower first: no overflow to inf, no 0
    assert batch["u"].dtype == torch.float64 and batch["u"][1].tolist() == [1e300, 1e-300]
    packed = Collate(mesh="pack")([{"points": old["u"]}, {"points": new["u"]}])
    assert packed["points"].dtype == torch.float64
    assert packed["points"].tolist() == [1.0, 2.0, 0.5, 1.75, 2.25]


def test_dtypes_torch_cannot_combine_are_an_error_naming_the_field():
    a = {"n": torch.tensor(3, dtype=torch.int64)}
    b = {"n": torch.tensor(4, dtype=torch.uint64)}
    with pytest.raises(InvalidInputError) as err:
        Collate()([a, b])
    msg = str(err.value)
    assert "\n" not in msg and "field 'n'" in msg and "uint64" in msg


def test_a_scalar_that_was_a_number_and_became_a_tensor_is_one_tensor_column():
    old = [{"Re": 100.25}, {"Re": 101.0}]  # an HDF5 attribute: a parameter
    new = [{"Re": torch.tensor(200.5, dtype=torch.float32)}]  # a 0-d array field
    batch = Collate()([*old, *new])
    assert isinstance(batch["Re"], torch.Tensor) and batch["Re"].dtype == torch.float64
    assert batch["Re"].tolist() == [100.25, 101.0, 200.5]
    some = Collate()([{"Re": 1}, {"x": 0}, {"Re": torch.tensor(2)}])
    assert some["Re"].tolist()[::2] == [1, 2] and some["Re__present"].tolist() == [
        True, False, True]
    with pytest.raises(InvalidInputError) as err:
        Collate()([{"s": "old"}, {"s": torch.tensor([1.0])}])
    assert "field 's'" in str(err.value) and "different kinds" in str(err.value)


def test_float16_fields_are_normalised_with_float32_constants():
    values = np.array([299.8, 300.1, 300.4, 300.15], dtype=np.float16)
    mean, std = np.array([300.109]), np.array([0.30])
    out = Normalise({"u": (mean, std)})({"u": torch.from_numpy(values)})["u"]
    assert out.dtype == torch.float16
    exact = (values.astype(np.float64) - 300.109) / 0.30
    assert np.allclose(out.numpy().astype(np.float64), exact, atol=2e-3)
    tiny = Normalise({"v": (np.array([1e-8]), np.array([2e-8]))})(
        {"v": torch.tensor([0.0, 6e-8], dtype=torch.float16)})["v"]
    assert torch.isfinite(tiny).all()
    assert np.allclose(tiny.float().numpy(), [-0.5, (6e-8 - 1e-8) / 2e-8], atol=0.2)
    bf = Normalise({"w": (mean, std)})({"w": torch.tensor([300.0], dtype=torch.bfloat16)})["w"]
    assert bf.dtype == torch.bfloat16 and abs(float(bf) - (300.0 - 300.109) / 0.3) < 0.05
