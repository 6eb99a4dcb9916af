"""The long reliability stress run: the suite's faults and bad inputs, by the hundred.

    python tests/stress/run.py --trials 260

Sections (``--sections``, default all):

- ``kill``: ``--trials`` SIGKILL trials of ingest, snapshot, gc and a training loop at
  random writes and instants (tests/reliability/rel_harness.py scenarios); a trial whose
  kill point falls after the operation ended is a run but not a fault (the default 260
  trials land over 200 kills);
- ``concurrency``: ``--rounds`` rounds of N processes committing to one branch, on a local
  store, on S3 (moto) and on S3 with a share of ref updates losing their response;
- ``s3``: ``--rounds`` rounds of every proxy fault at 20 % (must finish exactly) and 70 %
  (may fail, only clearly) over ingest, commit, streaming, gc and verify;
- ``disk``: a full disk on tmpfs (when mounting is allowed) and the byte-budget store;
- ``corrupt``: random bit flips in shards, parts and snapshots: verify and the loader
  must name every one;
- ``fuzz``: ``--fuzz-examples`` damaged cases per seed file (a fifth of that for STEP,
  whose cases each start a meshing process) through the fuzz worker; the hypothesis
  seed follows from ``--seed`` and is printed.

It prints one table row per kind of fault (runs, survived, data lost, bad inputs, crashes
and hangs) with the command that reruns it, and writes everything, findings included, to
``--out`` (default tests/stress/results/stress.json). Exit status 1 when any promise broke.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reliability"))

import rel_harness as h  # noqa: E402

SECTIONS = ["kill", "concurrency", "s3", "disk", "corrupt", "fuzz"]


class Table:
    """Rows of the figures table, and every finding."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.findings: list[dict[str, Any]] = []

    def add(
        self,
        fault: str,
        runs: int,
        survived: int,
        lost: int,
        *,
        faults: int = 0,
        bad_inputs: int = 0,
        crashes: int = 0,
        hangs: int = 0,
        command: str = "",
        note: str = "",
    ) -> None:
        row = {
            "fault": fault,
            "runs": runs,
            "faults": faults,
            "survived": survived,
            "data_lost": lost,
            "bad_inputs": bad_inputs,
            "crashes": crashes,
            "hangs": hangs,
            "command": command,
            "note": note,
        }
        self.rows.append(row)
        print(
            f"  {fault}: {runs} runs, {faults} faults, {survived} survived, {lost} lost, "
            f"{bad_inputs} bad "
            f"inputs, {crashes} crashes, {hangs} hangs {note}",
            flush=True,
        )

    def markdown(self) -> str:
        lines = [
            "| fault injected | runs | faults | survived | data lost | bad inputs | crashes | "
            "hangs |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            lines.append(
                f"| {r['fault']} | {r['runs']} | {r['faults']} | {r['survived']} | "
                f"{r['data_lost']} "
                f"| {r['bad_inputs']} | {r['crashes']} | {r['hangs']} |"
            )
        return "\n".join(lines)


def _command(args: argparse.Namespace, section: str, *options: str) -> str:
    """The command that reruns one section as this run did."""
    values = " ".join(f"{o} {getattr(args, o[2:].replace('-', '_'))}" for o in options)
    return f"python tests/stress/run.py --sections {section} {values} --seed {args.seed}"


# -- kill ------------------------------------------------------------------------------
def run_kill(args: argparse.Namespace, work: str, table: Table) -> None:
    shares = {"ingest": 0.3, "snapshot": 0.25, "gc": 0.25, "train": 0.2}
    counts = {k: int(round(args.trials * v)) for k, v in shares.items()}
    counts["ingest"] += args.trials - sum(counts.values())
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*h.PRELOAD, "torch", "simstore.loaders"])
    rng = random.Random(args.seed)
    for name, n in counts.items():
        t0 = time.perf_counter()
        wd = os.path.join(work, f"kill-{name}")
        os.makedirs(wd)
        scenario = h.SCENARIOS[name](wd, ctx)
        trials = [scenario.trial(rng) for _ in range(n)]
        bad = [t.to_json() for t in trials if t.problems or t.lost or not t.converged]
        table.findings += [{"section": "kill", **b} for b in bad]
        outcomes = Counter(t.outcome for t in trials)
        table.add(
            f"SIGKILL during {name}",
            n,
            n - len(bad),
            sum(t.lost for t in trials),
            faults=outcomes["killed"],
            command=_command(args, "kill", "--trials"),
            note=f"({dict(outcomes)}; {time.perf_counter() - t0:.0f} s)",
        )


