"""Bad arguments to the loader: a one-line InvalidInputError naming the parameter, at once.

Each case was accepted silently (and then did something surprising) or failed with a raw
TypeError/ValueError/AttributeError/KeyError/OverflowError/MemoryError, often only at the
first iteration. Valid inputs of the same kinds (NumPy integers, integral floats for byte
sizes) keep working and give the same results.
"""

from __future__ import annotations

import copy
import gc
import math
import os
import sys

import numpy as np
import pytest
from loader_helpers import commit_samples, keys_of, make_samples, open_test_shard, refused
from simstore.loaders import PrefetchConfig, SimDataLoader, SimDataset, World, detect_world

NAN = float("nan")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """60 samples in 6 shards of dataset 'sim' (fields u, v, step, name)."""
    path = os.path.join(str(tmp_path_factory.mktemp("bad_args")), "store")
    commit_samples(path, "sim", make_samples(60), per_shard=10)
    return path


def dataset(store, ref="sim", **kw):
    kw.setdefault("shard_opener", open_test_shard)
    return SimDataset(store, ref, **kw)


# -- SimDataset(...) ------------------------------------------------------------------

DATASET_CASES = [
    # rank / world_size: integers only (a fractional rank duplicated and skipped samples)
    ({"rank": 0.5, "world_size": 2}, "rank must be an integer, got 0.5"),
    ({"rank": "0", "world_size": "2"}, "rank must be an integer, got '0'"),
    ({"rank": True, "world_size": 2}, "rank must be an integer, got True"),
    ({"rank": 0, "world_size": 2.5}, "world_size must be an integer, got 2.5"),
    ({"rank": 0, "world_size": "2"}, "world_size must be an integer"),
    ({"rank": -1, "world_size": 2}, "rank must be non-negative"),
    # seed: 1.5 read as 1, nan and strings failed late or raw
    ({"seed": 1.5}, "seed must be an integer, got 1.5"),
    ({"seed": "1"}, "seed must be an integer, got '1'"),
    ({"seed": None}, "seed must be an integer, got None"),
    ({"seed": NAN}, "seed must be an integer, got nan"),
    ({"seed": True}, "seed must be an integer"),
    # fields
    ({"fields": 123}, "fields must be a list of field names, got 123"),
    ({"fields": [1]}, "fields: a field name must be a string, got 1"),
    # flags: a truthy string is not True
    ({"shuffle": "no"}, "shuffle must be True or False, got 'no'"),
    ({"verify": "no"}, "verify must be True or False"),
    ({"zero_copy": 0}, "zero_copy must be True or False"),
    # cache
    ({"cache_dir": 123}, "cache_dir must be a directory path, got 123"),
    ({"cache_dir": "CACHE", "cache_limit": "infGiB"}, "invalid cache_limit 'infGiB'"),
    ({"cache_dir": "CACHE", "cache_limit": 1.5}, "cache_limit must be a whole number of bytes"),
    ({"cache_dir": "CACHE", "cache_limit": math.inf}, "cache_limit must be a whole number"),
    ({"cache_dir": "CACHE", "cache_limit": [1]}, "cache_limit must be a number of bytes"),
    # bandwidth: -1 meant unlimited
    ({"max_bandwidth": -1}, "max_bandwidth must be positive, got -1"),
    ({"max_bandwidth": 0}, "max_bandwidth must be positive, got 0"),
    ({"max_bandwidth": 1.5}, "max_bandwidth must be a whole number of bytes"),
    ({"max_bandwidth": True}, "max_bandwidth must be a number of bytes"),
    # shuffle geometry
    ({"window_shards": "2"}, "window_shards must be an integer, got '2'"),
    ({"window_shards": 2.0}, "window_shards must be an integer, got 2.0"),
    ({"group_parts": None}, "group_parts must be an integer"),
    ({"shuffle_buffer_blocks": None}, "shuffle_buffer_blocks must be an integer, got None"),
    ({"shuffle_buffer_blocks": 1.5}, "shuffle_buffer_blocks must be an integer"),
    ({"shuffle_block_bytes": None}, "shuffle_block_bytes must be a number of bytes"),
    ({"shuffle_block_bytes": 0}, "shuffle_block_bytes must be positive"),
    # counts and sizes past 64-bit plans: an OverflowError inside the epoch, in a worker
    ({"window_shards": 2**63}, "window_shards must be at most 2147483648"),
    ({"group_parts": 2**64}, "group_parts must be at most"),
    ({"shuffle_buffer_blocks": 2**63}, "shuffle_buffer_blocks must be at most"),
    ({"shuffle_block_bytes": 2**63}, "shuffle_block_bytes must be at most 1 PiB"),
    ({"rank": 2**70 - 1, "world_size": 2**70}, "world_size must be at most"),
    # prefetch
    ({"prefetch": {"decode_cache_bytes": -1}}, "prefetch decode_cache_bytes must be non-neg"),
    ({"prefetch": {"chunks": 2.5}}, "prefetch: field 'chunks' must be an integer, got 2.5"),
    # logging: 0 logged at every sample
    ({"log_every_s": 0}, "log_every_s must be positive, got 0"),
    ({"log_every_s": -1}, "log_every_s must be positive"),
    ({"log_every_s": "x"}, "log_every_s must be a number, got 'x'"),
    ({"log_every_s": NAN}, "log_every_s must be finite"),
    ({"log_every_s": True}, "log_every_s must be a number"),
    # normalise: a negative std flipped signs
    ({"normalise": {"u": (0, -1)}}, "the std of 'u' must be finite and positive"),
    ({"normalise": {"u": (0, 0)}}, "the std of 'u' must be finite and positive"),
    ({"normalise": {"u": (0, math.inf)}}, "the std of 'u' must be finite and positive"),
    ({"normalise": {"u": (NAN, 1)}}, "the mean of 'u' must be finite"),
    ({"normalise": {"nope": 1}}, r"normalise=\{'nope': \(mean, std\)\}: give a \(mean, std\) pair"),
    ({"normalise": {"u": (0, 1, 2)}}, r"give a \(mean, std\) pair"),
    ({"normalise": {"u": "ab"}}, r"give a \(mean, std\) pair, got 'ab'"),
    ({"normalise": {"u": ("a", "b")}}, "the mean must be a number or a list of numbers, got 'a'"),
    ({"normalise": {"u": (0, "1")}}, "the std must be a number or a list of numbers"),
    ({"normalise": {"u": (["0"], [1])}}, "the mean must be a number"),
    ({"normalise": {"u": (True, 1)}}, "the mean must be a number"),
    # callables
    ({"world_detector": 123}, "world_detector must be callable, got 123"),
    ({"world_detector": lambda: (0, 1)}, r"world_detector returned \(0, 1\) \(tuple\), not a World"),
    ({"shard_opener": "parquet"}, "shard_opener must be callable"),
    ({"transform": 123}, "transform must be callable, got 123"),
    ({"storage_options": [1]}, r"storage_options must be a mapping, got \[1\]"),
]


