"""The benchmark's driver: pools, writes, ceilings, alternating read runs, medians.

Every read is a fresh subprocess (:mod:`.runner`) in the system's virtualenv; the driver
warms the page cache with the system's files right before, samples the process tree's
resident memory while it runs, and keeps the figures of every run. Repetitions go round
all cases before the next starts, so each system's runs are spread over the same stretch
of a noisy, shared machine, and figures are medians over repetitions.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from benchmarks.suite import ceilings, peers, s3
from benchmarks.suite.data import PROFILES, ensure_pool, pool_info
from benchmarks.suite.matrix import Case, System, cases

MiB = 1 << 20
REPO = s3.REPO
RUN_TIMEOUT_S = 600
BUCKET = "bench"


@dataclass
class Config:
    """What one invocation measures."""

    root: str
    quick: bool
    reps: int
    systems: list[System]
    profiles: list[str]
    tiers: list[str]
    workers: list[int]
    s3_profiles: list[str]
    memory_systems: list[str] | None
    s3_systems: list[str] | None
    s3_workers: list[int] | None
    extras: bool
    log: Callable[[str], None] = print
    samples: dict[str, int] = field(default_factory=dict)
    """Pool sizes given on the command line (``--samples large=1024``), by profile."""


@dataclass
class Env:
    """Interpreters, pools, written data and the S3 endpoints of this invocation."""

    python: dict[str, str | None]
    notes: dict[str, str] = field(default_factory=dict)
    pools: dict[str, str] = field(default_factory=dict)
    data: dict[tuple[str, str], str] = field(default_factory=dict)
    writes: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    endpoint: str | None = None
    slow_endpoint: str | None = None
    s3_keys: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    s3_bytes: dict[tuple[str, str], int] = field(default_factory=dict)


def samples_for(profile: str, quick: bool, given: dict[str, int] | None = None) -> int:
    if given and profile in given:
        return given[profile]
    p = PROFILES[profile]
    return p.quick_samples if quick else p.samples


def data_bytes(path: str) -> tuple[int, list[str]]:
    """(total bytes, files) under ``path``."""
    files = sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names)
    return sum(os.path.getsize(f) for f in files), files


# -- subprocesses ------------------------------------------------------------------------
class _RssSampler:
    """Peak of the summed RSS of a process and its descendants, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.proc, *self.proc.children(recursive=True)]
                total = 0
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_runner(python: str, args: list[str], env: dict[str, str] | None = None,
               timeout_s: float = RUN_TIMEOUT_S) -> dict[str, Any]:
    """Run :mod:`.runner` with ``args``; its RESULT plus ``peak_rss_mib`` and ``wall_s``."""
    # every system runs with cached bytecode, as an installed package has it: an
    # environment that turns the cache off would compile simstore (run from the
    # repository) in each fresh process, and not the peers (compiled at install)
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # a temporary folder of its own, removed after it: LitData leaves two lock files per
    # chunk in the system's temporary folder (86 after one suite run); same file system
    scratch = tempfile.mkdtemp(prefix="simstore-bench-runner-")
    env["TMPDIR"] = scratch
    try:
        return _run_runner(python, args, env, timeout_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_runner(python: str, args: list[str], env: dict[str, str],
                timeout_s: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-m", "benchmarks.suite.runner", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    sampler = _RssSampler(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\ntimed out after {timeout_s:.0f} s"
    peak = sampler.stop()
    wall = time.perf_counter() - t0
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:300]}", "wall_s": wall}
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    result["peak_rss_mib"] = peak / MiB
    result["wall_s"] = wall
    return result


# -- setup -------------------------------------------------------------------------------
def interpreters(cfg: Config) -> Env:
    """The project's python and, if any peer is asked for, the peers' virtualenv."""
    env = Env(python={"main": sys.executable, "peers": None})
    if any(s.venv == "peers" for s in cfg.systems):
        python, notes = peers.ensure(cfg.root, log=cfg.log)
        env.python["peers"] = python
        env.notes.update(notes)
    return env


_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def writer_fingerprint(family: str) -> str | None:
    """For simstore, a hash of the writer's source (formats/, simstore/ingest/), so data
    written by an older revision is rewritten; peers' writers are pinned, so None."""
    if family != "simstore":
        return None
    import hashlib

    digest = hashlib.sha256()
    for folder in ("formats", os.path.join("simstore", "ingest")):
        base = os.path.join(_REPO, folder)
        for root, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(root, name)
                digest.update(os.path.relpath(path, _REPO).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:16]