# -- S3 helpers ------------------------------------------------------------------------
class S3:
    """A moto server on 127.0.0.1 and fresh buckets, outside pytest."""

    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        from simstore.testing.s3 import make_s3_client

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        # moto's conditional writes are not atomic; S3's are (see rel_harness)
        self._atomic = h.atomic_moto_writes()
        self._atomic.__enter__()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.client = make_s3_client(self.endpoint)

    def bucket(self) -> str:
        import uuid

        name = f"stress-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def options(self, endpoint: str | None = None, attempts: int = 10) -> dict[str, Any]:
        from simstore.testing.s3 import fast_retry_options

        return fast_retry_options(endpoint or self.endpoint, attempts,
                                  read_timeout_s=0.5, connect_timeout_s=0.5)

    def close(self) -> None:
        self.server.stop()
        self._atomic.__exit__(None, None, None)


# -- concurrency -----------------------------------------------------------------------
def run_concurrency(args: argparse.Namespace, work: str, table: Table, s3: S3) -> None:
    from simstore.catalog import Catalog
    from simstore.testing.s3 import FaultProxy

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(h.PRELOAD)
    for where, writers, commits in (("local", 8, 5), ("s3", 6, 4), ("s3-lost-responses", 6, 4)):
        ok = lost = faults = 0
        for r in range(args.rounds):
            wd = os.path.join(work, f"conc-{where}-{r}")
            os.makedirs(wd)
            proxy = None
            if where == "local":
                url, options = os.path.join(wd, "store"), None
            else:
                url = f"s3://{s3.bucket()}/store"
                options = s3.options()
                if where == "s3-lost-responses":
                    proxy = FaultProxy(s3.endpoint)
                    options = s3.options(proxy.endpoint_url)
            Catalog.init(url, storage_options=options)
            if proxy is not None:
                proxy.fail_share(
                    0.25, "drop_response", seed=r, methods=["PUT"], path_contains="/refs/heads/"
                )
            try:
                attempts = h.run_writers(ctx, url, options, writers, commits, wd)
                faults += sum(a - 1 for a in attempts)  # swaps lost to another writer
                problems = h.commit_problems(
                    Catalog.open(url, storage_options=options), writers, commits
                )
            except Exception as exc:
                problems = [f"{type(exc).__name__}: {exc}"]
            finally:
                if proxy is not None:
                    faults += proxy.count("drop_response")
                    proxy.close()
            if problems:
                table.findings.append(
                    {
                        "section": "concurrency",
                        "where": where,
                        "round": r,
                        "problems": problems[:10],
                    }
                )
                lost += sum(1 for p in problems if "lost" in p or "missing" in p)
            else:
                ok += 1
        table.add(
            f"{writers} processes x {commits} commits to one branch ({where})",
            args.rounds,
            ok,
            lost,
            faults=faults,
            command=_command(args, "concurrency", "--rounds"),
            note="(faults: ref swaps lost to another writer, and responses dropped)",
        )


# -- S3 faults -------------------------------------------------------------------------
def _epoch(url: str, options: dict[str, Any], cache: str | None = None) -> dict[str, Any]:
    from simstore.loaders import SimDataset

    ds = SimDataset(url, "ds", shuffle=False, storage_options=options, cache_dir=cache)
    return {s["__key__"]: s["u"].numpy().tobytes() for s in ds}


def _expected(src: str) -> dict[str, bytes]:
    import numpy as np

    out = {}
    for name in sorted(os.listdir(src)):
        with np.load(os.path.join(src, name), allow_pickle=False) as z:
            out[name[:-4]] = z["u"].tobytes()
    return out


def _s3_step(step: str, src: str, url: str, options: dict[str, Any], wd: str) -> Any:
    from simstore.catalog import Catalog, gc
    from simstore.ingest import ingest

    if step == "ingest":
        return ingest(
            [src],
            dataset="ds",
            snapshot=True,
            message="v1",
            store=Catalog.open(url, storage_options=options),
        )
    if step == "stream":
        return _epoch(url, options)
    if step == "stream-cached":
        return _epoch(url, options, os.path.join(wd, "cache"))
    return gc(Catalog.open(url, storage_options=options), grace_s=0)