@pytest.mark.parametrize(("kwargs", "match"), DATASET_CASES,
                         ids=[repr(k)[:60] for k, _ in DATASET_CASES])
def test_dataset_refuses_at_construction(store, tmp_path, kwargs, match):
    kwargs = dict(kwargs)
    if kwargs.get("cache_dir") == "CACHE":
        kwargs["cache_dir"] = str(tmp_path / "cache")
    refused(match, dataset, store, **kwargs)


@pytest.mark.parametrize(("args", "match"), [
    ((None, "sim"), "store must be a store URL or an ObjectStore, got None"),
    ((123, "sim"), "store must be a store URL or an ObjectStore, got 123"),
    (({}, "sim"), "store must be a store URL or an ObjectStore"),
    (("STORE", None), "ref must be a string such as 'name' or 'name@tag', got None"),
    (("STORE", 123), "ref must be a string.*got 123"),
])
def test_dataset_refuses_a_store_or_ref_of_the_wrong_type(store, args, match):
    args = tuple(store if a == "STORE" else a for a in args)
    refused(match, SimDataset, *args, shard_opener=open_test_shard)


def test_cache_dir_that_is_a_file_is_refused(store, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a directory\n")
    refused("cache_dir .*notes.txt' exists and is not a directory", dataset, store,
            cache_dir=str(path))
    refused("exists and is not a directory", dataset, store, cache_dir=str(path),
            cache_limit="1GiB")


def test_prefetch_config_checks_its_fields():
    refused("prefetch decode_cache_bytes must be non-negative", PrefetchConfig,
            decode_cache_bytes=-1)
    refused("prefetch shards must be an integer, got 1.5", PrefetchConfig, shards=1.5)
    refused("prefetch io_threads must be an integer, got '2'", PrefetchConfig, io_threads="2")
    refused("prefetch chunks must be at least 1", PrefetchConfig, chunks=0)
    assert PrefetchConfig(decode_cache_bytes=0).decode_cache_bytes == 0
    config = PrefetchConfig(chunks=np.int64(2), shards=np.int32(4))
    assert (config.chunks, config.shards) == (2, 4)
    assert type(config.chunks) is int and type(config.shards) is int


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"rank": 0.5, "world_size": 2}, "rank must be an integer, got 0.5"),
    ({"rank": 0, "world_size": "2"}, "world_size must be an integer"),
    ({"rank": 0, "world_size": 1, "worker": 0.0}, "worker must be an integer"),
    ({"rank": 0, "world_size": 1, "num_workers": None}, "num_workers must be an integer"),
])
def test_world_takes_integers_only(kwargs, match):
    refused(match, World, **kwargs)


