"""Fuzzing machinery shared by the suite (test_rel_fuzz.py) and the stress run.

:class:`FuzzWorker` runs :mod:`rel_fuzz_worker` in its own process and gives every case a
time limit: a case that does not answer in time is a hang, a worker that dies is a native
crash (the worker is restarted either way). :func:`mutations` is the hypothesis strategy
of byte- and token-level damage applied to a seed file, :func:`fuzz` runs ``examples``
cases of one seed and classifies each:

- ``ok``: parsed (a mutation can leave a file valid);
- ``clear``: a :class:`~simstore.errors.SimstoreError` whose message names the file;
- ``unnamed``: a SimstoreError that does not name the file;
- ``other``: any other exception (a crash, in Python terms);
- ``crash``: the worker process died (a segfault or abort in a native library);
- ``hang``: no answer within the time limit;
- ``memory``: the worker's peak RSS passed the limit.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "rel_fuzz_worker.py")
MEMORY_LIMIT_KB = 2 << 20  # 2 GiB of peak RSS for inputs of a few KiB
GOOD = ("ok", "clear")


class FuzzWorker:
    """A worker process, restarted after a crash or a hang."""

    def __init__(self, timeout_s: float = 20.0, log_path: str | None = None) -> None:
        self.timeout_s = timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, *sys.path]))
        self.proc = subprocess.Popen(
            [sys.executable, WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
        if log is not subprocess.DEVNULL:
            log.close()
        first = self._read(120.0)
        if first is None or first.get("status") != "ready":
            raise RuntimeError(f"the fuzz worker did not start: {first}")

    def _read(self, timeout_s: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:
            return {"status": "died"}
        return json.loads(line)  # type: ignore[no-any-return]

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """One case; the answer, or ``{"status": "hang"|"crash", ...}``."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        answer = self._read(self.timeout_s)
        if answer is None or answer.get("status") == "died":
            self.proc.kill()
            code = self.proc.wait()
            status = "hang" if answer is None else "crash"
            self.restarts += 1
            self._start()
            return {
                "status": status,
                "returncode": code,
                "signal": signal.Signals(-code).name if code < 0 else None,
            }
        return answer

    def restart(self) -> None:
        """A fresh process: a case that grew the peak RSS past the limit is judged alone
        (the peak of a process never comes down, so every later case would look like it)."""
        self.close()
        self.restarts += 1
        self._start()

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None


def classify(answer: dict[str, Any], names: list[str]) -> str:
    """One of ``ok clear unnamed other crash hang memory`` (see the module docstring).

    ``names``: what a clear message may name (the file, its object id); the worker adds
    the ids it planted (a forged part's snapshot).
    """
    names = names + [str(n) for n in answer.get("names", [])]
    names += _OBJECT_KEY.findall(str(answer.get("message", ""))) if "*objects" in names else []
    if answer["status"] in ("hang", "crash"):
        return str(answer["status"])
    if int(answer.get("maxrss_kb", 0)) > MEMORY_LIMIT_KB:
        return "memory"
    if answer["status"] == "ok":
        return "ok"
    if not answer.get("simstore"):
        return "other"
    message = str(answer.get("message", ""))
    return "clear" if any(n and n in message for n in names) else "unnamed"


# -- mutations -------------------------------------------------------------------------
_OBJECT_KEY = re.compile(r"objects/[0-9a-f]{2}/[0-9a-f]{32}")
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_INTERESTING = [
    b"0",
    b"-1",
    b"1e308",
    b"-1e308",
    b"nan",
    b"inf",
    b"4294967295",
    b"18446744073709551615",
    b"99999999999999999999",
    b"2147483648",
    b"1e-320",
]