def run_s3(args: argparse.Namespace, work: str, table: Table, s3: S3) -> None:
    from simstore.catalog import Catalog, verify
    from simstore.errors import SimstoreError, StorageError
    from simstore.ingest import ingest
    from simstore.testing.s3 import FaultProxy

    for fault in ("slowdown", "drop", "drop_response", "stall", "truncate"):
        for share in (0.2, 0.7):
            runs = survived = lost = unclear = faults = failed_clearly = 0
            for r in range(args.rounds):
                runs += 1
                wd = os.path.join(work, f"s3-{fault}-{share}-{r}")
                src = os.path.join(wd, "src")
                h.write_sources(src, 0, count=8, seed=r)
                proxy = FaultProxy(s3.endpoint, stall_s=1.0)
                url = f"s3://{s3.bucket()}/store"
                clean = s3.options()
                faulty = s3.options(proxy.endpoint_url, 8 if share < 0.5 else 2)
                problems: list[str] = []
                try:
                    Catalog.init(url, storage_options=clean)
                    ingest(
                        [src],
                        dataset="ds",
                        store=Catalog.open(url, storage_options=clean),
                        snapshot=True,
                        message="v0",
                    )
                    expected0 = _expected(src)
                    h.write_sources(src, 1, count=8, seed=r)
                    expected1 = {**expected0, **_expected(src)}
                    proxy.fail_share(share, fault, seed=r)
                    errors = []
                    for step in ("ingest", "stream", "stream-cached", "gc"):
                        try:
                            got = _s3_step(step, src, url, faulty, wd)
                        except SimstoreError as exc:
                            errors.append(exc)
                            continue
                        if isinstance(got, dict) and got not in (expected0, expected1):
                            problems.append("the loader yielded data of neither snapshot")
                    proxy.clear()
                    failed_clearly += bool(errors)
                    if share < 0.5 and errors:
                        problems.append(f"failed at a 20% fault share: {errors[0]}")
                    for exc in errors:
                        if not (isinstance(exc, StorageError) and url in str(exc)):
                            unclear += 1
                            problems.append(f"unclear error {type(exc).__name__}: {exc}")
                    cat = Catalog.open(url, storage_options=clean)
                    problems += h.store_problems(cat)
                    if not verify(cat, "ds", deep=True).ok:
                        problems.append("verify failed")
                    final = _epoch(url, clean)
                    if final not in (expected0, expected1):
                        lost += 1
                        problems.append("the branch holds neither snapshot's data")
                except Exception as exc:
                    problems.append(f"{type(exc).__name__}: {exc}")
                finally:
                    faults += proxy.count(fault)
                    proxy.close()
                if problems:
                    table.findings.append(
                        {
                            "section": "s3",
                            "fault": fault,
                            "share": share,
                            "round": r,
                            "problems": problems[:10],
                        }
                    )
                else:
                    survived += 1
            table.add(
                f"S3 {fault} for {int(share * 100)}% of requests",
                runs,
                survived,
                lost,
                faults=faults,
                command=_command(args, "s3", "--rounds"),
                note=f"(faults: requests answered with the fault; {failed_clearly} runs had "
                f"a step fail with a StorageError naming the store; unclear errors: {unclear})",
            )