def write_all(cfg: Config, env: Env) -> None:
    """Pools, then each system's copy of each pool (reused when already written)."""
    for profile in cfg.profiles:
        t0 = time.perf_counter()
        env.pools[profile] = ensure_pool(cfg.root, profile,
                                          samples_for(profile, cfg.quick, cfg.samples))
        if time.perf_counter() - t0 > 1:
            cfg.log(f"pool {profile}: generated in {time.perf_counter() - t0:.0f} s")
    for system in cfg.systems:
        python = env.python[system.venv]
        if python is None or system.family in env.notes:
            continue
        jobs = []
        fingerprint = writer_fingerprint(system.family)
        for profile in cfg.profiles:
            pool = env.pools[profile]
            out = os.path.join(cfg.root, "systems", system.name, os.path.basename(pool))
            env.data[(system.name, profile)] = out
            if os.path.exists(out + ".write.json"):
                with open(out + ".write.json") as f:
                    previous = json.load(f)
                if previous.get("writer") == fingerprint:
                    env.writes[(system.name, profile)] = {**previous, "reused": True}
                    continue
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            jobs.append({"profile": profile, "pool": pool, "out": out})
        if not jobs:
            continue
        os.sync()
        result = run_runner(python, ["write", system.family, json.dumps(system.write_options),
                                     json.dumps(jobs)])
        if "error" in result:
            for job in jobs:
                env.notes[f"{system.name}/{job['profile']}"] = f"write failed: {result['error']}"
                env.data.pop((system.name, job["profile"]), None)
            cfg.log(f"write {system.name}: {result['error']}")
            continue
        for job, w in zip(jobs, result["writes"], strict=True):
            w["bytes_on_disk"] = data_bytes(job["out"])[0]
            w["writer"] = fingerprint
            with open(job["out"] + ".write.json", "w") as f:
                json.dump(w, f)
            env.writes[(system.name, job["profile"])] = w
            cfg.log(f"write {system.name:22s} {job['profile']:6s} {w['write_s']:6.1f} s, "
                    f"{w['bytes_on_disk'] / MiB:7.1f} MiB")


def upload_s3(cfg: Config, env: Env, stack: ExitStack) -> None:
    """Start moto (and the 20 ms proxy) and upload every system's data read from S3."""
    needed = {(c.system.name, c.profile) for c in plan(cfg) if c.tier.startswith("s3")}
    if not needed:
        return
    import importlib.util

    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("boto3") is None:
        for name, _profile in needed:
            env.notes.setdefault(name + "/s3", "S3 tiers need moto[server] and boto3 "
                                 "(pip install -e '.[dev]')")
        return
    env.endpoint = stack.enter_context(s3.moto())
    if "s3-cold-20ms" in cfg.tiers:
        env.slow_endpoint = stack.enter_context(s3.latency_proxy(env.endpoint, 0.02))
    for name, profile in sorted(needed):
        local = env.data.get((name, profile))
        if local is None:
            continue
        prefix = f"{name}/{profile}"
        size, secs = s3.upload_tree(env.endpoint, BUCKET, prefix, local)
        env.s3_keys[(name, profile)] = s3.list_keys(env.endpoint, BUCKET, prefix)
        env.s3_bytes[(name, profile)] = size
        cfg.log(f"s3: uploaded {name} {profile}: {size / MiB:.0f} MiB in {secs:.1f} s")


def plan(cfg: Config) -> list[Case]:
    return cases(cfg.systems, cfg.profiles, cfg.tiers, cfg.workers, cfg.s3_profiles,
                 cfg.memory_systems, cfg.s3_systems, cfg.s3_workers)


# -- one read ----------------------------------------------------------------------------
def read_options(cfg: Config, env: Env, case: Case,
                 rep: int) -> tuple[dict[str, Any], dict[str, str] | None]:
    """The runner's options and environment for ``case``."""
    if not case.tier.startswith("s3"):
        return {"tier": case.tier}, None
    assert env.endpoint is not None
    endpoint = env.slow_endpoint if case.tier == "s3-cold-20ms" else env.endpoint
    assert endpoint is not None
    name = case.system.name
    opts: dict[str, Any] = {
        "tier": "s3", "url": f"s3://{BUCKET}/{name}/{case.profile}", "endpoint_url": endpoint,
        "key": s3.KEY, "secret": s3.SECRET, "bucket": BUCKET,
        "keys": [k for k in env.s3_keys[(name, case.profile)] if k.endswith(".tar")],
    }
    if case.tier != "s3":
        cache = cache_dir(cfg, case)
        if case.tier != "s3-warm":  # filled once, before the repetitions (fill_warm_caches)
            shutil.rmtree(cache, ignore_errors=True)
            # no cold read pays for the write-back of the files an earlier read wrote
            os.sync()
        os.makedirs(cache, exist_ok=True)
        opts["cache_dir"] = cache
    return opts, s3.client_env(endpoint)


