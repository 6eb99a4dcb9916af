"""Arguments that slipped past construction, now refused there naming the parameter.

normalise= constants of the wrong length for the field's components, crop/window bounds
and sizes that are not integers (NumPy integers are integers), a cache_dir that is not a
simstore cache in front of a remote store, and ``mix(samples_per_epoch=0)``.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from loader_helpers import (
    RemoteLikeStore,
    commit_samples,
    make_samples,
    open_test_shard,
    refused,
)
from simstore.loaders import SimDataLoader, SimDataset
from simstore.loaders._window import parse_regions

from simstore.errors import InvalidInputError
from simstore.sample import infer_schema


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """30 mesh samples (points (n, 3): 3 components) with statistics, in 3 shards."""
    path = os.path.join(str(tmp_path_factory.mktemp("arg_fixes")), "store")
    commit_samples(path, "sim", make_samples(30, mesh=True), with_stats=True)
    return path


def dataset(store, ref="sim", **kw):
    kw.setdefault("shard_opener", open_test_shard)
    return SimDataset(store, ref, **kw)


# -- normalise: given constants against the field's components -------------------------

@pytest.mark.parametrize(("constants", "match"), [
    # two values for three components failed at the first batch in torch's broadcast
    (([0, 0], [1, 1]), r"normalise=\{'points': \(mean, std\)\}: 'points' has 3 components, "
                       r"got 2 values each; give 1 value .* or 3"),
    ((np.zeros(4), np.ones(4)), "'points' has 3 components, got 4 values each"),
])
def test_normalise_constants_of_the_wrong_length_are_refused(store, constants, match):
    refused(match, dataset, store, fields=["points"], normalise={"points": constants})


def test_normalise_of_a_scalar_takes_one_value(store):
    refused(r"normalise=\{'step': \(mean, std\)\}: 'step' has 1 component, got 2 values each",
            dataset, store, normalise={"step": ([0, 1], [1, 1])})


def test_normalise_constants_that_fit_still_apply(store):
    plain = {s["__key__"]: s["points"] for s in dataset(store, fields=["points"],
                                                        shuffle=False)}
    for constants, mean, std in [
        (([1.0, 2.0, 3.0], [2.0, 4.0, 8.0]), np.array([1.0, 2.0, 3.0]), np.array([2, 4, 8.0])),
        ((1.0, 2.0), 1.0, 2.0),  # one value broadcasts over the components
    ]:
        ds = dataset(store, fields=["points"], shuffle=False, normalise={"points": constants})
        for s in SimDataLoader(ds, batch_size=None):
            want = (plain[s["__key__"]].numpy() - mean) / std
            assert np.allclose(s["points"].numpy(), want)


# -- crop / window: integers only (Python or NumPy, not bool) ---------------------------

@pytest.mark.parametrize(("kw", "match"), [
    ({"window": {"u": "x"}}, r"window of 'u': a size must be an integer or None, got 'x'"),
    ({"window": {"u": 2.7}}, r"window of 'u': a size must be an integer or None, got 2.7"),
    ({"window": {"u": True}}, r"window of 'u': a size must be an integer or None, got True"),
    ({"window": {"u": [np.float64(2.0)]}}, r"window of 'u': a size must be an integer"),
    ({"crop": {"u": [(0.5, 3.7)]}}, r"crop of 'u': a start or stop must be an integer or "
                                    r"None, got 0.5"),
    ({"crop": {"u": (0.5, 3)}}, r"crop of 'u': a start or stop must be an integer .*got 0.5"),
    ({"crop": {"u": (True, 3)}}, r"crop of 'u': a start or stop must be an integer .*got True"),
    ({"crop": {"u": slice(0, 2.5)}}, r"crop of 'u': a start or stop must be an integer"),
    ({"crop": {"u": ["ab"]}}, r"crop of 'u': give a slice, a \(start, stop\) pair or None"),
])
def test_regions_that_are_not_integers_are_refused(store, kw, match):
    refused(match, dataset, store, fields=["u"], **kw)


@pytest.mark.parametrize("what", ["crop", "window"])
@pytest.mark.parametrize("given", [[], 0, "", False, ()])
def test_a_crop_or_window_that_is_not_a_mapping_is_refused_even_when_empty(store, what,
                                                                          given):
    # found by an audit: a falsy value was taken for no crop at all (the whole field read)
    refused(f"{what}= takes a mapping of field name to region, got {re.escape(repr(given))}",
            dataset, store, fields=["u"], **{what: given})


def test_empty_crop_and_window_mappings_crop_nothing(store):
    assert dataset(store, fields=["u"], crop={}, window={})._sources[0].regions is None


def test_regions_take_numpy_integers(store):
    for crop in [(np.int64(0), np.int64(3)), [(np.int32(0), np.uint8(3))],
                 slice(np.int64(0), np.int64(3))]:
        crops = dataset(store, fields=["u"], crop={"u": crop})._sources[0].regions.crops
        assert crops == {"u": (slice(0, 3),)}
        assert all(type(b) is int for b in (crops["u"][0].start, crops["u"][0].stop))
    windows = dataset(store, fields=["u"], window={"u": np.int64(2)})._sources[0].regions.windows
    assert windows == {"u": (2,)} and type(windows["u"][0]) is int


def test_a_crop_pair_may_leave_one_end_open():
    # loader.md: a (start, stop) pair, None for an open end; no integer alone is a region
    # of one dimension, so (-3, None) is a pair, not two dimensions
    schema = infer_schema(make_samples(2))
    for pair, want in [((-3, None), slice(-3, None)), ((None, 5), slice(None, 5)),
                       ((2, None), slice(2, None)), ((np.int64(1), None), slice(1, None))]:
        assert parse_regions({"u": pair}, None, schema).crops == {"u": (want,)}, pair


def test_a_crop_that_keeps_nothing_is_refused():
    # a reversed pair read as an empty tensor, silently
    schema = infer_schema(make_samples(2))
    for pair in [(5, 2), (3, 3), (-1, -4), slice(4, 1)]:
        with pytest.raises(InvalidInputError, match="keeps nothing: its start must come"):
            parse_regions({"u": pair}, None, schema)
    # bounds of both signs depend on the array: checked per sample, naming it
    regions = parse_regions({"u": (-2, 1)}, None, schema)
    with pytest.raises(InvalidInputError, match="keeps nothing of the array of sample 'k'"):
        regions.box("u", (8,), seed=0, epoch=0, key="k")
    assert regions.box("u", (2,), seed=0, epoch=0, key="k") == (slice(-2, 1),)


@pytest.mark.parametrize("what", ["crop", "window"])
@pytest.mark.parametrize("empty", [[], ()])
def test_a_region_of_no_dimension_is_refused(what, empty):
    # found by an audit: an empty sequence read the whole field, silently
    schema = infer_schema(make_samples(2))
    spec = {"u": empty}
    with pytest.raises(InvalidInputError, match=f"{what} of 'u' names no dimension"):
        parse_regions(spec if what == "crop" else None, spec if what == "window" else None,
                      schema)


def test_parse_regions_keeps_python_integers():
    schema = infer_schema(make_samples(2))
    regions = parse_regions({"u": (1, 4)}, {"v": [None]}, schema)
    assert regions.crops == {"u": (slice(1, 4),)} and regions.windows == {"v": (None,)}


# -- cache_dir: refused at construction ------------------------------------------------

def test_a_foreign_cache_dir_is_refused_at_construction(store, tmp_path):
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    refused(r"cache_dir .*home is not empty and is not a simstore cache",
            dataset, RemoteLikeStore(store), cache_dir=str(foreign), cache_limit="1MiB")
    assert sorted(os.listdir(foreign)) == ["thesis.tex"]
    cache = tmp_path / "cache"  # a new directory is claimed, and reads
    assert len(list(dataset(RemoteLikeStore(store), cache_dir=str(cache)))) == 30
    assert (cache / "simstore-cache.json").exists()


# -- mix(samples_per_epoch=) -----------------------------------------------------------

@pytest.mark.parametrize("n", [0, -1, np.int64(0)])
def test_mix_refuses_epochs_without_samples(store, n):
    parts = [dataset(store, fields=["step"]), dataset(store, fields=["step"], seed=1)]
    refused(f"samples_per_epoch must be at least 1, got {int(n)}",
            SimDataset.mix, parts, samples_per_epoch=n)
    assert len(SimDataset.mix(parts, samples_per_epoch=1)) == 1
