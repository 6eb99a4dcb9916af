"""Field statistics with and without the compiled sub-block moments, side by side.

    python -m benchmarks.bench_stats [--mib 64] [--rounds 11]

Times ``simstore.stats.summarise_array`` on smooth float32 fields of one to four and of
nine components (points and vectors, tensors) and on float64 fields of one and three,
alternating rounds with ``simstore._moments`` and with NumPy alone (the fallback where no
C compiler built the module), in one process, and prints medians, throughput and the
ratio. Both paths give the same numbers (see tests/ingest/test_stats_kernel.py); this says
what the module saves.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

MiB = 1 << 20


def _fields(mib: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n = mib * MiB // 4
    smooth = np.cumsum(rng.standard_normal(n), dtype=np.float64)
    smooth = (smooth / np.abs(smooth).max() * 3 + 300).astype(np.float32)
    return {
        "float32, 1 component": smooth,
        "float32, 2 components": smooth.reshape(-1, 2),
        "float32, 3 components": smooth[: n // 3 * 3].reshape(-1, 3),
        "float32, 4 components": smooth.reshape(-1, 4),
        "float32, 9 components": smooth[: n // 9 * 9].reshape(-1, 9),
        "float64, 1 component": smooth[: n // 2].astype(np.float64),
        "float64, 3 components": smooth[: n // 2 // 3 * 3].astype(np.float64).reshape(-1, 3),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="size of each float32 field")
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args(argv)

    from simstore import stats

    kernel = stats._kernel
    if kernel is None:
        raise SystemExit("simstore._moments is not built: pip install -e . with a C compiler")
    print("| field | MiB | NumPy ms | module ms | module MiB/s | speed-up |")
    print("|---|---|---|---|---|---|")
    for name, values in _fields(args.mib).items():
        times: dict[bool, list[float]] = {True: [], False: []}
        stats.summarise_array(values)  # scratch and first-call costs out of the rounds
        for _ in range(args.rounds):
            for use in (False, True):
                stats._kernel = kernel if use else None
                t = time.perf_counter()
                stats.summarise_array(values)
                times[use].append(time.perf_counter() - t)
        stats._kernel = kernel
        plain, fast = statistics.median(times[False]), statistics.median(times[True])
        mib = values.nbytes / MiB
        print(f"| {name} | {mib:.0f} | {plain * 1e3:.1f} | {fast * 1e3:.1f} | "
              f"{mib / fast:,.0f} | x{plain / fast:.2f} |")


if __name__ == "__main__":
    main()