def test_detect_world_takes_integers_only():
    refused("rank must be an integer, got 0.5", detect_world, 0.5, 2)
    world = detect_world(np.int64(1), np.int32(2))
    assert (world.rank, world.world_size) == (1, 2) and type(world.rank) is int


def test_world_detector_returning_no_world_is_refused_when_refreshed(store):
    answers = [World(rank=0, world_size=1)]
    ds = dataset(store, world_detector=lambda: answers[0])
    answers[0] = "rank 0"
    refused("world_detector returned 'rank 0' \\(str\\), not a World", list, ds)


def test_transform_returning_no_dict_is_named(store):
    def drop_everything(sample):
        return None

    refused("transform .*drop_everything returned NoneType, not a dict", list,
            dataset(store, transform=drop_everything))
    # inside normalise=, which wraps it, it is still the caller's transform that is named
    refused("transform .*drop_everything returned NoneType, not a dict", list,
            dataset(store, transform=drop_everything, normalise={"u": (0.0, 2.0)}))
    refused("transform .*<lambda> returned list, not a dict", list,
            dataset(store, transform=lambda s: [s]))
    # a key that is not a field name failed later, as "'int' object has no attribute"
    refused(r"transform .*<lambda> returned a dict with the key 1 \(int\): field names are",
            list, dataset(store, transform=lambda s: {1: s["step"]}))



def test_shard_opener_returning_no_reader_is_named(store):
    # found by an audit: a bare AssertionError, naming nothing
    refused(r": shard .* of snapshot .*: shard_opener returned None \(NoneType\), not a shard reader", list,
            dataset(store, shard_opener=lambda source: None))


# -- what stays valid -----------------------------------------------------------------


def test_numpy_integers_are_integers(store):
    want = keys_of(dataset(store, seed=3, rank=1, world_size=2, window_shards=4,
                           shuffle_buffer_blocks=8, prefetch={"chunks": 2}))
    got = keys_of(dataset(store, seed=np.int64(3), rank=np.int32(1),
                          world_size=np.int64(2), window_shards=np.uint8(4),
                          shuffle_buffer_blocks=np.int16(8),
                          prefetch={"chunks": np.int64(2)}))
    assert got == want and len(want) == 30


