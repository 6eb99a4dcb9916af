"""Plain Parquet via pyarrow: ~64 MiB files of ~16 MiB row groups, no compression, read by
a small ``IterableDataset``: row groups split over workers, their order and the rows
within each shuffled (seeded), samples batched with torch's ``default_collate``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from benchmarks.suite.systems.arrow_common import batches, rows_per_file, to_samples
from benchmarks.suite.systems.common import rebatch, worker


def write(pool: str, out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out, exist_ok=True)
    per_file, per_group = rows_per_file(pool)
    files = 0
    for batch in batches(pool, per_file):
        pq.write_table(pa.Table.from_batches([batch]),
                       os.path.join(out, f"part-{files:05d}.parquet"),
                       row_group_size=per_group, compression="none")
        files += 1
    return {"files": files}


def prepare(out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    return {}


class ParquetRowGroups(IterableDataset):  # type: ignore[type-arg]
    """The samples of a folder of Parquet files, by shuffled row groups."""

    def __init__(self, root: str, batch_size: int | None, seed: int = 0) -> None:
        super().__init__()
        self.paths = sorted(os.path.join(root, n) for n in os.listdir(root)
                            if n.endswith(".parquet"))
        self.batch_size = batch_size
        self.seed = seed

    def __iter__(self) -> Iterator[Any]:
        import pyarrow.parquet as pq

        index, count = worker()
        files = [pq.ParquetFile(p) for p in self.paths]
        units = [(f, g) for f in range(len(files)) for g in range(files[f].num_row_groups)]
        rng = np.random.default_rng(self.seed)
        order = rng.permutation(len(units))[index::count]

        def samples() -> Iterator[dict[str, Any]]:
            for u in order:
                f, g = units[u]
                table = files[f].read_row_group(int(g))
                yield from to_samples(table.take(rng.permutation(table.num_rows)))

        yield from rebatch(samples(), self.batch_size)


def loader(out: str, profile: str, workers: int, batch_size: int | None,
           options: dict[str, Any], prepared: dict[str, Any]) -> Iterable[Any]:
    from torch.utils.data import DataLoader

    return DataLoader(ParquetRowGroups(out, batch_size), batch_size=None, num_workers=workers)
