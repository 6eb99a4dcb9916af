"""World detection and the package's pinned exports."""

from __future__ import annotations

import pickle

import pytest
import simstore.loaders as loaders
from simstore.loaders import World, detect_world

from simstore.errors import InvalidInputError, SimstoreError


def test_explicit_rank_wins_over_the_environment():
    env = {"RANK": "3", "WORLD_SIZE": "8"}
    assert detect_world(1, 2, environ=env) == World(rank=1, world_size=2)
    assert detect_world(environ=env) == World(rank=3, world_size=8)
    assert detect_world(environ={}) == World(rank=0, world_size=1)


def test_bad_worlds_are_clear_errors():
    with pytest.raises(InvalidInputError, match="rank 4 of world size 4"):
        World(rank=4, world_size=4)
    with pytest.raises(InvalidInputError, match="both"):
        detect_world(1, None)
    with pytest.raises(InvalidInputError, match="integers"):
        detect_world(environ={"RANK": "x", "WORLD_SIZE": "2"})
    # found by an audit: int() read "1_0" as 10 and other scripts' digits as numbers
    for rank, size in (("1_0", "2_0"), ("\u0661", "\u0662"), ("0x1", "2")):
        with pytest.raises(InvalidInputError, match="must be integers"):
            detect_world(environ={"RANK": rank, "WORLD_SIZE": size})
    assert detect_world(environ={"RANK": " 1\n", "WORLD_SIZE": "+2"}) == World(rank=1, world_size=2)


def test_half_a_world_in_the_environment_is_refused():
    # read as rank 0 of 1, every process of a half-configured launch read everything
    with pytest.raises(InvalidInputError, match="RANK is set in the environment but "
                                                "WORLD_SIZE is not"):
        detect_world(environ={"RANK": "3"})
    with pytest.raises(InvalidInputError, match="WORLD_SIZE is set in the environment but "
                                                "RANK is not"):
        detect_world(environ={"WORLD_SIZE": "4"})
    # given explicitly, the environment is not asked
    assert detect_world(1, 2, environ={"RANK": "3"}) == World(rank=1, world_size=2)


def test_loader_errors_pickle():
    err = InvalidInputError("cache limit of 1 bytes is smaller than shard objects/ab/ab")
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, SimstoreError) and str(again) == str(err)


def test_exports_are_pinned():
    assert sorted(loaders.__all__) == loaders.__all__
    assert loaders.__all__ == [
        "CacheConfig",
        "Collate",
        "EpochPlan",
        "Interval",
        "LoaderOptions",
        "LoaderState",
        "LoaderStats",
        "MeshMode",
        "Mixture",
        "PrefetchConfig",
        "Remainder",
        "RunReport",
        "ShardOpener",
        "SimDataLoader",
        "SimDataset",
        "TierReport",
        "World",
        "WorldDetector",
        "advance",
        "detect_world",
        "group_order",
        "plan_epoch",
        "source_layout",
    ]
