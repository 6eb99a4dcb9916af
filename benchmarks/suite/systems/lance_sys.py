"""Lance: ``lance.write_dataset`` (~64 MiB files, ~16 MiB row groups) read through
``lance.torch.data.LanceDataset``, fragments shuffled and split over workers by its
``ShardedFragmentSampler``. Workers start with ``spawn``, as ``lance.torch.data``'s
``get_safe_loader`` does: with ``fork`` the loader segfaulted in 1 of 3 runs here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import IterableDataset

from benchmarks.suite.systems.arrow_common import batches, rows_per_file, to_batch, to_samples
from benchmarks.suite.systems.common import worker


def write(pool: str, out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    import lance
    import pyarrow as pa

    per_file, per_group = rows_per_file(pool)
    first = next(batches(pool, 1))
    reader = pa.RecordBatchReader.from_batches(first.schema, batches(pool, per_group))
    ds = lance.write_dataset(reader, out, mode="overwrite", max_rows_per_file=per_file,
                             max_rows_per_group=per_group)
    return {"fragments": len(ds.get_fragments())}


def prepare(out: str, profile: str, options: dict[str, Any]) -> dict[str, Any]:
    return {}


def _identity(batch: Any, **_: Any) -> Any:
    return batch


class LanceStream(IterableDataset):  # type: ignore[type-arg]
    """Builds ``LanceDataset`` inside each worker with that worker's fragment sampler."""

    def __init__(self, uri: str, batch_size: int | None) -> None:
        super().__init__()
        self.uri = uri
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[Any]:
        from lance.sampler import ShardedFragmentSampler
        from lance.torch.data import LanceDataset

        index, count = worker()
        read_batch = self.batch_size or 32  # meshes: read 32 rows at a time, hand out samples
        ds = LanceDataset(self.uri, batch_size=read_batch, to_tensor_fn=_identity,
                          sampler=ShardedFragmentSampler(index, count, randomize=True, seed=0))
        for batch in ds:
            if self.batch_size is None:
                yield from to_samples(batch)
            else:
                yield to_batch(batch)


def loader(out: str, profile: str, workers: int, batch_size: int | None,
           options: dict[str, Any], prepared: dict[str, Any]) -> Iterable[Any]:
    from torch.utils.data import DataLoader

    return DataLoader(LanceStream(out, batch_size), batch_size=None, num_workers=workers,
                      multiprocessing_context="spawn" if workers else None)