# -- disk ------------------------------------------------------------------------------
def run_disk(args: argparse.Namespace, work: str, table: Table) -> None:
    import numpy as np

    from simstore.catalog import Catalog
    from simstore.errors import StorageError
    from simstore.hashing import hash_file
    from simstore.ingest import ingest

    src = os.path.join(work, "disk-src")
    os.makedirs(src)
    rng = np.random.default_rng(args.seed)
    for i in range(12):
        np.savez(
            os.path.join(src, f"r{i:02d}.npz"), u=rng.standard_normal((192, 192)).astype(np.float32)
        )
    ref = Catalog.init("memory://stress-disk")
    ingest([src], dataset="ds", store=ref, snapshot=True, message="x", compression="none")
    expected = ref.snapshot(ref.resolve("ds")).content_hash

    def check(root: str, error: Exception | None) -> list[str]:
        problems = []
        if error is not None and "no space left on device" not in str(error):
            problems.append(f"unclear error: {error}")
        problems += h.store_problems(Catalog.open(root))
        for dirpath, _d, files in os.walk(os.path.join(root, "objects")):
            for name in files:
                if hash_file(os.path.join(dirpath, name))[0] != name:
                    problems.append(f"corrupt object {name}")
        return problems

    def one(root: str, store: Any, grow: Any) -> tuple[bool, list[str], bool]:
        error = None
        try:
            ingest([src], dataset="ds", store=store, snapshot=True, message="x", compression="none")
        except StorageError as exc:
            error = exc
        problems = check(root, error)
        grow()
        ingest([src], dataset="ds", store=root, snapshot=True, message="x", compression="none")
        cat = Catalog.open(root)
        converged = cat.snapshot(cat.resolve("ds")).content_hash == expected
        problems += h.store_problems(cat)
        return error is not None, problems, converged

    # a real full filesystem, when this machine lets us mount one
    sizes = [f"{k}k" for k in range(128, 2560, 64)]
    mounted = 0
    runs = survived = lost = failed = 0
    sizes = sizes[: args.rounds * 12]
    for size in sizes:
        mnt = os.path.join(work, f"mnt-{size}")
        os.makedirs(mnt)
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            break
        mounted += 1
        try:
            root = os.path.join(mnt, "store")
            Catalog.init(root)
            runs += 1
            did_fail, problems, converged = one(
                root,
                root,
                lambda m=mnt: subprocess.run(["mount", "-o", "remount,size=64m", m], check=True),
            )
            failed += did_fail
            lost += not converged
            if problems or not converged:
                table.findings.append({"section": "disk", "size": size, "problems": problems})
            else:
                survived += 1
        finally:
            subprocess.run(["umount", "-l", mnt], capture_output=True)
    if mounted:
        table.add(
            f"full disk (size-limited tmpfs, {sizes[0]} to {sizes[mounted - 1]})",
            runs,
            survived,
            lost,
            faults=failed,
            command=_command(args, "disk", "--rounds"),
            note=f"(faults: runs whose ingest ran out of space; {mounted} sizes)",
        )
    else:
        table.add("full disk (tmpfs)", 0, 0, 0, note="(mount not permitted here)")
    runs = survived = lost = failed = 0
    probe_root = os.path.join(work, "probe")
    Catalog.init(probe_root)
    probe = h.QuotaStore(probe_root, 1 << 40)
    ingest(
        [src], dataset="ds", store=Catalog(probe), snapshot=True, message="x", compression="none"
    )
    need = (1 << 40) - probe.budget
    for i in range(args.rounds * 20):
        root = os.path.join(work, f"quota-{i}")
        Catalog.init(root)
        budget = int(need * random.Random(args.seed + i).random())
        runs += 1
        did_fail, problems, converged = one(root, Catalog(h.QuotaStore(root, budget)), lambda: None)
        failed += did_fail
        lost += not converged
        if problems or not converged:
            table.findings.append({"section": "disk", "budget": budget, "problems": problems})
        else:
            survived += 1
    table.add(
        "out of space (byte-budget store substitute)",
        runs,
        survived,
        lost,
        faults=failed,
        command=_command(args, "disk", "--rounds"),
        note="(faults: runs whose ingest ran out of space)",
    )