def test_integral_floats_are_byte_sizes(store, tmp_path):
    want = keys_of(dataset(store, seed=2))
    got = keys_of(dataset(store, seed=2, shuffle_block_bytes=float(4 << 20),
                          max_bandwidth=1.5e9, cache_dir=str(tmp_path / "c"),
                          cache_limit=1.5e9))
    assert got == want
    ds = dataset(store, max_bandwidth=2e6, cache_dir=str(tmp_path / "c"), cache_limit=1e9)
    assert ds._options.max_bandwidth == 2_000_000 and type(ds._options.max_bandwidth) is int
    assert ds._options.cache is not None and ds._options.cache.limit_bytes == 10**9


def test_given_normalise_constants_still_apply(store):
    plain = {s["__key__"]: s for s in dataset(store, fields=["u", "step"], zero_copy=False)}
    normed = list(dataset(store, fields=["u", "step"], zero_copy=False,
                          normalise={"u": (1.0, 2.0), "step": np.array([3, 4])}))
    assert len(normed) == 60
    for s in normed:
        want = plain[s["__key__"]]
        assert np.allclose(s["u"].numpy(), (want["u"].numpy() - 1.0) / 2.0)
        assert math.isclose(float(s["step"]), (float(want["step"]) - 3) / 4)


# -- SimDataset.mix -------------------------------------------------------------------

MIX_CASES = [
    ({"weights": "12"}, "mix: weights must be a list of numbers, got '12'"),
    ({"weights": 5}, "mix: weights must be a list of numbers, got 5"),
    ({"weights": ["a", "b"]}, r"mix: weights\[0\] must be a number, got 'a'"),
    ({"weights": [1, None]}, r"mix: weights\[1\] must be a number, got None"),
    ({"weights": [True, 1]}, r"mix: weights\[0\] must be a number"),
    ({"weights": [1, math.inf]}, r"mix: weights\[1\] must be finite"),
    # a set's order is its hashes': {3, 1} mixed 1:3
    ({"weights": {3, 1}}, "mix: weights must be a list of numbers, in order, got a set"),
    ({"samples_per_epoch": 2.5}, "samples_per_epoch must be an integer, got 2.5"),
    ({"samples_per_epoch": "4"}, "samples_per_epoch must be an integer, got '4'"),
    ({"samples_per_epoch": 10**30}, "samples_per_epoch must be at most"),
    ({"seed": "a"}, "mix: seed must be an integer, got 'a'"),
    ({"seed": -1}, "mix: seed must be non-negative, got -1"),
    ({"seed": 1.5}, "mix: seed must be an integer"),
    ({"shuffle": "no"}, "mix: shuffle must be True or False"),
]


@pytest.mark.parametrize(("kwargs", "match"), MIX_CASES,
                         ids=[repr(k)[:60] for k, _ in MIX_CASES])
def test_mix_refuses_at_construction(store, kwargs, match):
    parts = [dataset(store, fields=["step"]), dataset(store, fields=["step"])]
    refused(match, SimDataset.mix, parts, **kwargs)


def test_mix_refuses_what_is_not_a_list_of_datasets(store):
    ds = dataset(store, fields=["step"])
    refused(r"mix takes a list of SimDatasets, got one SimDataset \(for one: mix\(\[dataset\]\)\)",
            SimDataset.mix, ds)
    refused(r"mix: datasets\[0\] must be a SimDataset, got 'x'", SimDataset.mix, ["x"])
    refused(r"mix: datasets\[1\] must be a SimDataset, got None", SimDataset.mix, [ds, None])
    refused("mix: datasets must be a list of SimDatasets, got 'ab'", SimDataset.mix, "ab")
    refused("mix: datasets must be a list of SimDatasets, got 3", SimDataset.mix, 3)
    refused("mix: datasets must be a list of SimDatasets, in order, got a set",
            SimDataset.mix, {ds})


