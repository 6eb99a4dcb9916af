"""Field statistics with and without the compiled sub-block moments, side by side.

    python -m benchmarks.bench_stats [--mib 64] [--rounds 11]

Times ``simstore.stats.summarise_array`` on smooth float32 fields of one to four and of
nine components (points and vectors, tensors) and on float64 fields of one and three,
alternating rounds with NumPy alone (the fallback where no C compiler built the module)
and with ``simstore._moments`` on each instruction set it can use here (AVX2 where the
CPU has it, and SSE2), in one process, and prints medians, throughput and the speed-ups
over NumPy. Both paths give the same numbers (see tests/ingest/test_stats_kernel.py); this says
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
    # the module's instruction sets this CPU runs (AVX2 where it has it, and SSE2)
    isas = []
    for isa in ("avx2", "sse2"):
        try:
            kernel.isa(kernel.isa(isa))
        except ValueError:
            continue
        isas.append(isa)
    default = kernel.isa()
    paths = ["numpy", *isas]
    print("| field | MiB | " + " | ".join(f"{p} ms" for p in paths)
          + f" | {default} MiB/s | " + " | ".join(f"{p} speed-up" for p in isas) + " |")
    print("|---" * (3 + 2 * len(isas)) + "|---|")
    for name, values in _fields(args.mib).items():
        times: dict[str, list[float]] = {p: [] for p in paths}
        stats.summarise_array(values)  # scratch and first-call costs out of the rounds
        for _ in range(args.rounds):
            for path in paths:
                stats._kernel = None if path == "numpy" else kernel
                if path != "numpy":
                    kernel.isa(path)
                t = time.perf_counter()
                stats.summarise_array(values)
                times[path].append(time.perf_counter() - t)
        stats._kernel = kernel
        kernel.isa(default)
        med = {p: statistics.median(times[p]) for p in paths}
        mib = values.nbytes / MiB
        print(f"| {name} | {mib:.0f} | " + " | ".join(f"{med[p] * 1e3:.1f}" for p in paths)
              + f" | {mib / med[default]:,.0f} | "
              + " | ".join(f"x{med['numpy'] / med[p]:.2f}" for p in isas) + " |")

if __name__ == "__main__":
    main()
