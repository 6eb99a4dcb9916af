"""``simstore keys`` and ``simstore cat``: a snapshot's sample keys, and samples by key."""

from __future__ import annotations

import json
import math
import os
import tempfile
import zipfile
from typing import Any

import click
import numpy as np
from simstore.cli._common import (
    CliContext,
    PathArg,
    check_at_least,
    emit,
    fields_arg,
    handle_errors,
    pass_ctx,
    text_arg,
)

from simstore.errors import InvalidInputError, one_line
from simstore.names import parse_ref

__all__ = ["COMMANDS"]

# a tensor of at most this many values is printed whole (text and JSON); larger ones are
# summarised (min, max, mean, NaN count)
_SHOWN_VALUES = 8


@click.command("cat")
@click.argument("ref")
@click.argument("keys", nargs=-1, required=True)
@click.option("--fields", default=None, help="Comma-separated fields to read (default: all).")
@click.option(
    "--out", "out", default=None, type=PathArg(dir_okay=False),
    help="Write the samples' values to this .npz file (one sample: FIELD entries; several: "
         "KEY/FIELD).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@handle_errors
def cat_cmd(
    ctx: CliContext, ref: str, keys: tuple[str, ...], fields: str | None, out: str | None,
    as_json: bool,
) -> None:
    """Samples of REF by KEY: each field's kind, dtype, shape and values or summary.

    The samples are read as SimDataset reads them (hash-checked shards, only the manifest
    part holding each key). A key REF's snapshot lacks is exit 3.
    """
    from simstore.loaders import SimDataset

    wanted = fields_arg(fields)
    if out is not None and not out.endswith(".npz"):
        raise InvalidInputError(f"--out {out!r}: the file name must end in .npz")
    parse_ref(ref)
    catalog = ctx.catalog(read_only=True)
    ds = SimDataset(catalog.store, ref, fields=wanted, shuffle=False)
    keys = tuple(text_arg(k) for k in keys)
    samples = ds.get_many(list(keys))
    pinned = f"{parse_ref(ref).dataset}@{ds.snapshot_id}"
    # the schema tells a 0-d tensor from a scalar parameter (both read as 0-d tensors)
    kinds = {spec.name: spec.kind for spec in catalog.snapshot(ds.snapshot_id).schema}
    names = wanted if wanted is not None else sorted(kinds)
    if out is not None:
        _write_npz(out, samples)
    described: list[dict[str, Any]] = [
        {"key": s["__key__"],
         "fields": {n: _describe(v, kinds.get(n)) for n, v in sorted(s.items())
                    if not n.startswith("__")},
         # fields of the dataset (or asked for) that this sample lacks
         "absent": [n for n in names if n not in s]}
        for s in samples
    ]
    doc = {"snapshot": ds.snapshot_id, "samples": described, "out": out}

    def text() -> str:
        lines = []
        for sample in described:
            lines.append(f"{one_line(sample['key'], exact=True)} ({pinned})")
            width = max((len(n) for n in [*sample["fields"], *sample["absent"]]), default=0)
            for name, d in sample["fields"].items():
                lines.append(f"  {name.ljust(width)}  {_line(d)}")
            lines += (f"  {name.ljust(width)}  absent" for name in sample["absent"])
        if out is not None:
            lines.append(f"wrote {out}")
        return "\n".join(lines)

    emit(as_json, doc, text)


def _values(value: Any) -> Any:
    """A tensor's values as NumPy, anything else as it is."""
    numpy = getattr(value, "numpy", None)
    if callable(numpy) and hasattr(value, "dtype") and hasattr(value, "shape"):
        return value.detach().cpu().numpy()
    return value


def _describe(value: Any, kind: str | None = None) -> dict[str, Any]:
    """A field's summary; ``kind`` is the schema's (a scalar parameter or a 0-d tensor)."""
    value = _values(value)
    if isinstance(value, np.ndarray):
        if value.ndim == 0 and kind != "tensor":
            return {"kind": "scalar", "dtype": str(value.dtype), "value": value.item()}
        d: dict[str, Any] = {"kind": "tensor", "dtype": str(value.dtype),
                             "shape": list(value.shape)}
        if value.size <= _SHOWN_VALUES:
            d["values"] = value.reshape(-1).tolist()
        elif value.dtype.kind in "biuf" and value.size:
            flat = value.reshape(-1)
            finite = flat[np.isfinite(flat)] if value.dtype.kind == "f" else flat
            d["nan_count"] = int(np.isnan(flat).sum()) if value.dtype.kind == "f" else 0
            if finite.size:
                d["min"] = finite.min().item()
                d["max"] = finite.max().item()
                d["mean"] = float(finite.mean(dtype=np.float64))
        return d
    if isinstance(value, bool | int | float):
        return {"kind": "scalar", "dtype": type(value).__name__, "value": value}
    if isinstance(value, str):
        return {"kind": "string", "value": value}
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        return {"kind": "bytes", "size": len(data), "head": data[:16].hex()}
    return {"kind": "json", "value": value}


def _line(d: dict[str, Any]) -> str:
    kind = d["kind"]
    if kind == "tensor":
        head = f"tensor {d['dtype']} {tuple(d['shape'])}"
        if "values" in d:
            return f"{head} {d['values']}"
        if "min" in d:
            nan = f", {d['nan_count']} NaN" if d.get("nan_count") else ""
            return (f"{head} min {_num(d['min'])} max {_num(d['max'])} "
                    f"mean {_num(d['mean'])}{nan}")
        return head
    if kind == "scalar":
        return f"scalar {d['dtype']} {_num(d['value'])}"
    if kind == "string":
        return f"string {d['value']!r}"
    if kind == "bytes":
        return f"bytes {d['size']} B {d['head']}{'...' if d['size'] > 16 else ''}"
    return f"json {json.dumps(d['value'], sort_keys=True)}"


def _num(x: Any) -> str:
    if isinstance(x, float) and math.isfinite(x):
        return f"{x:.6g}"
    return str(x)


def _npz_value(value: Any) -> np.ndarray:
    value = _values(value)
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, bool | int | float | str):
        return np.asarray(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return np.frombuffer(bytes(value), dtype=np.uint8)
    return np.asarray(json.dumps(value, sort_keys=True))  # JSON metadata as its text


def _write_npz(path: str, samples: list[dict[str, Any]]) -> None:
    """All samples' fields in one .npz, written beside ``path`` and renamed into place."""
    unique = list({s["__key__"]: s for s in samples}.values())  # a key given twice: once
    one = len(unique) == 1
    arrays: dict[str, np.ndarray] = {}
    owner: dict[str, tuple[str, str]] = {}
    for s in unique:
        for name, value in s.items():
            if name.startswith("__"):
                continue
            entry = name if one else f"{s['__key__']}/{name}"
            if entry in owner:  # keys and field names may both hold a "/"
                key, field = owner[entry]
                raise InvalidInputError(
                    f"--out {path!r}: entry {entry!r} would hold both field {field!r} of "
                    f"{key!r} and field {name!r} of {s['__key__']!r}; write them to "
                    "separate files"
                )
            owner[entry] = (s["__key__"], name)
            arrays[entry] = _npz_value(value)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidInputError(f"--out {path!r}: no folder {folder}")
    fd, tmp = tempfile.mkstemp(prefix=".simstore-cat-", suffix=".npz", dir=folder)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
        # entry by entry as np.savez writes them, not through its keyword arguments: a
        # field named "file" or "allow_pickle" is an entry like any other
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", allowZip64=True) as z:
            for entry, array in arrays.items():
                with z.open(f"{entry}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@click.command("keys")
@click.argument("ref")
@click.option("--prefix", default="", help="Only keys that start with this.")
@click.option("--limit", "-n", type=int, default=None, help="At most this many keys.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@handle_errors
def keys_cmd(
    ctx: CliContext, ref: str, prefix: str, limit: int | None, as_json: bool
) -> None:
    """Sample keys of REF's snapshot in key order (one per line), for `simstore cat`.

    Only the manifest parts whose key range can hold keys starting with --prefix are
    read.
    """
    check_at_least(limit, "--limit", 0)
    prefix = text_arg(prefix)
    cat = ctx.catalog(read_only=True)
    sid = cat.resolve(ref)
    snap = cat.snapshot(sid)
    rows: list[dict[str, Any]] = []
    for table in cat.iter_rows(snap, prefix=prefix):
        if limit is not None:  # one key past the limit says whether there are more
            # no further than the table: Arrow takes a length in int64, and -n may be any
            # whole number (2**63 was an OverflowError's traceback)
            table = table.slice(0, min(len(table), max(0, limit + 1 - len(rows))))
        keys = table.column("key").to_pylist()
        sizes = table.column("size_bytes").to_pylist()
        rows += ({"key": k, "size_bytes": b} for k, b in zip(keys, sizes, strict=True))
        if limit is not None and len(rows) > limit:
            break
    more = limit is not None and len(rows) > limit
    rows = rows[:limit] if limit is not None else rows
    doc = {"snapshot": sid, "prefix": prefix, "keys": rows, "truncated": more}
    # one per line: a key holding a line break or another control character is shown
    # escaped, as errors show names, and so is one holding a backslash (doubled), so two
    # keys never print alike (``--json`` gives them exactly)
    emit(as_json, doc, lambda: "\n".join(one_line(r["key"], exact=True) for r in rows))


COMMANDS = [keys_cmd, cat_cmd]