@st.composite
def mutations(draw: Callable[..., Any], data: bytes, text: bool) -> bytes:
    """A damaged copy of ``data``: truncated, bit-flipped, overwritten, spliced, or (for
    text formats) with numbers swapped for extreme ones and lines dropped or repeated."""
    n = len(data)
    kinds = ["truncate", "flip", "overwrite", "delete", "insert", "magic"]
    if text:
        kinds += ["number", "number", "line"]
    kind = draw(st.sampled_from(kinds))
    out = bytearray(data)
    if kind == "truncate":
        return bytes(out[: draw(st.integers(0, max(0, n - 1)))])
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            pos = draw(st.integers(0, n - 1))
            out[pos] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    if kind == "overwrite":
        pos = draw(st.integers(0, n - 1))
        length = draw(st.integers(1, 16))
        fill = draw(st.sampled_from([b"\x00", b"\xff", b"\x7f", b"\x80"]))
        chunk = draw(st.one_of(st.just(fill * length), st.binary(min_size=1, max_size=16)))
        out[pos : pos + len(chunk)] = chunk
        return bytes(out[: max(n, pos + len(chunk))])
    if kind == "delete":
        pos = draw(st.integers(0, n - 1))
        del out[pos : pos + draw(st.integers(1, 64))]
        return bytes(out)
    if kind == "insert":
        pos = draw(st.integers(0, n))
        out[pos:pos] = draw(st.binary(min_size=1, max_size=64))
        return bytes(out)
    if kind == "magic":  # large little-endian integers where sizes and offsets live
        pos = draw(st.integers(0, max(0, n - 8)))
        value = draw(
            st.sampled_from(
                [0xFFFFFFFF, 0x7FFFFFFF, 0xFFFFFFFFFFFFFFFF, 0x8000000000000000, 1 << 40, 0]
            )
        )
        width = draw(st.sampled_from([4, 8]))
        out[pos : pos + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
        return bytes(out)
    if kind == "number":
        spans = [m.span() for m in _NUMBER.finditer(data)]
        if not spans:
            return bytes(out[: n // 2])
        start, end = spans[draw(st.integers(0, len(spans) - 1))]
        return data[:start] + draw(st.sampled_from(_INTERESTING)) + data[end:]
    lines = data.split(b"\n")
    i = draw(st.integers(0, max(0, len(lines) - 1)))
    if draw(st.booleans()):
        del lines[i]
    else:
        lines[i:i] = [lines[i]] * draw(st.integers(1, 50))
    return b"\n".join(lines)


@st.composite
def json_mutations(draw: Callable[..., Any], data: bytes) -> bytes:
    """A structurally damaged JSON object: a leaf replaced, a key dropped or a type swapped."""
    obj = json.loads(data)
    leaves: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k in sorted(node):
                leaves.append((node, k))
                walk(node[k])
        elif isinstance(node, list):
            for i in range(len(node)):
                leaves.append((node, i))
                walk(node[i])

    walk(obj)
    for _ in range(draw(st.integers(1, 3))):
        parent, key = leaves[draw(st.integers(0, len(leaves) - 1))]
        action = draw(st.sampled_from(["replace", "delete"]))
        if action == "delete":
            if isinstance(parent, dict):
                parent.pop(key, None)
            elif key < len(parent):
                parent.pop(key)
            continue
        if isinstance(parent, list) and key >= len(parent):
            continue
        parent[key] = draw(
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(-(2**70), 2**70),
                st.floats(allow_nan=False, allow_infinity=False),  # a snapshot is JSON
                st.text(max_size=40),
                st.sampled_from(
                    [
                        "../../../etc/passwd",
                        "/abs",
                        "a" * 300,
                        "\x00",
                        "ff" * 16,
                        "00000000000000000000000000000000",
                    ]
                ),
                st.lists(st.integers(-5, 5), max_size=3),
                st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
            )
        )
    return json.dumps(obj, allow_nan=False).encode()


@st.composite
def part_mutations(draw: Callable[..., Any], data: bytes, row_drops: bool) -> bytes:
    """A well-formed manifest part with damaged values: positions, shard ids, keys, rows.

    ``row_drops`` also drops rows, so the part is shorter than its snapshot entry says.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from simstore.manifest import MANIFEST_SCHEMA, encode_part

    cols = pq.read_table(pa.BufferReader(data)).to_pydict()
    n = len(cols["key"])
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, n - 1))
        columns = ["position", "shard", "key", "size_bytes", "sample_hash", "rows"]
        column = draw(st.sampled_from(columns if row_drops else columns[:-1] + ["repeat"]))
        if column == "position":
            cols["position"][i] = draw(st.sampled_from([-1, 1, 7, 2**31, 2**62, -(2**62)]))
        elif column == "size_bytes":
            cols["size_bytes"][i] = draw(st.sampled_from([-1, 0, 2**62]))
        elif column == "shard":
            cols["shard"][i] = draw(
                st.sampled_from(
                    [
                        "0" * 32,
                        "f" * 32,
                        "../../../../etc/passwd",
                        "",
                        "A" * 32,
                        "x",
                        cols["shard"][(i + 1) % n],
                    ]
                )
            )
        elif column == "key":
            cols["key"][i] = draw(
                st.sampled_from(["", "\x00", "a" * 5000, cols["key"][0], "zzzz", "../k"])
            )
        elif column == "sample_hash":
            cols["sample_hash"][i] = draw(st.binary(min_size=16, max_size=16))
        elif column == "rows" and draw(st.booleans()):  # drop a row
            for values in cols.values():
                del values[i]
            n -= 1
            if n == 0:
                break
        else:  # repeat a row
            for values in cols.values():
                values.insert(i, values[i])
            n += 1
    return encode_part(pa.table(cols, schema=MANIFEST_SCHEMA))


# -- running ---------------------------------------------------------------------------
@dataclass
class Seed:
    """A valid input to damage, and how the worker reads it."""

    name: str
    path: str
    op: str
    text: bool = False
    structured_json: bool = False
    structured_part: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class FuzzStats:
    """What a fuzz run found, by seed."""

    counts: dict[str, Counter[str]] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, seed: str, outcome: str, detail: dict[str, Any]) -> None:
        self.counts.setdefault(seed, Counter())[outcome] += 1
        if outcome not in GOOD:
            self.findings.append({"seed": seed, "outcome": outcome, **detail})

    def total(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for c in self.counts.values():
            out.update(c)
        return out


def fuzz(
    seed: Seed,
    worker: FuzzWorker,
    workdir: str,
    examples: int,
    stats: FuzzStats,
    *,
    hypothesis_seed: int | None = None,
) -> None:
    """Run ``examples`` damaged copies of ``seed`` through ``worker``, recording outcomes.

    Hypothesis generates the damage (no shrinking: a hang would make it slow), the same
    cases every time unless ``hypothesis_seed`` is given; a case's bytes are kept under
    ``workdir/findings`` when it is a finding, to reproduce it.
    """
    with open(seed.path, "rb") as f:
        original = f.read()
    if seed.structured_json:
        strategy = json_mutations(original)
    elif seed.structured_part:
        strategy = part_mutations(original, bool(seed.extra.get("row_drops")))
    else:
        strategy = mutations(original, seed.text)
    ext = os.path.splitext(seed.path)[1]
    case_path = os.path.join(workdir, f"case-{seed.name}{ext}")
    t0 = time.perf_counter()

    # deadline=None: the worker's per-case time limit bounds every case instead
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=hypothesis_seed is None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=strategy)
    def one(data: bytes) -> None:
        with open(case_path, "wb") as f:
            f.write(data)
        request = {
            "op": seed.op,
            "path": case_path,
            **{k: v for k, v in seed.extra.items() if k in ("kind", "store")},
        }
        answer = worker.run(request)
        names = [case_path, os.path.basename(case_path)]
        if seed.op in ("part", "snapshot", "forged"):
            from simstore.hashing import hash_bytes

            names.append(hash_bytes(data))
            names += seed.extra.get("names", [])
        outcome = classify(answer, names)
        if outcome == "memory":
            worker.restart()
        detail: dict[str, Any] = {}
        if outcome not in GOOD:
            keep = os.path.join(workdir, "findings")
            os.makedirs(keep, exist_ok=True)
            kept = os.path.join(keep, f"{seed.name}-{len(stats.findings)}{ext}")
            with open(kept, "wb") as f:
                f.write(data)
            detail = {
                "input": kept,
                "type": answer.get("type"),
                "message": str(answer.get("message", ""))[:400],
                "signal": answer.get("signal"),
                "traceback": str(answer.get("traceback", ""))[-1200:],
            }
        stats.add(seed.name, outcome, detail)

    if hypothesis_seed is not None:
        from hypothesis import seed as hseed

        one = hseed(hypothesis_seed)(one)
    one()
    stats.seconds += time.perf_counter() - t0


# -- seeds -----------------------------------------------------------------------------
def make_seeds(workdir: str) -> list[Seed]:
    """Small valid files of every adapter's formats, and a store's part and snapshot."""
    import numpy as np

    sys.path.insert(0, os.path.join(HERE, "..", "formats"))
    from pathlib import Path

    import source_files as sf  # noqa: E402 - the adapter tests' own writers

    d = Path(workdir) / "seeds"
    d.mkdir(parents=True, exist_ok=True)
    seeds = []
    sf.write_h5(d / "run.h5", t=4)
    seeds.append(Seed("hdf5", str(d / "run.h5"), "ingest"))
    sf.write_nc(d / "run.nc", t=4)
    seeds.append(Seed("netcdf4", str(d / "run.nc"), "ingest"))
    import netCDF4

    with netCDF4.Dataset(d / "classic.nc", "w", format="NETCDF3_CLASSIC") as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 5)
        v = ds.createVariable("p", "f4", ("t", "x"))
        v[:] = np.arange(20, dtype=np.float32).reshape(4, 5)
        ds.title = "classic"
    seeds.append(Seed("netcdf3", str(d / "classic.nc"), "ingest"))
    sf.write_mesh(d / "part.vtu")
    seeds.append(Seed("vtu", str(d / "part.vtu"), "ingest", text=True))
    import meshio

    points, triangles, _ = sf.small_mesh()
    meshio.Mesh(points, [("triangle", triangles)]).write(d / "ascii.stl", binary=False)
    seeds.append(Seed("stl-ascii", str(d / "ascii.stl"), "ingest", text=True))
    meshio.Mesh(points, [("triangle", triangles)]).write(d / "binary.stl", binary=True)
    seeds.append(Seed("stl-binary", str(d / "binary.stl"), "ingest"))
    sf.write_step(d / "part.step")
    seeds.append(Seed("step", str(d / "part.step"), "ingest", text=True))
    sf.write_npz(d / "stored.npz")
    seeds.append(Seed("npz", str(d / "stored.npz"), "ingest"))
    sf.write_npz(d / "packed.npz", compressed=True)
    seeds.append(Seed("npz-compressed", str(d / "packed.npz"), "ingest"))
    np.save(d / "array.npy", np.arange(24, dtype=np.float64).reshape(2, 3, 4))
    seeds.append(Seed("npy", str(d / "array.npy"), "ingest"))
    seeds += _store_seeds(workdir, d)
    return seeds


def _store_seeds(workdir: str, d: Any) -> list[Seed]:
    import rel_harness as h

    from simstore.catalog import Catalog
    from simstore.hashing import object_key
    from simstore.ingest import ingest

    root = os.path.join(workdir, "fuzz-store")
    src = os.path.join(workdir, "fuzz-src")
    h.write_sources(src, 0, count=6, seed=8)
    Catalog.init(root)
    ingest([src], dataset="ds", store=root, snapshot=True, message="base", shard_size=8 * 1024)
    cat = Catalog.open(root)
    sid = cat.resolve("ds")
    snap = cat.snapshot(sid)
    part = snap.parts[0].id
    with open(os.path.join(root, object_key(part)), "rb") as f:
        (d / "part.parquet").write_bytes(f.read())
    with open(os.path.join(root, object_key(sid)), "rb") as f:
        (d / "snapshot.json").write_bytes(f.read())
    # a forged case may also be named by the object it makes a reader miss
    ref = ["datasets/ds/refs/heads/fuzz", "*objects"]
    return [
        Seed("manifest-part", str(d / "part.parquet"), "part"),
        Seed("snapshot", str(d / "snapshot.json"), "snapshot", text=True),
        Seed("snapshot-fields", str(d / "snapshot.json"), "snapshot", structured_json=True),
        Seed(
            "forged-part",
            str(d / "part.parquet"),
            "forged",
            extra={"kind": "part", "store": root, "names": ref},
        ),
        Seed(
            "forged-part-values",
            str(d / "part.parquet"),
            "forged",
            structured_part=True,
            extra={"kind": "part", "store": root, "names": ref},
        ),
        Seed(
            "forged-part-rows",
            str(d / "part.parquet"),
            "forged",
            structured_part=True,
            extra={"kind": "part", "store": root, "names": ref, "row_drops": True},
        ),
        Seed(
            "forged-snapshot",
            str(d / "snapshot.json"),
            "forged",
            structured_json=True,
            extra={"kind": "snapshot", "store": root, "names": ref},
        ),
    ]
