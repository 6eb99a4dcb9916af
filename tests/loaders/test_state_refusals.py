"""A state of another order is refused naming the option that differs, saved and current."""

from __future__ import annotations

from loader_helpers import open_test_shard, refused
from simstore.loaders import SimDataset


def dataset(store, ref, **kw):
    return SimDataset(store, ref, shard_opener=open_test_shard, **kw)


def test_refusal_names_the_differing_order_option(small):
    store, ref, _ = small
    state = dataset(store, ref, window_shards=4).state_dict()
    err = refused(
        r"^loader state has another order: it was saved with window_shards=4, this dataset "
        r"has window_shards=8 \(",
        dataset(store, ref, window_shards=8).load_state_dict, state)
    assert "group_parts" not in str(err) and "algorithm" not in str(err)
    refused(r"saved with group_parts=4, this dataset has group_parts=2 \(",
            dataset(store, ref, window_shards=4, group_parts=2).load_state_dict, state)


def test_refusal_names_every_differing_option(small):
    store, ref, _ = small
    state = dataset(store, ref, window_shards=4).state_dict()
    err = refused(
        r"saved with shuffle=True, window_shards=4; this dataset has shuffle=False, "
        r"window_shards=8 \(",
        dataset(store, ref, shuffle=False).load_state_dict, state)
    assert len(str(err)) < 200


def test_refusal_names_a_mixture_source_and_a_missing_option(small):
    store, ref, _ = small
    a = dataset(store, ref)
    state = SimDataset.mix([a, dataset(store, ref, group_parts=2)]).state_dict()
    refused(r"saved with source 1: group_parts=2, this dataset has source 1: group_parts=4",
            SimDataset.mix([a, dataset(store, ref)]).load_state_dict, state)
    state = a.state_dict()
    state["order"] = [{k: v for k, v in state["order"][0].items() if k != "buffer_blocks"}]
    refused(r"saved with buffer_blocks=<none>, this dataset has buffer_blocks=16",
            dataset(store, ref).load_state_dict, state)


def test_edited_states_that_compare_equal_in_python_are_refused(small):
    """format_version True or 1.0 and epoch_length 200.0 equal the ints in Python; a
    remaining list with overlapping intervals was merged: each loaded without a word."""
    store, ref, _ = small
    ds = dataset(store, ref)
    good = ds.state_dict()
    n = good["epoch_length"]
    assert n >= 8
    for key, value, pattern in [
        ("format_version", True, r"^loader state format_version True, this simstore reads 1$"),
        ("format_version", 1.0, r"^loader state format_version 1\.0, this simstore reads 1$"),
        ("epoch_length", float(n), rf"^loader state has epoch_length {n}\.0, but this dataset "
                                   rf"reads {n}: "),
        ("remaining", [[0, 4], [2, n]], r"^loader state field 'remaining': \[0, 4\] and "
                                        rf"\[2, {n}\] overlap"),
    ]:
        refused(pattern, dataset(store, ref).load_state_dict, {**good, key: value})
    # the same state unedited, and one with adjacent intervals, load
    dataset(store, ref).load_state_dict(good)
    dataset(store, ref).load_state_dict({**good, "remaining": [[0, 4], [4, n]]})