def test_mix_takes_a_dicts_keys_and_values_in_order(store):
    a, b = dataset(store, fields=["step"]), dataset(store, fields=["step"], seed=1)
    weights = {a: 1, b: 3}
    given = SimDataset.mix(weights.keys(), weights=weights.values(), seed=2)
    listed = SimDataset.mix([a, b], weights=[1, 3], seed=2)
    assert keys_of(given) == keys_of(listed)


def test_mix_takes_numpy_weights_and_seed(store):
    def mixed(**kw):
        parts = [dataset(store, fields=["step"]), dataset(store, fields=["step"], seed=1)]
        return keys_of(SimDataset.mix(parts, **kw))

    assert mixed(weights=np.array([1.0, 3.0]), seed=np.int64(2)) == mixed(weights=[1, 3], seed=2)
    assert len(mixed(samples_per_epoch=np.int64(7))) == 7


# -- SimDataLoader ----------------------------------------------------------------------

LOADER_CASES = [
    ({"batch_size": True}, "batch_size must be an integer, got True"),
    ({"batch_size": 2.5}, "batch_size must be an integer, got 2.5"),
    ({"batch_size": "4"}, "batch_size must be an integer, got '4'"),
    ({"num_workers": 1.5}, "num_workers must be an integer, got 1.5"),
    ({"num_workers": "2"}, "num_workers must be an integer"),
    ({"num_workers": -1}, "num_workers must be non-negative"),
    ({"index_fields": "x"}, "index_fields must be a mapping .*got 'x'"),
    ({"index_fields": {"nope": "u"}}, "index_fields names 'nope', which the dataset does not read"),
    ({"index_fields": {"v": "nope"}}, "index_fields names 'nope'"),
    ({"index_fields": {"v": 1}}, "index_fields: field names must be strings"),
    ({"collate_fn": 123}, "collate_fn must be callable, got 123"),
    ({"pad_value": "x"}, "pad_value must be a number, got 'x'"),
    ({"pad_value": True}, "pad_value must be a number"),
    ({"pin_memory": "yes"}, "pin_memory must be True or False"),
    ({"drop_last": "no"}, "drop_last must be True or False"),
    ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor must be at least 1, got 0"),
    ({"num_workers": 1, "prefetch_factor": 1.5}, "prefetch_factor must be an integer"),
    ({"prefetch_factor": 2}, "prefetch_factor applies only with workers"),
    ({"timeout": -1}, "timeout must be non-negative"),
    ({"timeout": "x"}, "timeout must be a number"),
    ({"worker_init_fn": 1}, "worker_init_fn must be callable"),
    ({"batch_size": None, "drop_last": True, "collate_fn": list}, "SimDataLoader: .*drop_last"),
    # found by an audit: only the literal False was refused, and torch took None, 0 and
    # np.False_ as False (batches out of order); a generator or context of another type
    # was torch's TypeError, at the first iter() or four lines long
    ({"in_order": False}, "in_order=False would make batches' order nondeterministic"),
    ({"in_order": None}, "in_order must be True or False, got None"),
    ({"in_order": 0}, "in_order must be True or False, got 0"),
    ({"in_order": np.False_}, "in_order=False would make"),
    ({"generator": 3}, "generator must be a torch.Generator, got 3"),
    ({"num_workers": 1, "multiprocessing_context": 3},
     "multiprocessing_context must be a start method's name .* got 3"),
]


@pytest.mark.parametrize(("kwargs", "match"), LOADER_CASES,
                         ids=[repr(k)[:60] for k, _ in LOADER_CASES])
def test_loader_refuses_at_construction(store, kwargs, match):
    refused(match, SimDataLoader, dataset(store), **kwargs)


