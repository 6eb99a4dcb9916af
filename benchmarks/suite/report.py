"""The results document as JSON, a markdown report and PNG plots (matplotlib, Agg)."""

from __future__ import annotations

import json
import os
from typing import Any

MiB = 1 << 20
SIMSTORE = ("simstore-parquet", "simstore-lance", "simstore-zarr", "simstore-parquet-zstd")
PEERS = ("mosaic", "litdata", "webdataset", "lance", "parquet", "naive")


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _rows(doc: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    return [r for r in doc["results"] if all(r.get(k) == v for k, v in match.items())]


def _get(doc: dict[str, Any], system: str, profile: str, tier: str,
         workers: int) -> dict[str, Any] | None:
    rows = _rows(doc, system=system, profile=profile, tier=tier, workers=workers)
    return rows[0] if rows and rows[0].get("samples_per_s") else None


def ratios(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """simstore (each format) against each other system, local tier, same profile/workers."""
    out = []
    for r in _rows(doc, tier="local"):
        if r["system"] not in SIMSTORE or not r.get("samples_per_s"):
            continue
        ceiling = doc["ceilings"]["by_profile"].get(r["profile"], {})
        raw = ceiling.get("raw_read_mib_per_s")
        steady = r.get("steady_samples_per_s")
        row = {"system": r["system"], "profile": r["profile"], "workers": r["workers"],
               "vs_raw_read": r["mib_per_s"] / raw if raw else None,
               # the same rate after the first batch (an epoch of the suite's pool lasts
               # tens of milliseconds: its first batch is a large share of it)
               "vs_raw_read_steady": (steady * r["mib_per_s"] / r["samples_per_s"] / raw
                                      if raw and steady else None)}
        for peer in PEERS:
            p = _get(doc, peer, r["profile"], "local", r["workers"])
            row[f"vs_{peer}"] = r["samples_per_s"] / p["samples_per_s"] if p else None
            row[f"ttfb_vs_{peer}"] = r["ttfb_s"] / p["ttfb_s"] if p and p["ttfb_s"] else None
        out.append(row)
    return out


def s3_ratios(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each S3 row against the raw parallel GET ceiling and against the local tier."""
    out = []
    for r in doc["results"]:
        if not r["tier"].startswith("s3") or not r.get("mib_per_s"):
            continue
        c = doc["ceilings"]["by_profile"].get(r["profile"], {})
        key = "s3_get_20ms_mib_per_s" if r["tier"] == "s3-cold-20ms" else "s3_get_mib_per_s"
        get = c.get(key)
        local = _get(doc, r["system"], r["profile"], "local", r["workers"])
        out.append({"system": r["system"], "profile": r["profile"], "tier": r["tier"],
                    "workers": r["workers"], "mib_per_s": r["mib_per_s"],
                    "vs_s3_get": r["mib_per_s"] / get if get else None,
                    # each run against GETs of its objects made right after it (cold tiers)
                    "vs_s3_get_beside": r.get("vs_s3_get_beside"),
                    "vs_local": r["samples_per_s"] / local["samples_per_s"] if local else None})
    return out


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        "# simstore benchmark results", "",
        f"`{doc.get('command', 'python -m benchmarks')}`: {m['date']}; {m['cpu']}, "
        f"{m['cores']} cores, {m['memory_gib']} GiB; Python {m['python']}, torch {m['torch']}."
        f" {'Quick run: one run per case (a smoke run, not a claim).' if doc['quick'] else ''}"
        f" Figures are medians of {doc['reps']} alternating runs, each a fresh process;"
        " samples/s count the whole epoch from building the loader to its last batch"
        " (first batch included); MiB/s are the samples' logical bytes. simstore's records"
        " of shard hashes start empty: its first run of a case hashes every shard it reads"
        " (a node's first job), later runs trust the records (a node's later jobs).", "",
    ]
    if doc.get("peer_versions"):
        lines += ["Peers: " + ", ".join(f"{k} {v}" for k, v in doc["peer_versions"].items()), ""]
    lines += ["## Ceilings (same bytes)", "",
              "| profile | raw sequential read MiB/s | memcpy MiB/s | S3 parallel GET MiB/s |"
              " S3 GET + 20 ms MiB/s |", "|---|---|---|---|---|"]
    for p, c in doc["ceilings"]["by_profile"].items():
        lines.append(f"| {p} | {_f(c['raw_read_mib_per_s'])} | {_f(c['memcpy_mib_per_s'])} | "
                     f"{_f(c.get('s3_get_mib_per_s'))} | {_f(c.get('s3_get_20ms_mib_per_s'))} |")
    for profile, info in doc["profiles"].items():
        lines += ["", f"## {profile}: {info['description']}; {info['samples']} samples, "
                  f"{int(info['logical_bytes']) / MiB:,.0f} MiB; batch "
                  f"{info['batch_size'] or 'none (one sample at a time)'}", "",
                  "| system | tier | workers | samples/s | MiB/s | % raw read | TTFB s |"
                  " import s | peak RSS MiB | on disk MiB | write s | note |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        raw = doc["ceilings"]["by_profile"].get(profile, {}).get("raw_read_mib_per_s")
        for r in sorted(_rows(doc, profile=profile),
                        key=lambda r: (r["tier"] != "local", r["tier"], r["workers"],
                                       -(r["samples_per_s"] or 0))):
            pct = 100 * r["mib_per_s"] / raw if raw and r.get("mib_per_s") else None
            note = r.get("note") or ("; ".join(r["errors"])[:120] if r.get("errors") else "")
            if r.get("cut"):
                note = (note + " epoch cut at the time limit").strip()
            if r.get("bytes_ok") is False:
                note = (note + " bytes delivered differ from the pool's").strip()
            lines.append(
                f"| {r['system']} | {r['tier']} | {r['workers']} | {_f(r['samples_per_s'])} | "
                f"{_f(r['mib_per_s'])} | {_f(pct)} | {_f(r['ttfb_s'], 2)} | "
                f"{_f(r.get('import_s'), 1)} | {_f(r['peak_rss_mib'])} | "
                f"{_f(r['bytes_on_disk'] / MiB if r.get('bytes_on_disk') else None)} | "
                f"{_f(r.get('write_s'), 1)} | {note} |")
    rat = ratios(doc)
    if rat:
        lines += ["", "## Ratios, local tier (simstore samples/s / other's; TTFB: simstore's /"
                  " other's, lower is better)", "",
                  "| simstore | profile | workers | vs raw read | after the first batch | " +
                  " | ".join(f"vs {p}" for p in PEERS) + " | TTFB vs mosaic | TTFB vs litdata |",
                  "|---|---|---|---|---|" + "---|" * len(PEERS) + "---|---|"]
        for r in rat:
            lines.append(f"| {r['system']} | {r['profile']} | {r['workers']} | "
                         f"{_f(r['vs_raw_read'], 2)} | {_f(r.get('vs_raw_read_steady'), 2)} | " +
                         " | ".join(_f(r[f'vs_{p}'], 2) for p in PEERS) +
                         f" | {_f(r['ttfb_vs_mosaic'], 2)} | {_f(r['ttfb_vs_litdata'], 2)} |")
    s3r = s3_ratios(doc)
    if s3r:
        lines += ["", "## S3 (moto on loopback)", "",
                  "moto serves ranged GETs about 5x slower than whole-object GETs: the `s3` "
                  "tier of simstore (no cache: ranged reads) overstates their cost against "
                  "real S3. `s3-cold-20ms` goes through a proxy adding 20 ms per request "
                  "(a remote region) and is compared with parallel GETs through the same "
                  "proxy. *vs GETs beside it*: the median over the runs of each cold "
                  "run against parallel GETs of the same objects made right after it (the "
                  "run-start ceiling drifts with the host).", "",
                  "| system | profile | tier | workers | MiB/s | vs raw parallel GET |"
                  " vs GETs beside it | vs local tier |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in s3r:
            lines.append(f"| {r['system']} | {r['profile']} | {r['tier']} | {r['workers']} | "
                         f"{_f(r['mib_per_s'])} | {_f(r['vs_s3_get'], 2)} | "
                         f"{_f(r['vs_s3_get_beside'], 2)} | {_f(r['vs_local'], 2)} |")
    if doc.get("ingest_vs_copy"):
        lines += ["", "## Writes: each system's writer from the pool's .npz files vs copying them",
                  "", "| system | profile | write s | MiB/s | copy MiB/s | vs copy | on disk MiB |",
                  "|---|---|---|---|---|---|---|"]
        for r in doc["ingest_vs_copy"]:
            lines.append(f"| {r['system']} | {r['profile']} | {_f(r['write_s'], 1)} | "
                         f"{_f(r['write_mib_per_s'])} | {_f(r['copy_mib_per_s'])} | "
                         f"{_f(r['vs_copy'], 2)} | {_f((r['bytes_on_disk'] or 0) / MiB)} |")
    if doc.get("skipped"):
        lines += ["", "## Skipped", ""]
        lines += [f"- {k}: {v}" for k, v in doc["skipped"].items()]
    ex = doc.get("extras") or {}
    if ex:
        lines += ["", "## Extras", ""]
        for name, value in ex.items():
            lines += [f"### {name}", "", "```json", json.dumps(value, indent=1)[:4000], "```", ""]
    return "\n".join(lines) + "\n"


# -- plots -------------------------------------------------------------------------------
def _order(doc: dict[str, Any], tier: str) -> list[str]:
    names = {r["system"] for r in doc["results"] if r["tier"] == tier}
    return [s for s in (*SIMSTORE, *PEERS) if s in names]


def _label(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.2g}" if v < 10 else f"{v:.0f}"


def _bars(ax: Any, doc: dict[str, Any], profile: str, key: str, tier: str = "local",
          scale: float = 1.0) -> list[str]:
    import numpy as np

    systems = _order(doc, tier)
    workers = sorted({r["workers"] for r in doc["results"]})
    width = 0.8 / max(1, len(workers))
    x = np.arange(len(systems))
    for i, w in enumerate(workers):
        vals = []
        for s in systems:
            r = _get(doc, s, profile, tier, w)
            vals.append((r[key] or 0) * scale if r else 0)
        bars = ax.bar(x + (i - (len(workers) - 1) / 2) * width, vals, width,
                      label=f"{w} workers", color=["#4C72B0", "#DD8452", "#55A868"][i % 3])
        for b, v in zip(bars, vals, strict=True):
            x_mid = b.get_x() + b.get_width() / 2
            if v == 0:
                ax.text(x_mid, 0, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
            else:
                ax.text(x_mid, v, _label(v), ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(x)
    ax.set_xticklabels([s.replace("simstore-", "simstore\n") for s in systems], fontsize=7)
    return systems


def plots(doc: dict[str, Any], out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    profiles = list(doc["profiles"])
    fig, axes = plt.subplots(len(profiles), 1, figsize=(11, 3.6 * len(profiles)), squeeze=False)
    for ax, profile in zip(axes[:, 0], profiles, strict=True):
        _bars(ax, doc, profile, "mib_per_s")
        ax.set_yscale("log")
        c = doc["ceilings"]["by_profile"].get(profile, {})
        for key, label, style, side in (("raw_read_mib_per_s", "raw sequential read", "--", 0),
                                        ("memcpy_mib_per_s", "memcpy", ":", 1)):
            if c.get(key):  # labels at opposite ends, so close ceilings stay legible
                ax.axhline(c[key], color="black", linestyle=style, linewidth=1)
                ax.text(ax.get_xlim()[side], c[key], f" {label} {c[key]:,.0f} MiB/s ",
                        va="bottom", ha="right" if side else "left", fontsize=7)
        top = max(c.get("memcpy_mib_per_s") or 1, c.get("raw_read_mib_per_s") or 1)
        ax.set_ylim(top=top * 3)
        info = doc["profiles"][profile]
        ax.set_title(f"{profile}: {info['description']}; local tier, warm page cache, "
                     f"batch {info['batch_size'] or 1}", fontsize=9)
        ax.set_ylabel("MiB/s, whole epoch (log)")
        ax.legend(fontsize=7, loc="center right", ncol=2)
        ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    path = os.path.join(out_dir, "throughput.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    fig, axes = plt.subplots(1, len(profiles), figsize=(5 * len(profiles), 4), squeeze=False)
    for ax, profile in zip(axes[0], profiles, strict=True):
        _bars(ax, doc, profile, "ttfb_s")
        ax.set_title(f"{profile}: time to first batch (fresh process)", fontsize=9)
        ax.set_ylabel("seconds (after imports)")
        ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelsize=6, rotation=60)
    fig.tight_layout()
    path = os.path.join(out_dir, "ttfb.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    tier_rows = [r for r in doc["results"] if r["tier"] != "local" and r.get("mib_per_s")]
    if tier_rows:
        paths.append(_tiers_plot(doc, out_dir, plt))
    return paths


def _tiers_plot(doc: dict[str, Any], out_dir: str, plt: Any) -> str:
    import numpy as np

    profile = "large" if "large" in doc["profiles"] else next(iter(doc["profiles"]))
    tiers = ["local", "memory", "s3-warm", "s3-cold", "s3", "s3-cold-20ms"]
    systems = [s for s in (*SIMSTORE, "mosaic", "litdata", "webdataset")
               if any(r["system"] == s and r["tier"] != "local" and r["profile"] == profile
                      for r in doc["results"])]
    workers = sorted({r["workers"] for r in doc["results"] if r["tier"].startswith("s3")}
                     or {r["workers"] for r in doc["results"]})
    fig, axes = plt.subplots(1, len(workers), figsize=(9 * len(workers), 4.5), squeeze=False)
    for ax, w in zip(axes[0], workers, strict=True):
        x = np.arange(len(tiers))
        width = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            vals = [(r["mib_per_s"] if (r := _get(doc, s, profile, t, w)) else 0) for t in tiers]
            bars = ax.bar(x + (i - (len(systems) - 1) / 2) * width, vals, width, label=s)
            for b, v in zip(bars, vals, strict=True):
                if v:
                    ax.text(b.get_x() + b.get_width() / 2, v, _label(v), ha="center",
                            va="bottom", fontsize=6, rotation=90)
        c = doc["ceilings"]["by_profile"].get(profile, {})
        for key, label, style in (("s3_get_mib_per_s", "S3 parallel GET", "--"),
                                  ("s3_get_20ms_mib_per_s", "GET + 20 ms", ":")):
            if c.get(key):
                ax.axhline(c[key], color="black", linestyle=style, linewidth=1)
                ax.text(len(tiers) - 0.5, c[key], f" {label} {c[key]:,.0f}", fontsize=7,
                        va="bottom", ha="right")
        ax.set_xticks(x)
        ax.set_xticklabels(tiers, fontsize=8)
        ax.set_ylabel("MiB/s (whole epoch)")
        ax.set_title(f"{profile} by tier, {w} workers (moto: ranged GETs ~5x slower)", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "tiers.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(doc: dict[str, Any], out_dir: str) -> list[str]:
    """results.json, results.md and the plots in ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    md = os.path.join(out_dir, "results.md")
    with open(md, "w") as f:
        f.write(markdown(doc))
    return [path, md, *plots(doc, out_dir)]
