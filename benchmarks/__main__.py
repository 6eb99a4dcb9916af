"""simstore against the hardware ceilings, its storage tiers and the peer loaders, with plots.

    python -m benchmarks [--quick] [--json FILE] [--systems ...] [--profiles ...]
                         [--tiers ...] [--workers 0 2] [--reps N] [--no-extras]

Writes results.json, results.md and PNG plots to --out (default benchmarks/results/ for a
full run, .bench/results-quick/ for --quick). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.suite.data import PROFILES
from benchmarks.suite.matrix import BY_NAME, S3_TIERS, SYSTEMS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIERS = ("local", "memory", *S3_TIERS)


def _samples(text: str) -> tuple[str, int]:
    profile, sep, count = text.partition("=")
    if (not sep or profile not in PROFILES or not (count.isascii() and count.isdigit())
            or int(count) < 1):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give PROFILE=N, a profile of {', '.join(PROFILES)} and N >= 1")
    return profile, int(count)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="small data, one run per case, fewer tiers: a smoke run (< 5 min)")
    ap.add_argument("--json", help="also write the results document here")
    ap.add_argument("--out", help="folder for results.json, results.md and the plots")
    ap.add_argument("--systems", nargs="+", choices=sorted(BY_NAME), metavar="SYSTEM",
                    help=f"default: all but simstore-parquet-zstd; choices: {', '.join(BY_NAME)}")
    ap.add_argument("--profiles", nargs="+", choices=sorted(PROFILES), metavar="PROFILE",
                    help="large, small, mesh (default: all)")
    ap.add_argument("--tiers", nargs="+", choices=TIERS, metavar="TIER",
                    help=f"default: all; choices: {', '.join(TIERS)}")
    ap.add_argument("--workers", nargs="+", type=int, default=[0, 2],
                    help="DataLoader worker counts (default: 0 2)")
    ap.add_argument("--s3-workers", nargs="+", type=int,
                    help="worker counts for the S3 tiers (default: 2)")
    ap.add_argument("--reps", type=int, help="alternating repetitions (default 3; --quick 1)")
    ap.add_argument("--tier-profiles", nargs="+", choices=sorted(PROFILES),
                    help="profiles read from the memory and S3 tiers (default: large)")
    ap.add_argument("--samples", nargs="+", type=_samples, default=[], metavar="PROFILE=N",
                    help="pool size of a profile (default: large=96, small=12288, mesh=768; "
                         "--quick: 24, 4096, 192): a longer epoch, so the first batch is a "
                         "smaller share of it")
    ap.add_argument("--no-extras", action="store_true",
                    help="skip the ingest and manifest-scale benchmarks")
    ap.add_argument("--root", default=os.path.join(REPO, ".bench"),
                    help="scratch folder, git-ignored (default: .bench)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from benchmarks.suite import driver, report

    if args.systems:
        systems = [BY_NAME[n] for n in args.systems]
    else:
        systems = [s for s in SYSTEMS if s.default]
    quick = args.quick
    tiers = args.tiers or (["local", "memory", "s3-cold", "s3-warm"] if quick else list(TIERS))
    profiles = args.profiles or (["large", "small"] if quick else list(PROFILES))
    cfg = driver.Config(
        root=os.path.abspath(args.root), quick=quick, reps=args.reps or (1 if quick else 3),
        systems=systems, profiles=profiles, tiers=tiers,
        workers=args.workers, s3_profiles=args.tier_profiles or ["large"],
        memory_systems=["simstore-parquet"] if quick and not args.systems else None,
        s3_systems=["simstore-parquet"] if quick and not args.systems else None,
        s3_workers=args.s3_workers or [2],
        extras=not args.no_extras,
        samples=dict(args.samples),
        log=lambda msg: print(time.strftime("%H:%M:%S ") + msg, flush=True),
    )
    os.makedirs(cfg.root, exist_ok=True)
    out_dir = args.out or (os.path.join(cfg.root, "results-quick") if quick
                           else os.path.join(REPO, "benchmarks", "results"))
    doc = driver.run(cfg)
    doc["command"] = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv)
    paths = report.write(doc, out_dir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        paths.append(args.json)
    print(report.markdown(doc))
    cfg.log(f"done in {doc['seconds'] / 60:.1f} min; wrote {', '.join(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