def cache_dir(cfg: Config, case: Case) -> str:
    """The disk cache of an S3 case: one per system, profile and worker count and tier."""
    warm = "-warm" if case.tier == "s3-warm" else ""
    return os.path.join(cfg.root, "cache",
                        f"{case.system.name}-{case.profile}-w{case.workers}{warm}")


def fill_warm_caches(cfg: Config, env: Env, cases: list[Case]) -> None:
    """Fill each ``s3-warm`` case's cache with one untimed epoch, before any timed read.

    A warm node: its cache was filled earlier (``simstore pull``, an earlier job), not by
    a process that ended a second ago, so each system's first timed read finds copies as
    a later job would (simstore then hashes them once and records them, as it does a
    local store's files in that tier's first repetition).
    """
    for case in cases:
        if case.tier != "s3-warm":
            continue
        shutil.rmtree(cache_dir(cfg, case), ignore_errors=True)
        r = read_once(cfg, env, case, -1)
        cfg.log(f"  {case.label}: cache filled" + (f" ({r['error']})" if "error" in r else ""))


def read_once(cfg: Config, env: Env, case: Case, rep: int) -> dict[str, Any]:
    """One fresh-process epoch of ``case``, with the page cache warmed first.

    The local tier's files and an ``s3-warm`` case's cache copies are read just before
    (untimed), so both tiers start from the page cache.
    """
    python = env.python[case.system.venv]
    data = env.data[(case.system.name, case.profile)]
    raw = ceilings.raw_read(data_bytes(data)[1]) if case.tier == "local" else None
    opts, run_env = read_options(cfg, env, case, rep)
    if case.tier == "s3-warm" and rep >= 0:
        # the same page-cache state as the local tier's files: a warm node's cache copies
        # are compared with a local store whose files were just read
        ceilings.raw_read(data_bytes(opts["cache_dir"])[1])
    opts["max_s"] = 5 if cfg.quick else 10
    batch = PROFILES[case.profile].batch_size
    assert python is not None
    result = run_runner(python, ["read", case.system.family, data, case.profile,
                                 str(case.workers), "none" if batch is None else str(batch),
                                 json.dumps(opts)], env=run_env)
    if raw is not None:
        result["raw_read_mib_per_s"] = raw
    if case.tier in ("s3-cold", "s3-cold-20ms") and "error" not in result:
        # raw parallel GETs of the objects this system just read, through the same
        # endpoint, right after its epoch: this VM's loopback S3 rate moves by 1.5-2x within
        # minutes, so the run-start ceiling alone misjudges runs made later
        endpoint = env.slow_endpoint if case.tier == "s3-cold-20ms" else env.endpoint
        assert endpoint is not None
        try:
            keys = env.s3_keys[(case.system.name, case.profile)]
            # simstore's objects (shards, manifest parts, snapshots) as the ceiling takes
            # them; a peer's files all
            keys = [k for k in keys if "/objects/" in k] or keys
            result["s3_get_mib_per_s"] = s3.parallel_get(endpoint, BUCKET, keys)
        except Exception as exc:  # the run's own figures stand; this ratio is left out
            cfg.log(f"  {case.label}: GETs after the run failed: {type(exc).__name__}: {exc}")
    return result


# -- the whole run -----------------------------------------------------------------------
def skipped(cfg: Config, env: Env, case: Case) -> str | None:
    s = case.system
    for key in (s.family, s.name, f"{s.name}/{case.profile}"):
        if key in env.notes:
            return env.notes[key]
    if (s.name, case.profile) not in env.data:
        return "no data written"
    if case.tier.startswith("s3") and (s.name, case.profile) not in env.s3_keys:
        return env.notes.get(s.name + "/s3", "not uploaded to S3")
    return None