def test_index_fields_are_checked_against_the_fields_read(store):
    SimDataLoader(dataset(store), mesh="pack", index_fields={"v": "u"})
    refused("index_fields names 'v', which the dataset does not read",
            SimDataLoader, dataset(store, fields=["u"]), index_fields={"v": "u"})
    # a transform may add fields: not checked then
    SimDataLoader(dataset(store, transform=dict), index_fields={"made": "u"})


def test_loader_of_a_half_started_iterator_leaves_nothing_unraisable(store, monkeypatch):
    # torch refuses prefetch_factor=0 only as its worker iterator starts (an
    # AssertionError); that half-made iterator must not fail again when collected
    loader = SimDataLoader(dataset(store), batch_size=4, num_workers=1)
    loader.prefetch_factor = 0
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    with pytest.raises(AssertionError, match="prefetch_factor"):
        iter(loader)
    gc.collect()
    assert seen == []


@pytest.mark.parametrize("collate_fn", [None, "caller"])
@pytest.mark.parametrize("batch_size", [10**12, 10**30])
def test_batch_larger_than_the_epoch_is_one_batch(store, collate_fn, batch_size):
    def collate(samples):
        return {"__key__": [s["__key__"] for s in samples],
                "__pad__": np.array([s["__pad__"] for s in samples])}

    fn = collate if collate_fn else None

    def batches(bs, **kw):
        return [keys_of([b]) for b in SimDataLoader(dataset(store, seed=5), batch_size=bs,
                                                    collate_fn=fn, **kw)]

    want = batches(60)
    assert len(want) == 1 and len(want[0]) == 60
    assert batches(batch_size) == want
    assert batches(batch_size, drop_last=True) == batches(61, drop_last=True) == []
    loader = SimDataLoader(dataset(store), batch_size=batch_size, collate_fn=fn)
    assert loader.batch_size == batch_size and len(loader) == 1
    # two ranks: one batch of each rank's 30
    ranked = SimDataLoader(dataset(store, seed=5, rank=1, world_size=2),
                           batch_size=batch_size, collate_fn=fn)
    assert [len(keys_of([b])) for b in ranked] == [30]


# -- set_epoch and load_state_dict ----------------------------------------------------

@pytest.mark.parametrize(("epoch", "match"), [
    (1.5, "epoch must be an integer, got 1.5"),
    ("1", "epoch must be an integer, got '1'"),
    (None, "epoch must be an integer"),
    (True, "epoch must be an integer"),
    (10**30, "epoch must be at most"),
])
def test_set_epoch_refuses(store, epoch, match):
    ds = dataset(store)
    refused(match, ds.set_epoch, epoch)
    refused(match, SimDataLoader(ds).set_epoch, epoch)


def test_set_epoch_takes_numpy_integers(store):
    ds = dataset(store, seed=4)
    ds.set_epoch(np.int64(2))
    assert ds.epoch == 2 and type(ds.epoch) is int
    assert type(ds.state_dict()["epoch"]) is int
    again = dataset(store, seed=4)
    again.set_epoch(2)
    assert keys_of(ds) == keys_of(again)


def _state(store):
    return dataset(store, fields=["step"]).state_dict()


@pytest.mark.parametrize(("state", "match"), [
    (None, "a loader state is the mapping state_dict\\(\\) returns, got None"),
    ([], "a loader state is the mapping state_dict\\(\\) returns, got \\[\\]"),
    ("state", "a loader state is the mapping"),
])
def test_load_state_dict_refuses_what_is_not_a_state(store, state, match):
    refused(match, dataset(store, fields=["step"]).load_state_dict, state)


@pytest.mark.parametrize("missing", ["epoch", "remaining"])
def test_load_state_dict_names_a_missing_field(store, missing):
    state = {k: v for k, v in _state(store).items() if k != missing}
    refused(f"loader state has no '{missing}'", dataset(store, fields=["step"]).load_state_dict,
            state)


