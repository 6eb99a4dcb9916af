"""SimDataset's byte sizes as strings follow simstore's one rule for sizes.

``cache_limit="1KiB"`` is 1024 bytes and ``"1KB"`` 1000, as ``--shard-size`` and ``pull
--limit`` read them; before, the loader refused ``"4096"``, ``"64K"`` and ``"1kib"``,
which ingest took.
"""

from __future__ import annotations

import os

import pytest
from loader_helpers import commit_samples, make_samples, open_test_shard
from simstore.loaders import SimDataset

from simstore.errors import InvalidInputError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = os.path.join(str(tmp_path_factory.mktemp("size_strings")), "store")
    commit_samples(path, "sim", make_samples(4), per_shard=2)
    return path


@pytest.mark.parametrize(
    ("text", "size"),
    [("1KB", 1000), ("1KiB", 1024), ("1k", 1024), ("1kib", 1024), ("4096", 4096),
     ("2.5 GB", 2_500_000_000), ("0.5MiB", 1 << 19)],
)  # fmt: skip
def test_string_sizes_follow_the_rule(store, tmp_path, text, size):
    ds = SimDataset(store, "sim", shard_opener=open_test_shard, cache_dir=str(tmp_path / "c"),
                    cache_limit=text, max_bandwidth=text)  # fmt: skip
    assert ds._options.cache is not None and ds._options.cache.limit_bytes == size
    assert ds._options.max_bandwidth == size


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cache_limit": "1 XB"}, "invalid cache_limit '1 XB': unknown unit 'XB'"),
        ({"cache_limit": "-1GiB"}, "invalid cache_limit '-1GiB': a size cannot be negative"),
        ({"max_bandwidth": "nan"}, "invalid max_bandwidth 'nan': not a finite number"),
        ({"max_bandwidth": "0.1"}, "max_bandwidth must be positive, got 0 bytes"),
        ({"shuffle_block_bytes": "1e6"}, "invalid shuffle_block_bytes '1e6': not a size"),
    ],
)
def test_bad_string_sizes_name_the_parameter(store, tmp_path, kw, message):
    kw.setdefault("cache_dir", str(tmp_path / "c"))
    with pytest.raises(InvalidInputError) as info:
        SimDataset(store, "sim", shard_opener=open_test_shard, **kw)
    assert message in str(info.value) and "\n" not in str(info.value)