def summarise(case: Case, runs: list[dict[str, Any]], env: Env, info: dict[str, Any],
              note: str | None) -> dict[str, Any]:
    """The result row of a case: medians over its successful runs."""
    write = env.writes.get((case.system.name, case.profile), {})
    on_disk = env.s3_bytes.get((case.system.name, case.profile)) if case.tier.startswith(
        "s3") else write.get("bytes_on_disk")
    row: dict[str, Any] = {
        "system": case.system.name, "profile": case.profile, "tier": case.tier,
        "workers": case.workers, "samples_per_s": None, "mib_per_s": None, "ttfb_s": None,
        "peak_rss_mib": None, "bytes_on_disk": on_disk, "write_s": write.get("write_s"),
        "batch_size": PROFILES[case.profile].batch_size, "shuffle": case.system.shuffle,
        "start_method": case.system.start_method if case.workers else None,
    }
    good = [r for r in runs if "error" not in r]
    errors = [r["error"] for r in runs if "error" in r]
    if note:
        row["note"] = note
    if errors:
        row["errors"] = errors
    if not good:
        return row
    mean_bytes = int(info["logical_bytes"]) / int(info["samples"])
    for r in good:
        total_s = r["ttfb_s"] + r["epoch_s"]
        r["samples_per_s"] = r["samples"] / total_s
        r["steady_samples_per_s"] = (r["samples_after_first"] / r["epoch_s"]
                                     if r["epoch_s"] > 0 else None)
        if r.get("s3_get_mib_per_s"):
            r["vs_s3_get_beside"] = (r["samples_per_s"] * mean_bytes / MiB
                                     / r["s3_get_mib_per_s"])

    def med(key: str) -> float | None:
        vals = [r[key] for r in good if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    sps = med("samples_per_s")
    row.update({
        "samples_per_s": sps,
        "mib_per_s": sps * mean_bytes / MiB if sps else None,
        "steady_samples_per_s": med("steady_samples_per_s"),
        "ttfb_s": med("ttfb_s"), "import_s": med("import_s"),
        "peak_rss_mib": med("peak_rss_mib"), "raw_read_mib_per_s": med("raw_read_mib_per_s"),
        # cold S3 tiers: the median over runs of each run against the GETs beside it
        "s3_get_mib_per_s": med("s3_get_mib_per_s"),
        "vs_s3_get_beside": med("vs_s3_get_beside"),
        "samples": good[0]["samples"],
        "cut": any(r.get("cut") for r in good),
        "bytes_ok": all(r.get("cut") or abs(r["bytes_delivered"] - int(info["logical_bytes"]))
                        <= 0.01 * int(info["logical_bytes"]) + 8 * r["samples"]
                        for r in good),
        "runs": [{k: r[k] for k in ("samples_per_s", "ttfb_s", "peak_rss_mib", "epoch_s",
                                    "import_s", "shards_hashed", "shards_trusted",
                                    "shards_laid_out", "cache_hits", "s3_get_mib_per_s")
                  if k in r}
                 for r in good],
    })
    return row


def run(cfg: Config) -> dict[str, Any]:
    """Everything: returns the results document (see benchmarks/README.md)."""
    t_start = time.perf_counter()
    env = interpreters(cfg)
    write_all(cfg, env)
    out: dict[str, Any] = {"machine": ceilings.machine(), "quick": cfg.quick, "reps": cfg.reps,
                           "profiles": {p: {**pool_info(env.pools[p]),
                                            "description": PROFILES[p].description,
                                            "batch_size": PROFILES[p].batch_size}
                                        for p in cfg.profiles}}
    if env.python["peers"]:
        out["peer_versions"] = peers.versions(env.python["peers"])
    with ExitStack() as stack:
        upload_s3(cfg, env, stack)
        out["ceilings"] = ceilings.measure(cfg, env)
        todo = plan(cfg)
        # simstore remembers whole-shard hash matches for the node's later jobs: here in
        # a folder of the run's own, empty at its start, so the first repetition of a
        # case hashes every shard (a node's first job) and later ones trust its records
        verified = os.path.join(cfg.root, "verified")
        shutil.rmtree(verified, ignore_errors=True)
        os.environ["SIMSTORE_VERIFIED_DIR"] = verified
        runs: dict[str, list[dict[str, Any]]] = {c.label: [] for c in todo}
        notes = {c.label: skipped(cfg, env, c) for c in todo}
        active = [c for c in todo if notes[c.label] is None]
        cfg.log(f"reads: {len(active)} cases x {cfg.reps} repetitions "
                f"({len(todo) - len(active)} skipped)")
        fill_warm_caches(cfg, env, active)
        for rep in range(cfg.reps):
            for i, case in enumerate(active):
                r = read_once(cfg, env, case, rep)
                runs[case.label].append(r)
                if "error" in r:
                    cfg.log(f"  [{rep + 1}/{cfg.reps} {i + 1}/{len(active)}] {case.label}: "
                            f"{r['error']}")
                else:
                    sps = r["samples"] / (r["ttfb_s"] + r["epoch_s"])
                    cfg.log(f"  [{rep + 1}/{cfg.reps} {i + 1}/{len(active)}] {case.label}: "
                            f"{sps:9.1f} samples/s, ttfb {r['ttfb_s']:.2f} s, "
                            f"rss {r['peak_rss_mib']:.0f} MiB")
    out["results"] = [summarise(c, runs[c.label], env, pool_info(env.pools[c.profile]),
                                notes[c.label])
                      for c in todo]
    out["skipped"] = {k: v for k, v in env.notes.items()}
    out["writes"] = [{"system": s, "profile": p, **w} for (s, p), w in sorted(env.writes.items())]
    out["ingest_vs_copy"] = ceilings.ingest_vs_copy(cfg, env)
    if cfg.extras:
        from benchmarks.suite import extras

        out["extras"] = extras.run(cfg)
    out["seconds"] = time.perf_counter() - t_start
    return out