# -- corruption ------------------------------------------------------------------------
def run_corrupt(args: argparse.Namespace, work: str, table: Table) -> None:
    from simstore.catalog import Catalog, verify
    from simstore.errors import SimstoreError
    from simstore.hashing import object_key
    from simstore.ingest import ingest

    rng = random.Random(args.seed)
    base = os.path.join(work, "corrupt-base")
    src = os.path.join(work, "corrupt-src")
    h.write_sources(src, 0, count=12, seed=4)
    Catalog.init(base)
    ingest([src], dataset="ds", store=base, snapshot=True, message="v0", shard_size=8 * 1024)
    cat = Catalog.open(base)
    sid = cat.resolve("ds")
    snap = cat.snapshot(sid)
    shards = sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})
    targets = (
        [("shard", s) for s in shards] + [("part", p.id) for p in snap.parts] + [("snapshot", sid)]
    )
    keys_of_shard: dict[str, set[str]] = {}
    for t in cat.iter_parts(snap):
        for key, shard in zip(t.column("key").to_pylist(), t.column("shard").to_pylist(),
                              strict=True):
            keys_of_shard.setdefault(shard, set()).add(key)
    reference = _samples_of(base)
    runs = caught = skipped_ok = skip_runs = 0
    for i in range(args.rounds * 40):
        kind, oid = targets[rng.randrange(len(targets))]
        root = os.path.join(work, f"corrupt-{i}")
        shutil.copytree(base, root)
        path = os.path.join(root, object_key(oid))
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            how = rng.choice(["flip", "truncate"])
            if how == "flip":
                pos = rng.randrange(len(data))
                data[pos] ^= 1 << rng.randrange(8)
            else:
                data = data[: rng.randrange(len(data))]
            f.seek(0)
            f.truncate()
            f.write(data)
        runs += 1
        problems = verify(Catalog.open(root), "ds", deep=True).problems
        named = any(oid in p for p in problems)
        try:
            from simstore.loaders import SimDataset

            list(SimDataset(root, "ds", shuffle=False))
            loader_named = False
        except SimstoreError as exc:
            loader_named = oid in str(exc)
        skip_problem = None
        if kind == "shard":  # on_corrupt="skip": the epoch goes on, nothing damaged in it
            skip_runs += 1
            skip_problem = _skip_problem(root, reference, keys_of_shard[oid])
            skipped_ok += skip_problem is None
        if named and loader_named and skip_problem is None:
            caught += 1
        else:
            table.findings.append(
                {
                    "section": "corrupt",
                    "kind": kind,
                    "how": how,
                    "verify": problems[:3],
                    "loader_named": loader_named,
                    "skip": skip_problem,
                }
            )
        shutil.rmtree(root)
    table.add(
        "bit flip or truncation of a shard, part or snapshot",
        runs,
        caught,
        0,
        faults=runs,
        command=_command(args, "corrupt", "--rounds"),
        note=f"(survived = verify --deep and the loader both name the object; of the "
        f"{skip_runs} damaged shards, {skipped_ok} read past with on_corrupt='skip': every "
        f"key once, the damaged shard's stood in for, the rest intact)",
    )


def _samples_of(root: str, **kw: object) -> list[tuple[str, bool, dict[str, object]]]:
    """``(key, is a stand-in, tensor fields)`` of one in-order epoch."""
    import torch
    from simstore.loaders import SimDataset

    return [
        (s["__key__"], bool(s["__pad__"]),
         {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor) and k != "__pad__"})
        for s in SimDataset(root, "ds", shuffle=False, **kw)  # type: ignore[arg-type]
    ]


def _skip_problem(
    root: str, reference: list[tuple[str, bool, dict[str, object]]], damaged: set[str]
) -> str | None:
    """What is wrong with an ``on_corrupt="skip"`` epoch of ``root``, or None."""
    import torch

    from simstore.errors import SimstoreError

    try:
        got = _samples_of(root, on_corrupt="skip")
    except SimstoreError as exc:
        return f"raised {exc}"
    if [k for k, _, _ in got] != [k for k, _, _ in reference]:
        return "keys differ from the intact epoch"
    want = {k: fields for k, _, fields in reference}
    for key, pad, fields in got:
        if pad and key not in damaged:
            return f"{key} stood in for, but it is not in the damaged shard"
        if not pad and any(not torch.equal(v, want[key][n])  # type: ignore[arg-type]
                           for n, v in fields.items()):
            return f"{key} differs from the intact epoch"
    return None


