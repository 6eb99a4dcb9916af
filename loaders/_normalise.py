"""``SimDataset(normalise=...)``: fields normalised with the pinned snapshot's statistics.

The constants come from the snapshot the dataset pins (``simstore.stats.normalisation``:
exact, versioned with the data), so a run and its resume, or a rerun a year later on the
same snapshot id, normalise identically. Each source of a mixture uses its own snapshot's.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from simstore.loaders._checks import shown
from simstore.loaders._tensors import to_tensors

from simstore.errors import InvalidInputError
from simstore.snapshot import Snapshot
from simstore.stats import normalisation

__all__ = ["Normalise", "NormaliseSpec", "normaliser"]

Transform = Any  # Callable[[dict[str, Any]], dict[str, Any]] (see _source.Transform)
NormaliseSpec = bool | Sequence[str] | Mapping[str, tuple[Any, Any]] | None


_NARROW_FLOATS = (torch.float16, torch.bfloat16)
"""Floating dtypes too narrow for normalisation constants (worked out in float32)."""


class Normalise:
    """A transform: ``(x - mean) / std`` per field, then the caller's transform.

    Per component on a vector field's last axis. Floating tensors keep their dtype (float16
    and bfloat16 are worked out in float32 and given back in their own);
    integer and bool tensors and plain integers become float32, plain floats float64 (a
    plain number becomes a 0-d tensor, as a sample's scalars are). A field a sample lacks
    (older samples of an evolved schema) is left out. Picklable, for DataLoader workers.
    """

    def __init__(self, constants: Mapping[str, tuple[np.ndarray, np.ndarray]],
                 then: Transform | None = None) -> None:
        self.constants = {name: (np.asarray(m, dtype=np.float64), np.asarray(s, dtype=np.float64))
                          for name, (m, s) in constants.items()}
        self.then = then
        self._tensors: dict[tuple[str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"constants": self.constants, "then": self.then}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["constants"], state["then"])  # type: ignore[misc]

    def _pair(self, name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        pair = self._tensors.get((name, dtype))
        if pair is None:
            mean, std = self.constants[name]
            pair = (torch.from_numpy(mean).to(dtype), torch.from_numpy(std).to(dtype))
            self._tensors[(name, dtype)] = pair
        return pair

    def _operands(
        self, name: str, value: torch.Tensor
    ) -> tuple[torch.Tensor, bool, torch.Tensor, torch.Tensor]:
        """``(tensor to scale, narrow, mean, std)`` for field ``name``'s ``value``.

        Integers and bools are scaled in float32; float16 and bfloat16 cannot hold the
        constants (a mean of 300.109 is 300.0 in float16; a std of 2e-8 is 0), so they are
        worked out in float32 too and given back in their own dtype (``narrow``).
        """
        narrow = value.dtype in _NARROW_FLOATS
        t = value if torch.is_floating_point(value) and not narrow else value.to(torch.float32)
        mean, std = self._pair(name, t.dtype)
        return t, narrow, mean, std

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        for name in self.constants:
            value = sample.get(name)
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                t, narrow, mean, std = self._operands(name, value)
                k = mean.numel()
                if k > 1 and (t.ndim == 0 or t.shape[-1] != k):
                    if t.numel() == 0:  # an empty sample: nothing to scale
                        sample[name] = t.to(value.dtype) if narrow else t
                        continue
                    raise InvalidInputError(
                        f"normalise: {name!r} of sample {sample.get('__key__')!r} has shape "
                        f"{tuple(t.shape)}, but its statistics have {k} components (its "
                        "last axis): give normalise={field: (mean, std)} with one pair for "
                        "every component, or normalise it in a transform"
                    )
                if t.ndim == 0 or k == 1:
                    mean, std = mean.reshape(()), std.reshape(())
                scaled = (t - mean) / std
                sample[name] = scaled.to(value.dtype) if narrow else scaled
            elif isinstance(value, int | float | np.number | bool):
                mean_a, std_a = self.constants[name]
                scaled = (float(value) - mean_a[0]) / std_a[0]
                # a number keeps float64's width only if it was one: an integer or bool
                # becomes float32, as an integer tensor does (a Python float collates as
                # float64, so a batch of ints gave float64 and a single sample float32)
                kind = np.asarray(value).dtype.kind
                sample[name] = torch.tensor(
                    scaled, dtype=torch.float64 if kind == "f" else torch.float32
                )
        return self.then(sample) if self.then is not None else sample

    def columns(self, columns: dict[str, Any],
                empty: Callable[[tuple[int, ...], torch.dtype], torch.Tensor]) -> None:
        """Normalise a batch's columns in ``columns`` (see ``loaders._reading._columns``).

        What :meth:`__call__` makes of each sample, bit for bit (the same operations,
        element by element): a tensor column (the batch's rows stacked) is scaled into a
        tensor from ``empty`` (a worker's pooled shared memory), a list column (values
        that differ in shape) value by value. A vector field whose last axis does not
        match its components is scaled sample by sample, which raises as alone.
        """
        for name in self.constants:
            value = columns.get(name)
            if value is None:
                continue
            if isinstance(value, list):
                columns[name] = [self._one(name, v) for v in value]
                continue
            if not isinstance(value, torch.Tensor) or value.ndim == 0:
                continue
            t, narrow, mean, std = self._operands(name, value)
            k = mean.numel()
            if k > 1 and (t.ndim == 1 or t.shape[-1] != k):
                columns[name] = torch.stack([self._one(name, row) for row in value]) \
                    if len(value) else t
                continue
            if t.ndim == 1 or k == 1:
                mean, std = mean.reshape(()), std.reshape(())
            out = empty(tuple(t.shape), t.dtype)
            torch.sub(t, mean, out=out)
            out.div_(std)
            columns[name] = out.to(value.dtype) if narrow else out

    def _one(self, name: str, value: Any) -> Any:
        """One sample's value of field ``name``, as :meth:`__call__` scales it.

        A number (a scalar parameter a columnar shard gives as a Python number) is made
        the 0-d tensor a transform is given first, so an integer or bool one is scaled in
        float32 as it is sample by sample, not in float64 and then rounded.
        """
        assert self.then is None  # batches are normalised only by a plain normaliser
        if isinstance(value, bool | int | float | np.generic):
            value = to_tensors({name: value}, zero_copy=True, numbers=True)[name]
        return self({name: value})[name]

    def fitted(self, regions: Any, ndims: Mapping[str, int]) -> Normalise:
        """These constants for fields read by region (``regions``: ``_window.Regions``).

        A vector field is scaled component by component along its last axis: a crop of
        that axis takes those components' constants; a window of it (a random range per
        sample) is refused, naming the field. ``ndims``: each field's number of axes.
        """
        constants = dict(self.constants)
        for name, (mean, std) in self.constants.items():
            k, ndim = mean.size, ndims.get(name, 0)
            if k == 1 or ndim == 0:
                continue
            window = regions.windows.get(name, ())
            # a window as long as the axis has one start, 0: every component, in order
            if len(window) == ndim and window[-1] is not None and window[-1] != k:
                raise InvalidInputError(
                    f"window of {name!r} covers its last axis, whose {k} components "
                    "normalise= scales one by one: window the other axes, or normalise "
                    "in a transform"
                )
            crop = regions.crops.get(name, ())
            if len(crop) == ndim:
                start, stop, _ = crop[-1].indices(k)
                if stop <= start:
                    raise InvalidInputError(
                        f"crop of {name!r} keeps none of its {k} components (its last axis)"
                    )
                constants[name] = (mean[start:stop], std[start:stop])
        return Normalise(constants, self.then)


def _given_constants(name: str, value: object) -> tuple[np.ndarray, np.ndarray]:
    """``normalise={name: (mean, std)}``'s constants, one value of each per component."""
    where = f"normalise={{{name!r}: (mean, std)}}"
    pair = value
    if not isinstance(value, str | bytes | Sequence) and hasattr(value, "__array__"):
        try:  # a NumPy array or a torch tensor of both rows
            array = np.asarray(value)
        except (TypeError, ValueError, RuntimeError):
            array = None
        if array is not None and array.ndim:
            pair = list(array)
    if isinstance(pair, str | bytes) or not isinstance(pair, Sequence) or len(pair) != 2:
        raise InvalidInputError(f"{where}: give a (mean, std) pair, got {shown(value)}")
    arrays = []
    for part, given in zip(("mean", "std"), pair, strict=True):
        array = None
        if _numbers(given):
            try:
                array = np.asarray(given, dtype=np.float64).reshape(-1)
            except ValueError:  # ragged lists
                array = None
        if array is None:
            raise InvalidInputError(
                f"{where}: the {part} must be a number or a list of numbers, got {shown(given)}"
            )
        arrays.append(array)
    mean, std = arrays
    if mean.shape != std.shape or not mean.size:
        raise InvalidInputError(
            f"{where}: mean and std need one value per component, got {mean.size} and {std.size}"
        )
    if not np.all(np.isfinite(mean)):
        raise InvalidInputError(f"normalise: the mean of {name!r} must be finite")
    if not np.all(np.isfinite(std)) or not np.all(std > 0):
        raise InvalidInputError(f"normalise: the std of {name!r} must be finite and positive")
    return mean, std


def _components(snap: Snapshot, name: str) -> int | None:
    """Components of numeric field ``name`` (see ``simstore.stats``); None when not known.

    The snapshot's statistics say; without them, a field of fewer than two dimensions has
    one (only a vector field's short last axis has more), and a larger one is not known.
    """
    fields = snap.stats.get("fields")
    summary = fields.get(name) if isinstance(fields, Mapping) else None
    if isinstance(summary, Mapping):
        count = summary.get("components", len(summary.get("count", ())))
        if isinstance(count, int) and count >= 1:
            return count
    spec = next((s for s in snap.schema if s.name == name), None)
    if spec is not None and (spec.kind == "scalar" or spec.ndim < 2):
        return 1
    return None


def _check_components(name: str, given: int, snap: Snapshot) -> None:
    """Refuse given constants that neither broadcast (one value) nor match the components."""
    want = _components(snap, name)
    if given == 1 or want is None or given == want:
        return
    raise InvalidInputError(
        f"normalise={{{name!r}: (mean, std)}}: {name!r} has {want} component"
        f"{'' if want == 1 else 's'}, got {given} values each; give 1 value (for every "
        f"component){'' if want == 1 else f' or {want} (one per component)'}"
    )


def _numbers(value: object) -> bool:
    """Whether ``value`` is a real number (not a bool) or a (nested) list or array of them."""
    if isinstance(value, numbers.Real):
        return not isinstance(value, bool | np.bool_)
    if isinstance(value, str | bytes):
        return False
    if isinstance(value, Sequence):
        return all(map(_numbers, value))
    if hasattr(value, "__array__"):  # a NumPy array, a torch tensor
        try:
            return bool(np.asarray(value).dtype.kind in "iuf")
        except (TypeError, ValueError, RuntimeError):
            return False
    return False


def normaliser(
    spec: NormaliseSpec, snap: Snapshot, fields: tuple[str, ...] | None, ref: str,
    then: Transform | None,
) -> Transform | None:
    """The transform ``SimDataset(normalise=spec)`` applies (None: nothing to normalise).

    ``spec``: True (every numeric field read), field names (their snapshot constants), or
    ``{field: (mean, std)}`` (given constants, e.g. another snapshot's).
    """
    if spec is None or spec is False:
        return then
    numeric = {s.name for s in snap.schema if s.kind in ("tensor", "scalar")}
    read = set(fields) if fields is not None else {s.name for s in snap.schema}
    if isinstance(spec, Mapping):
        constants = {str(k): _given_constants(str(k), v) for k, v in spec.items()}
        names = list(constants)
    elif spec is True:
        names = sorted(numeric & read)
        constants = {}
    elif isinstance(spec, str | bytes) or not isinstance(spec, Sequence):
        raise InvalidInputError(
            f"normalise= takes True, a list of field names or {{field: (mean, std)}}, "
            f"not {spec!r}"
        )
    else:
        names = [str(n) for n in spec]
        constants = {}
    for name in names:
        if name not in numeric:
            raise InvalidInputError(f"normalise= names {name!r}, which is not a numeric field "
                                    f"of {ref} (snapshot {snap.id})")
        if name not in read:
            raise InvalidInputError(f"normalise= names {name!r}, which fields= does not read")
        if name in constants:
            _check_components(name, constants[name][0].size, snap)
    if not isinstance(spec, Mapping):
        if not snap.stats.get("fields"):
            raise InvalidInputError(f"{ref} (snapshot {snap.id}) carries no statistics to "
                                    "normalise with; give normalise={field: (mean, std)}")
        if snap.stats.get("exact") is False:
            # refused here, not by normalisation(), whose advice names its own argument
            raise InvalidInputError(
                f"{ref} (snapshot {snap.id}): statistics are not exact (samples were "
                "overwritten or deleted since they were merged, and their old values still "
                "count); ingest the dataset again with --mode replace for exact ones, or "
                "give normalise={field: (mean, std)} from "
                "simstore.stats.normalisation(snapshot, allow_inexact=True)"
            )
        constants = normalisation(snap, names)
    return Normalise(constants, then) if constants else then
