"""The ingest pipeline: source files in, content-addressed shards and a staged change out.

``ingest(sources, dataset=..., store=...)`` walks the sources, hands each file to a source
adapter (found by name in the entry-point group ``simstore.adapters``), packs the samples
into shards with a shard format (group ``simstore.shard_formats``), stores every shard under
the xxh3-128 hash of its bytes, and stages one manifest change (optionally committing it).
Core never imports ``simstore.formats``: the entry points name the implementations.

Pipeline, per task (a run of files, in key order, about one shard's worth of source bytes,
so the shard layout does not depend on the engine or the worker count)::

    file --adapter--> samples --check schema/NaN, hash, summarise--> shard writer(s)
         --close--> temp file --hash--> store.put_file(objects/<id>)

Promises and their mechanics:

- **Bounded memory**: a columnar writer buffers at most ``shard_size`` bytes of samples; a
  dense field above ``dense_threshold`` (or a lazy :class:`ArraySource`) goes to a streaming
  Zarr shard and is read in blocks of ``block_bytes``. Nothing holds a whole source file.
- **Idempotent and resumable**: after a task's shards are stored, each of its files gets a
  journal record (``journal/<dataset>/<digest>``, digest of the file's key, size, mtime and
  every parameter that shapes the output). A re-run reuses a record whose shards exist and
  reads nothing; shards are deterministic, so a redone (or retried, or duplicated) task
  stores nothing new either. An upsert stages only files whose samples differ from the
  branch head.
- **Failure leaves no reference**: staging happens once, after every task succeeded (or was
  skipped under ``on_error="skip"``); a failed run stages nothing, so no snapshot or staging
  entry references what it wrote (gc reclaims it; the journal speeds up the re-run).
- **Exact statistics**: each file's field summaries travel with its rows; the staged entry
  carries their exact merge, which a commit merges into the parent's (see simstore.stats).
- **Any engine, same bytes**: tasks run in process, on a process pool (``workers``) or on a
  dask.distributed cluster (``engine="dask"``); the plan and the tasks decide what is
  stored, the engine only where tasks run.

Modules: ``_arrays`` (array sources, streaming sample hash), ``_shards`` (shard options,
writer protocol), ``_plugins`` (entry points), ``_config`` (options, progress, result),
``_records`` (what travels between driver and workers), ``_sources`` (discovery, plan),
``_worker`` (a task), ``_journal``, ``_engine`` (local engine), ``_dask`` (dask engine),
``_driver`` (``ingest``).
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

from simstore.ingest._arrays import (
    ArraySource,
    hash_sample_blocks,
    is_array_source,
    iter_blocks,
    sample_nbytes,
    spec_of_value,
)
from simstore.ingest._config import (
    EngineName,
    IngestConfig,
    IngestOptions,
    IngestProgress,
    IngestResult,
    SkippedFile,
    TaskTiming,
)
from simstore.ingest._driver import ingest
from simstore.ingest._filehash import hash_file
from simstore.ingest._plugins import (
    ADAPTER_GROUP,
    FORMAT_GROUP,
    adapter_names,
    entry_points,
    installed_shard_formats,
    load_adapter,
    load_adapters,
    load_shard_format,
    probe_shard,
    shard_format_names,
    sniffed_format,
)
from simstore.ingest._shards import (
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    ShardOptions,
    ShardWriter,
    parse_compression,
    parse_size,
)
from simstore.ingest._sources import SupportsSampleRanges

__all__ = [
    "ADAPTER_GROUP",
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "FORMAT_GROUP",
    "ArraySource",
    "EngineName",
    "IngestConfig",
    "IngestOptions",
    "IngestProgress",
    "IngestResult",
    "ShardOptions",
    "ShardWriter",
    "SkippedFile",
    "SupportsSampleRanges",
    "TaskTiming",
    "adapter_names",
    "entry_points",
    "hash_file",
    "hash_sample_blocks",
    "installed_shard_formats",
    "ingest",
    "is_array_source",
    "iter_blocks",
    "load_adapter",
    "load_adapters",
    "load_shard_format",
    "parse_compression",
    "parse_size",
    "probe_shard",
    "sample_nbytes",
    "shard_format_names",
    "sniffed_format",
    "spec_of_value",
]


class _CallableModule(types.ModuleType):
    """Makes ``simstore.ingest(...)`` work even after the package itself was imported.

    ``simstore`` exports the function ``ingest`` lazily, but importing the package
    ``simstore.ingest`` rebinds that attribute to this module; calling the module calls
    the function, so both spellings keep working.
    """

    def __call__(
        self,
        sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        **kwargs: Any,
    ) -> IngestResult:
        return ingest(sources, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
# what inspect.signature, help() and editors show for simstore.ingest: the function's
__signature__ = inspect.signature(ingest)
