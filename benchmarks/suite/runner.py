"""One measurement in a fresh process: a system writes a pool, or reads one epoch of it.

    python -m benchmarks.suite.runner write SYSTEM OPTIONS_JSON JOBS_JSON
    python -m benchmarks.suite.runner read SYSTEM OUT PROFILE WORKERS BATCH [OPTIONS_JSON]

Run by the driver in the interpreter of the system's virtualenv (the project's, or the
peers' ``.bench/peers-venv``), with the repository root as the working directory. The
last line of stdout is ``RESULT {json}``. Only NumPy and the standard library are
imported before the clock starts, so ``import_s`` is the system's own import cost.

Read figures:

- ``import_s``: importing torch and the system's library, with its client for the tier
  read (simstore imports its S3 client library only when it opens an S3 store; the
  peers import boto3 with their package, so for the S3 tiers simstore's is imported
  here too, and is not counted in its first batch);
- ``ttfb_s``: from building the dataset and loader to the first batch in hand (workers
  started, first shard opened): the process is fresh, the page cache warm;
- ``epoch_s``, ``samples``: the whole epoch after the first batch; throughput is
  ``(samples - first batch) / (epoch_s)``;
- ``max_s`` (an option) cuts a slow epoch short after that many seconds (``cut``): the
  rates are then over the samples read;
- every tensor a batch holds is touched once per 4 KiB page (one element each), so lazy
  (memory-mapped) loaders pay their page faults as a training step's copy would.
"""

from __future__ import annotations

import json
import sys
import time

T_START = time.perf_counter()

import numpy as np  # noqa: E402


def touch_pages(value: object) -> tuple[int, int]:
    """(bytes, leading dimension) of the tensors in a batch; reads one element per page."""
    import torch

    total, lead = 0, 0
    if isinstance(value, torch.Tensor):
        if value.numel():
            step = max(1, 4096 // value.element_size())
            float(value.reshape(-1)[::step].sum())
        return value.element_size() * value.numel(), (value.shape[0] if value.ndim else 1)
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and (k.startswith("__") or k.endswith("__mask")):
                continue
            b, n = touch_pages(v)
            total += b
            lead = lead or n
    elif isinstance(value, list | tuple):
        for v in value:
            b, _ = touch_pages(v)
            total += b
        lead = len(value)
    return total, lead


def read(system: str, out: str, profile: str, workers: int, batch: int | None,
         options: dict[str, object]) -> dict[str, object]:
    from benchmarks.suite.systems import load

    mod = load(system)
    import torch  # noqa: F401  (part of every system's import cost)

    __import__(mod_name(system))
    for name in getattr(mod, "tier_imports", lambda _options: ())(options):
        __import__(name)
    t_imported = time.perf_counter()
    prepared = mod.prepare(out, profile, options)
    t0 = time.perf_counter()
    loader = mod.loader(out, profile, workers, batch, options, prepared)
    it = iter(loader)
    first = next(it)
    t_first = time.perf_counter()
    nbytes, first_n = touch_pages(first)
    if batch is None:
        first_n = 1
    samples = 0
    max_s = float(options.get("max_s") or 0)  # type: ignore[arg-type]
    cut = False
    for b in it:
        k, n = touch_pages(b)
        nbytes += k
        samples += 1 if batch is None else n
        if max_s and time.perf_counter() - t0 > max_s:
            cut = True
            break
    t_end = time.perf_counter()
    # a system may say more about the read (simstore: shards hashed and trusted)
    details = getattr(mod, "read_details", lambda _loader: {})(loader)
    del it, loader
    return {
        **details,
        "import_s": t_imported - T_START,
        "prepare_s": t0 - t_imported,
        "ttfb_s": t_first - t0,
        "epoch_s": t_end - t_first,
        "samples_after_first": samples,
        "samples": samples + first_n,
        "bytes_delivered": nbytes,
        "cut": cut,
    }


def mod_name(system: str) -> str:
    from benchmarks.suite.systems import MODULES

    return MODULES[system]


def write(system: str, options: dict[str, object],
          jobs: list[dict[str, str]]) -> dict[str, object]:
    """Write each job's pool (``{"profile", "pool", "out"}``) in turn, timing each."""
    from benchmarks.suite.systems import load

    mod = load(system)
    __import__(mod_name(system))  # the library's import is not part of any write time
    done = []
    for job in jobs:
        t0 = time.perf_counter()
        info = mod.write(job["pool"], job["out"], job["profile"], options)
        done.append({"profile": job["profile"], "write_s": time.perf_counter() - t0,
                     **(info or {})})
    return {"writes": done}


def main(argv: list[str]) -> int:
    cmd = argv[0]
    if cmd == "write":
        result = write(argv[1], json.loads(argv[2]), json.loads(argv[3]))
    elif cmd == "read":
        system, out, profile, workers, batch = argv[1:6]
        options = json.loads(argv[6]) if len(argv) > 6 else {}
        result = read(system, out, profile, int(workers),
                      None if batch == "none" else int(batch), options)
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    sys.stdout.flush()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main(sys.argv[1:]))