DAMAGED = [
    ({"epoch": 1.9}, "loader state field 'epoch' must be an integer, got 1.9"),
    ({"epoch": "x"}, "loader state field 'epoch' must be an integer, got 'x'"),
    ({"epoch": None}, "loader state field 'epoch' must be an integer, got None"),
    ({"epoch": NAN}, "loader state field 'epoch' must be an integer, got nan"),
    ({"epoch": True}, "loader state field 'epoch' must be an integer"),
    ({"epoch": 10**30}, "loader state field 'epoch' must be at most"),
    ({"epoch": -3}, "loader state field 'epoch' must be non-negative, got -3"),
    ({"remaining": [[3, 1]]}, r"'remaining': item 0 \[3, 1\] holds no position"),
    ({"remaining": [[2, 2]]}, r"'remaining': item 0 \[2, 2\] holds no position"),
    ({"remaining": [[0.5, 2.9]]}, "'remaining': item 0 start must be an integer, got 0.5"),
    ({"remaining": [[0, 2.9]]}, "'remaining': item 0 stop must be an integer, got 2.9"),
    ({"remaining": [["0", "3"]]}, "'remaining': item 0 start must be an integer, got '0'"),
    ({"remaining": "x"}, "'remaining' must be a list of \\[start, stop\\] pairs.*got 'x'"),
    ({"remaining": None}, "'remaining' must be a list of \\[start, stop\\] pairs.*got None"),
    ({"remaining": [[0, 1, 2]]}, r"'remaining': item 0 must be a \[start, stop\] pair"),
    ({"remaining": [3]}, r"'remaining': item 0 must be a \[start, stop\] pair, got 3"),
    ({"remaining": ["03"]}, r"'remaining': item 0 must be a \[start, stop\] pair, got '03'"),
    ({"remaining": [[-1, 2]]}, "'remaining': item 0 start must be non-negative"),
    ({"remaining": [[0, 61]]}, "'remaining': item 0 stop must be at most 60, got 61"),
]


@pytest.mark.parametrize(("changes", "match"), DAMAGED,
                         ids=[repr(c)[:60] for c, _ in DAMAGED])
def test_load_state_dict_refuses_a_damaged_state(store, changes, match):
    state = copy.deepcopy(_state(store))
    state.update(changes)
    ds = dataset(store, fields=["step"])
    refused(match, ds.load_state_dict, state)
    assert ds.epoch == 0 and len(keys_of(ds)) == 60  # nothing of the state was taken


def test_load_state_dict_takes_numpy_integers_and_resumes_exactly(store):
    ds = dataset(store, fields=["step"], seed=1)
    ds.set_epoch(1)
    full = keys_of(ds)
    state = copy.deepcopy(ds.state_dict())
    state["epoch"] = np.int64(1)
    state["remaining"] = [[np.int64(20), np.int32(45)], (50, 60)]
    again = dataset(store, fields=["step"], seed=1)
    again.load_state_dict(state)
    assert again.epoch == 1 and type(again.epoch) is int
    assert again.state_dict()["remaining"] == [[20, 45], [50, 60]]
    assert keys_of(again) == full[20:45] + full[50:60]


@pytest.mark.multiprocess
def test_a_loader_whose_workers_ran_refuses_to_be_copied_in_one_line(store):
    # found by an audit: pickle and deepcopy failed with "cannot pickle 'mmap.mmap'
    # object", naming nothing; before it runs workers, and without workers, a loader copies
    import copy
    import pickle

    plain = SimDataLoader(dataset(store), batch_size=2)
    list(plain)
    assert len(copy.deepcopy(plain)) == len(plain)
    assert len(pickle.loads(pickle.dumps(plain))) == len(plain)
    loader = SimDataLoader(dataset(store), batch_size=2, num_workers=2,
                           multiprocessing_context="fork")
    assert len(copy.deepcopy(loader)) == len(loader)
    list(loader)
    for copying in (copy.deepcopy, pickle.dumps):
        refused("a loader whose workers have run .* cannot be pickled or copied; make a new "
                "SimDataLoader of its dataset", copying, loader)