# -- fuzz ------------------------------------------------------------------------------
def run_fuzz(args: argparse.Namespace, work: str, table: Table) -> None:
    import rel_fuzz as rf

    hseed = args.seed * 7919 + 1
    print(f"  hypothesis seed {hseed}", flush=True)
    seeds = rf.make_seeds(work)
    worker = rf.FuzzWorker(timeout_s=30.0, log_path=os.path.join(work, "fuzz-worker.log"))
    stats = rf.FuzzStats()
    try:
        for seed in seeds:
            n = max(1, args.fuzz_examples // 5) if seed.name == "step" else args.fuzz_examples
            rf.fuzz(seed, worker, work, n, stats, hypothesis_seed=hseed)
            c = stats.counts.get(seed.name, Counter())
            print(f"    {seed.name}: {dict(c)}", flush=True)
    finally:
        worker.close()
    table.findings += [{"section": "fuzz", **f} for f in stats.findings]
    groups = (
        (
            "source files (HDF5, NetCDF-4/3, VTU, STL, STEP, npz, npy)",
            [s.name for s in seeds if s.op == "ingest"],
        ),
        (
            "manifest parts and snapshots, parsed",
            [s.name for s in seeds if s.op in ("part", "snapshot")],
        ),
        (
            "manifest parts and snapshots forged into a store (verify, log, diff, show, loader)",
            [s.name for s in seeds if s.op == "forged" and s.name != "forged-part-rows"],
        ),
        ("forged parts shorter than their snapshot entry", ["forged-part-rows"]),
    )
    for group, names in groups:
        total = Counter()
        for n in names:
            total.update(stats.counts.get(n, Counter()))
        cases = sum(total.values())
        table.add(
            f"fuzzed {group}",
            cases,
            total["ok"] + total["clear"],
            0,
            bad_inputs=cases,
            crashes=total["crash"] + total["other"],
            hangs=total["hang"],
            command=_command(args, "fuzz", "--fuzz-examples"),
            note=f"({dict(total)})",
        )


def _portable(text: str, work: str) -> str:
    """``text`` with this machine's paths made relative: the results file is committed."""
    repo = os.path.abspath(os.path.join(HERE, "..", ".."))
    text = text.replace(os.path.abspath(work), "$WORK")
    text = text.replace(repo + os.sep, "").replace(repo, ".")
    return text.replace(tempfile.gettempdir() + os.sep, "$TMP/")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=260, help="SIGKILL trials in all")
    parser.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="rounds per concurrency and S3 case; disk and corruption runs scale with it",
    )
    parser.add_argument("--fuzz-examples", type=int, default=300, help="cases per seed file")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--out", default=os.path.join(HERE, "results", "stress.json"), help="figures and findings"
    )
    parser.add_argument("--workdir", default=None, help="kept when given")
    args = parser.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    work = args.workdir or tempfile.mkdtemp(prefix="simstore-stress-")
    os.makedirs(work, exist_ok=True)
    table = Table()
    t0 = time.perf_counter()
    s3 = S3() if {"concurrency", "s3"} & set(sections) else None
    try:
        for name in sections:
            print(f"== {name}", flush=True)
            t = time.perf_counter()
            try:
                if name == "kill":
                    run_kill(args, work, table)
                elif name == "concurrency":
                    run_concurrency(args, work, table, s3)  # type: ignore[arg-type]
                elif name == "s3":
                    run_s3(args, work, table, s3)  # type: ignore[arg-type]
                elif name == "disk":
                    run_disk(args, work, table)
                elif name == "corrupt":
                    run_corrupt(args, work, table)
                elif name == "fuzz":
                    run_fuzz(args, work, table)
            except Exception:
                table.findings.append({"section": name, "crash": traceback.format_exc()})
                print(traceback.format_exc(), flush=True)
            print(f"   ({time.perf_counter() - t:.0f} s)", flush=True)
    finally:
        if s3 is not None:
            s3.close()
        kept = os.path.join(work, "findings")
        if os.path.isdir(kept):  # the inputs of fuzz findings outlive the work folder
            keep = os.path.splitext(os.path.abspath(args.out))[0] + "-findings"
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(kept, keep)
            print(f"fuzz findings' inputs kept in {keep}", flush=True)
        if args.workdir is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(work, ignore_errors=True)
    result = {
        "command": "python tests/stress/run.py " + " ".join(sys.argv[1:]),
        "args": vars(args),
        "seconds": time.perf_counter() - t0,
        "rows": table.rows,
        "findings": table.findings,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(_portable(json.dumps(result, indent=1, default=str), work) + "\n")
    print(table.markdown())
    print(
        f"{len(table.findings)} findings; {time.perf_counter() - t0:.0f} s; details in {args.out}"
    )
    return 1 if table.findings else 0


if __name__ == "__main__":
    sys.exit(main())
