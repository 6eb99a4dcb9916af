"""The hardware ceilings on the same bytes, the machine's description, and writes vs copy.

- raw sequential read: ``readinto`` a reused 4 MiB buffer, one thread, warm page cache,
  over simstore-parquet's uncompressed shard files (the samples' bytes plus a little
  metadata; the pool's files when simstore-parquet is not measured);
- memcpy: ``np.copyto`` between two 256 MiB arrays, one thread;
- raw parallel GET: boto3, 8 threads, whole-object GETs of the same shard objects from
  the moto endpoint (and through the 20 ms proxy).
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.suite import s3

if TYPE_CHECKING:
    from benchmarks.suite.driver import Config, Env

MiB = 1 << 20


def raw_read(paths: list[str]) -> float:
    """MiB/s of one sequential pass over ``paths``."""
    buf = bytearray(4 * MiB)
    n = 0
    t = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    return n / max(time.perf_counter() - t, 1e-9) / MiB


def memcpy(size: int = 256 * MiB, reps: int = 5) -> float:
    """MiB/s of a single-threaded copy between two preallocated arrays (median)."""
    src = np.ones(size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return size / statistics.median(times) / MiB


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import torch

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / (1 << 30), 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M %Z")}


def _ceiling_files(env: Env, profile: str) -> list[str]:
    from benchmarks.suite.driver import data_bytes

    data = env.data.get(("simstore-parquet", profile))
    if data is not None:
        return data_bytes(os.path.join(data, "objects"))[1]
    return data_bytes(env.pools[profile])[1]


def measure(cfg: Config, env: Env) -> dict[str, Any]:
    """Ceilings; the top-level keys are those of the large profile (or the first)."""
    by_profile: dict[str, dict[str, Any]] = {}
    copy_rate = memcpy()
    for profile in cfg.profiles:
        files = _ceiling_files(env, profile)
        raw_read(files)  # warm the page cache
        row: dict[str, Any] = {
            "raw_read_mib_per_s": statistics.median(raw_read(files) for _ in range(3)),
            "memcpy_mib_per_s": copy_rate, "s3_get_mib_per_s": None,
            "s3_get_20ms_mib_per_s": None,
        }
        # the objects of simstore's uncompressed Parquet copy, else of its Zarr copy, else
        # of whichever simstore copy is on S3
        on_s3 = [n for (n, p) in env.s3_keys if p == profile and n.startswith("simstore-")]
        name = next((n for n in ("simstore-parquet", "simstore-zarr") if n in on_s3),
                    min(on_s3, default=""))
        keys = [k for k in env.s3_keys.get((name, profile), []) if "/objects/" in k]
        if env.endpoint and keys:
            s3.parallel_get(env.endpoint, "bench", keys)  # connections, moto's first touch
            row["s3_get_mib_per_s"] = statistics.median(
                s3.parallel_get(env.endpoint, "bench", keys) for _ in range(3))
            if env.slow_endpoint:
                row["s3_get_20ms_mib_per_s"] = statistics.median(
                    s3.parallel_get(env.slow_endpoint, "bench", keys) for _ in range(3))
        by_profile[profile] = row
        cfg.log(f"ceilings {profile}: raw read {row['raw_read_mib_per_s']:.0f} MiB/s, memcpy "
                f"{copy_rate:.0f} MiB/s" + (f", S3 GET {row['s3_get_mib_per_s']:.0f} MiB/s"
                                             if row["s3_get_mib_per_s"] else ""))
    top = by_profile.get("large") or next(iter(by_profile.values()))
    return {**top, "by_profile": by_profile}


def ingest_vs_copy(cfg: Config, env: Env) -> list[dict[str, Any]]:
    """Each system's write throughput from the pool's .npz files against copying them."""
    from benchmarks.suite.driver import data_bytes

    rows = []
    for profile in cfg.profiles:
        pool = env.pools[profile]
        size = data_bytes(pool)[0]
        target = os.path.join(cfg.root, "copy-target")
        times = []
        for _ in range(1 if cfg.quick else 3):
            shutil.rmtree(target, ignore_errors=True)
            os.sync()
            t = time.perf_counter()
            shutil.copytree(pool, target)
            times.append(time.perf_counter() - t)
        shutil.rmtree(target, ignore_errors=True)
        copy_mib_s = size / statistics.median(times) / MiB
        for (name, prof), w in sorted(env.writes.items()):
            if prof != profile:
                continue
            mib_s = size / w["write_s"] / MiB
            rows.append({"system": name, "profile": profile, "source_bytes": size,
                         "write_s": w["write_s"], "write_mib_per_s": mib_s,
                         "copy_mib_per_s": copy_mib_s, "vs_copy": mib_s / copy_mib_s,
                         "bytes_on_disk": w.get("bytes_on_disk")})
    return rows
