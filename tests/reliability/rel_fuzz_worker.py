"""The fuzz worker: a separate process that parses one mutated input per request.

Run as ``python rel_fuzz_worker.py``. It reads one JSON request per line on stdin and
answers one JSON line on its own copy of stdout (the real stdout and stderr go to the
parent's choice: native libraries print there). A request is

- ``{"op": "ingest", "path": P}``: ingest the file through the real pipeline (auto adapter,
  shards written) into a fresh in-memory store;
- ``{"op": "part", "path": P}``: decode a manifest part's bytes;
- ``{"op": "snapshot", "path": P}``: parse a snapshot's bytes;
- ``{"op": "forged", "kind": "snapshot"|"part", "path": P}``: store the bytes under their
  own hash in a real store with a valid dataset (re-pointing a snapshot at a forged part),
  move a branch to them and run what a user runs: verify (deep), log, diff, show (the
  CLI), and a loader epoch.

The answer says how the case ended: ``ok``, ``error`` (with the exception's class, whether
it is a SimstoreError and its message), plus the process's peak RSS. A native crash
kills this process and a hang never answers; the parent sees both.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from typing import Any

MEMORY_LIMIT_BYTES = 6 << 30


def _answer(out: Any, obj: dict[str, Any]) -> None:
    obj["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _ingest(path: str, n: int) -> None:
    from simstore.catalog import Catalog
    from simstore.ingest import ingest

    cat = Catalog.init(f"memory://fuzz-{os.getpid()}-{n}")
    try:
        ingest([path], dataset="f", store=cat, snapshot=True, message="fuzz", shard_size=1 << 20)
    finally:
        import fsspec

        fs = fsspec.filesystem("memory")
        fs.rm(f"/fuzz-{os.getpid()}-{n}", recursive=True)


def _part(path: str) -> None:
    from simstore.hashing import hash_file
    from simstore.manifest import MANIFEST_SCHEMA, decode_part

    with open(path, "rb") as f:
        data = f.read()
    table = decode_part(data, object_id=hash_file(path)[0])
    assert table.schema.equals(MANIFEST_SCHEMA, check_metadata=False), table.schema


def _snapshot(path: str) -> None:
    from simstore.hashing import hash_file
    from simstore.snapshot import Snapshot

    with open(path, "rb") as f:
        data = f.read()
    Snapshot.from_bytes(data, object_id=hash_file(path)[0])


class Forged:
    """A real store with one dataset, where forged snapshots and parts are planted."""

    def __init__(self, root: str) -> None:
        from simstore.catalog import Catalog

        self.root = root
        self.cat = Catalog.open(root)
        self.base = self.cat.resolve("ds")
        self.snap = self.cat.snapshot(self.base)

    def plant(self, kind: str, data: bytes) -> str:
        """Store ``data``; returns the snapshot id a branch ``fuzz`` now points at."""
        from simstore.catalog._refs import encode_ref
        from simstore.sample import canonical_json

        oid, _ = self.cat.put_object(data)
        if kind == "snapshot":
            sid = oid
        else:
            obj = self.snap.to_json()
            part = dict(obj["parts"][0])
            part["id"] = oid
            part["size_bytes"] = len(data)
            obj["parts"] = [part, *obj["parts"][1:]]
            sid, _ = self.cat.put_object(canonical_json(obj))
        self.cat.store.put("datasets/ds/refs/heads/fuzz", encode_ref(sid))
        return sid

    def run(self, kind: str, path: str) -> list[str]:
        from click.testing import CliRunner
        from simstore.cli import main

        from simstore.catalog import Catalog, verify
        from simstore.errors import SimstoreError
        from simstore.hashing import hash_bytes

        with open(path, "rb") as f:
            data = f.read()
        sid = self.plant(kind, data)
        names = [sid, hash_bytes(data)]
        cat = Catalog.open(self.root)  # no cached snapshots
        errors: list[SimstoreError] = []
        report = verify(cat, "ds@fuzz", deep=True)
        for step in (
            lambda: list(cat.log("ds@fuzz")),
            lambda: cat.diff("ds", "ds@fuzz"),
            lambda: _epoch(self.root),
        ):
            try:
                step()
            except SimstoreError as exc:
                errors.append(exc)
        result = CliRunner().invoke(main, ["--store", self.root, "show", "ds@fuzz"])
        if result.exit_code not in (0, 3, 6, 7, 2):
            raise AssertionError(f"show exited {result.exit_code}: {result.output[-300:]}")
        if errors:
            raise _Named(errors[0], names)
        if not report.ok:
            from simstore.errors import IntegrityError

            raise _Named(IntegrityError("; ".join(report.problems)), names)
        return names


class _Named(Exception):
    """A SimstoreError of a forged case, with the ids it may name."""

    def __init__(self, error: Exception, names: list[str]) -> None:
        super().__init__(str(error))
        self.error = error
        self.names = names


def _epoch(root: str) -> None:
    from simstore.loaders import SimDataset

    for sample in SimDataset(root, "ds@fuzz", shuffle=False):
        for value in sample.values():
            _ = value


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library chatter on stdout goes where stderr goes
    soft = min(
        MEMORY_LIMIT_BYTES,
        resource.getrlimit(resource.RLIMIT_DATA)[1]
        if resource.getrlimit(resource.RLIMIT_DATA)[1] > 0
        else MEMORY_LIMIT_BYTES,
    )
    resource.setrlimit(resource.RLIMIT_DATA, (soft, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    import numpy  # noqa: F401
    import simstore.formats.adapters  # noqa: F401

    from simstore.errors import SimstoreError

    forged: Forged | None = None
    _answer(out, {"status": "ready"})
    for n, line in enumerate(sys.stdin):
        req = json.loads(line)
        names: list[str] = []
        try:
            if req["op"] == "ingest":
                _ingest(req["path"], n)
            elif req["op"] == "part":
                _part(req["path"])
            elif req["op"] == "snapshot":
                _snapshot(req["path"])
            elif req["op"] == "forged":
                if forged is None or forged.root != req["store"]:
                    forged = Forged(req["store"])
                names = forged.run(req["kind"], req["path"])
            else:
                raise ValueError(f"unknown op {req['op']!r}")
        except _Named as named:
            exc = named.error
            _answer(
                out,
                {
                    "status": "error",
                    "type": type(exc).__name__,
                    "simstore": isinstance(exc, SimstoreError),
                    "message": str(exc)[:2000],
                    "names": named.names,
                },
            )
        except SimstoreError as exc:
            _answer(
                out,
                {
                    "status": "error",
                    "type": type(exc).__name__,
                    "simstore": True,
                    "message": str(exc)[:2000],
                },
            )
        except BaseException as exc:  # anything else is a finding the parent reports
            _answer(
                out,
                {
                    "status": "error",
                    "type": type(exc).__name__,
                    "simstore": False,
                    "message": str(exc)[:2000],
                    "traceback": traceback.format_exc()[-3000:],
                },
            )
        else:
            _answer(out, {"status": "ok", "names": names})


if __name__ == "__main__":
    main()
