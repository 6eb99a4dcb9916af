"""Batching samples: stack equal shapes, pad or pack the variable ones (meshes).

A mesh's point and cell arrays change length from sample to sample, so a batch of them
cannot be stacked. Two layouts, chosen by ``mesh=``:

- ``"pad"``: each field is padded to the batch's largest shape with ``pad_value``, and a
  boolean ``<field>__mask`` marks the real entries. The mask spans the leading dimensions
  up to the last one that varies, so ``points`` of shape ``(n_i, 3)`` get a ``(B, n_max)``
  mask.
- ``"pack"``: the samples are concatenated along the first dimension and
  ``<field>__offsets`` (``B + 1`` int64 values) says where each sample starts, as in
  CSR/PyG layouts. ``index_fields`` maps an index field to the field it indexes (for
  example ``{"cells/triangle": "points"}``); its values are shifted by that field's
  offsets, so packed cells address packed points.

Strings, bytes and JSON fields become lists; Python numbers and booleans become tensors.

A field that only some samples of a batch have (a dataset whose later snapshot added it,
or a mixture of sources with different fields) is batched anyway, with a boolean
``<field>__present`` of shape ``(B,)`` marking the samples that have it. The others get
``pad_value`` entries of the present samples' shape and dtype (by the padding rules above
where those shapes differ; zero rows when packed), or None in a list field. A field that
every sample has gets no ``__present``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from simstore.loaders._checks import check_number, shown
from simstore.loaders._tensors import number_tensor, stacked_view

from simstore.errors import InvalidInputError

__all__ = ["Collate", "MeshMode"]

MeshMode = Literal["pad", "pack"]

MESH_FIELDS = ("points", "cells/", "point_data/", "cell_data/")
"""The mesh adapter's variable-length fields (see docs/adapters.md)."""


_NUMPY = (np.ndarray, np.generic)
_NUMBER = (bool, int, float)
_TENSOR_OR_NUMBER = (torch.Tensor, bool, int, float)


def _all_of(types: set[type], kind: type | tuple[type, ...]) -> bool:
    """Whether each of ``types`` is a subclass of ``kind``, as ``isinstance`` would say."""
    return all(issubclass(t, kind) for t in types)


def _any_of(types: set[type], kind: type | tuple[type, ...]) -> bool:
    return any(issubclass(t, kind) for t in types)


Empty = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]
"""Where a batch's stacked fields are made (``ChunkBuffers.empty``: a worker's pool)."""


def _stack(values: list[torch.Tensor], empty: Empty | None = None) -> torch.Tensor:
    """``torch.stack``, through NumPy for plain CPU tensors, or into ``empty``'s memory.

    NumPy asks the kernel for transparent huge pages for large arrays and torch's CPU
    allocator does not; a batch is fresh memory, so on Linux stacking into a NumPy array
    takes a fraction of the page faults (measured 2.9 vs 0.6 GiB/s for 8 x 4 MiB). In a
    DataLoader worker, ``empty`` gives pooled shared memory instead, faulted in once and
    sent as a reference, where torch would move a fresh batch into new shared memory.
    """
    view = stacked_view(values)
    if view is not None:
        return view
    first = values[0]
    uniform = first.device.type == "cpu" and all(
        v.dtype == first.dtype and v.device.type == "cpu" and not v.requires_grad
        for v in values)
    if uniform and empty is not None and first.layout == torch.strided:
        # ``empty`` pools what is large enough to be worth it (``SHARED_MIN_BYTES``)
        return torch.stack(values, out=empty((len(values), *first.shape), first.dtype))
    large = uniform and first.numel() * len(values) * first.element_size() >= 1 << 20
    if large and first.dtype not in (torch.bfloat16, torch.complex32):
        return torch.from_numpy(np.stack([v.numpy() for v in values]))
    return torch.stack(values)


def _common_dtype(name: str, tensors: Sequence[torch.Tensor]) -> torch.dtype:
    """The dtype a batch of ``tensors`` takes: torch's promotion of theirs.

    One that torch cannot promote (an unsigned and a signed integer of 16 bits or more)
    is an error naming the field.
    """
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype != dtype:
            try:
                dtype = torch.promote_types(dtype, t.dtype)
            except RuntimeError as exc:
                raise InvalidInputError(
                    f"field {name!r} has {dtype} and {t.dtype} values in one batch, which "
                    f"torch cannot combine ({' '.join(str(exc).split())}): its dtype "
                    "changed between snapshots; convert it in a transform"
                ) from exc
    return dtype


@dataclass(frozen=True, slots=True, kw_only=True)
class Collate:
    """The loader's collate function (picklable, so it works with spawn workers)."""

    mesh: MeshMode = "pad"
    pad_value: float = 0.0
    index_fields: Mapping[str, str] = field(default_factory=dict)
    variable_fields: tuple[str, ...] = MESH_FIELDS
    """Fields that always get a ``__mask`` (pad) or ``__offsets`` (pack), even in a batch
    whose samples happen to have equal shapes, so a batch's keys never depend on its data:
    exact names, or prefixes ending in ``/``. Other fields get them only when they vary."""

    def __post_init__(self) -> None:
        if self.mesh not in ("pad", "pack"):
            raise InvalidInputError(f"invalid mesh layout {self.mesh!r}: expected 'pad' or 'pack'")
        check_number(self.pad_value, "pad_value", finite=False)
        if not isinstance(self.index_fields, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.index_fields.items()):
            raise InvalidInputError(
                "index_fields must map an index field to the field it indexes, e.g. "
                f"{{'cells/triangle': 'points'}}, got {shown(self.index_fields)}"
            )

    def __call__(self, samples: Sequence[Mapping[str, Any]], *,
                 empty: Empty | None = None) -> dict[str, Any]:
        if not samples:
            return {}
        names = list(samples[0])
        known = samples[0].keys()
        present: dict[str, list[bool]] = {}
        if not all(map(known.__eq__, (s.keys() for s in samples[1:]))):
            seen = set(names)
            for s in samples[1:]:
                names.extend(n for n in s if n not in seen)
                seen.update(s)
            present = {n: [n in s for s in samples] for n in names
                       if not all(n in s for s in samples)}
        return self.columns({name: [s.get(name) for s in samples] if name in present
                             else [s[name] for s in samples] for name in names},
                            present=present, empty=empty)

    def columns(
        self,
        columns: Mapping[str, list[Any] | torch.Tensor],
        *,
        present: Mapping[str, Sequence[bool]] | None = None,
        empty: Empty | None = None,
    ) -> dict[str, Any]:
        """A batch from its columns; the same as ``__call__`` gives for the same samples.

        A column is a field's values in sample order: a list, or one tensor whose rows are
        the samples' values (already stacked, as the loader's decode buffers hold them).
        ``present`` maps a field that some samples lack to one flag per sample; the values
        at its unset flags are ignored (None, or any placeholder row), and the batch gets
        ``<field>__present`` (see the module's docstring).
        """
        out: dict[str, Any] = {}
        lengths: dict[str, list[int]] = {}
        taken: dict[str, Sequence[Any] | torch.Tensor] = {}  # as batched: tensors, numbers
        for name, values in columns.items():
            flags = present.get(name) if present else None
            if flags is not None and all(flags):
                flags = None
            if isinstance(values, torch.Tensor):
                if flags is None and self.as_is(name, values):
                    out[name] = values
                    continue
                values = list(values.unbind(0))
            elif _any_of(set(map(type, values)), _NUMPY):
                values = [_from_numpy(v) for v in values]  # from a transform
            taken[name] = values
            real = values if flags is None else [v for v, p in zip(values, flags, strict=True)
                                                  if p]
            # the kinds of a column's values, judged by their types once (a batch of 256
            # samples of 8 KiB: those scans were about 7% of the reading thread's time)
            types = set(map(type, real))
            if real and not _all_of(types, torch.Tensor) and _all_of(types, _TENSOR_OR_NUMBER) \
                    and _any_of(types, torch.Tensor):
                # a scalar that one snapshot stored as a parameter (a number) and a later
                # one as a 0-d array (a tensor): one tensor column, not a mixed list
                values = [v if v is None or isinstance(v, torch.Tensor)
                          else number_tensor([v])[0] for v in values]
                real = [v for v in values if v is not None] if flags is not None else values
                types = set(map(type, real))
            if real and _all_of(types, torch.Tensor):
                variable = self._is_variable(name)
                self._tensors(
                    name, values, out, lengths, always_pack=self._packs(name, variable),
                    always_pad=variable, present=flags, empty=empty,
                )
            elif real and _all_of(types, _NUMBER):
                out[name] = self._numbers(values, flags)
            elif real and _any_of(types, _TENSOR_OR_NUMBER):
                kinds = sorted({"tensor" if isinstance(v, torch.Tensor) else
                                "number" if isinstance(v, bool | int | float) else
                                type(v).__name__ for v in real})
                raise InvalidInputError(
                    f"field {name!r} holds values of different kinds in one batch "
                    f"({', '.join(kinds)}): its kind changed between snapshots; select one "
                    f"kind with a transform, or leave the field out (fields=)"
                )
            elif flags is None:
                out[name] = list(values)
            else:
                out[name] = [v if p else None for v, p in zip(values, flags, strict=True)]
            if flags is not None:
                out[f"{name}__present"] = torch.tensor(flags, dtype=torch.bool)
        if self.mesh == "pack":
            for name, target in self.index_fields.items():
                flags = present.get(name) if present else None
                if name in out and target in lengths and (flags is None or any(flags)):
                    self._shift(name, target, taken[name], out, lengths, flags)
        return out

    def _numbers(self, values: list[Any], present: Sequence[bool] | None) -> torch.Tensor:
        """A column of Python numbers as a tensor; absent samples get ``pad_value``."""
        if present is None:
            return number_tensor(values)
        real = number_tensor([v for v, p in zip(values, present, strict=True) if p])
        column = torch.full((len(values),), self.fill_for(real.dtype), dtype=real.dtype)
        column[torch.tensor(present, dtype=torch.bool)] = real
        return column

    def fill_for(self, dtype: torch.dtype) -> float | int | bool:
        """What pads a tensor of ``dtype``: ``pad_value``, or 0 where the dtype cannot hold it.

        An integer or bool field holds ``pad_value`` only when it is a whole number in the
        dtype's range; otherwise (NaN, infinities, 0.5, -1 in uint8) its padding is 0, as
        the mask or the presence flags say which entries are real. A float field whose
        dtype cannot hold it exactly gets torch's rounding (1e300 is inf in float32).
        """
        value = self.pad_value
        if dtype.is_floating_point or dtype.is_complex:
            return float(value)  # an int past int64 (2**70) overflowed in torch.full
        if dtype == torch.bool:
            return bool(value) if value in (0, 1) else False
        if not math.isfinite(value) or value != int(value):
            return 0
        info = torch.iinfo(dtype)
        return int(value) if info.min <= int(value) <= info.max else 0

    def as_is(self, name: str, values: torch.Tensor) -> bool:
        """Whether :meth:`columns` puts a full column ``values`` in the batch unread, as is."""
        variable = self._is_variable(name)
        return not self._packs(name, variable) and not (variable and values.dim() > 1)

    def _packs(self, name: str, variable: bool) -> bool:
        return self.mesh == "pack" and (
            variable or name in self.index_fields or name in self.index_fields.values()
        )

    def _tensors(
        self,
        name: str,
        values: list[Any],
        out: dict[str, Any],
        lengths: dict[str, list[int]],
        *,
        always_pack: bool,
        always_pad: bool = False,
        present: Sequence[bool] | None = None,
        empty: Empty | None = None,
    ) -> None:
        """Stack, pad or pack a column of tensors into ``out`` (and ``lengths``, packed).

        ``present``: one flag per sample where some samples lack the field; the shapes are
        those of the samples that have it, and the others get ``pad_value`` entries (in
        the stacked and padded layouts, their mask all False) or zero rows (packed).
        """
        real: list[torch.Tensor] = values if present is None else [
            v for v, p in zip(values, present, strict=True) if p
        ]
        dtype = _common_dtype(name, real)
        if any(v.dtype != dtype for v in real):
            # a field whose dtype changed between snapshots: one batch, one dtype, by
            # torch's promotion (a padded batch used to take the first sample's, casting
            # 0.5 in a later float64 sample to 0 in an int64 batch)
            values = [v.to(dtype) if isinstance(v, torch.Tensor) else v for v in values]
            real = [v.to(dtype) for v in real]
        first = real[0]
        shapes = {tuple(v.shape) for v in real}
        if len(shapes) == 1 and not always_pack and not (always_pad and first.dim() > 0):
            if present is not None:
                fill = torch.full(first.shape, self.fill_for(first.dtype), dtype=first.dtype,
                                  device=first.device)
                values = [v if p else fill for v, p in zip(values, present, strict=True)]
            out[name] = _stack(values, empty)
            return
        flags = [True] * len(values) if present is None else present
        ndims = {v.dim() for v in real}
        if ndims == {0}:  # packed because index_fields names it: nothing to pack
            raise InvalidInputError(
                f"field {name!r} holds one number per sample (0-d): it cannot be packed, so "
                f"it cannot be in index_fields, which maps an index field of one or more "
                f"dimensions to the field it indexes"
            )
        if len(ndims) != 1 or 0 in ndims:  # a 0-d field can only differ in rank
            raise InvalidInputError(
                f"field {name!r} has tensors of different ranks in one batch: {sorted(shapes)}"
            )
        if self.mesh == "pack":
            tails = {tuple(v.shape[1:]) for v in real}
            if len(tails) != 1:
                raise InvalidInputError(
                    f"field {name!r} cannot be packed: shapes differ beyond the first "
                    f"dimension ({sorted(shapes)}); use mesh='pad'"
                )
            sizes = [int(v.shape[0]) if p else 0 for v, p in zip(values, flags, strict=True)]
            lengths[name] = sizes
            out[name] = torch.cat(real)
            offsets = torch.zeros(len(values) + 1, dtype=torch.int64)
            offsets[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)
            out[f"{name}__offsets"] = offsets
            return
        biggest = [max(s[d] for s in shapes) for d in range(first.dim())]
        varying = [d for d in range(len(biggest)) if len({s[d] for s in shapes}) > 1]
        depth = varying[-1] + 1 if varying else 1
        padded = torch.full((len(values), *biggest), self.fill_for(dtype), dtype=dtype)
        mask = torch.zeros((len(values), *biggest[:depth]), dtype=torch.bool)
        for i, (v, p) in enumerate(zip(values, flags, strict=True)):
            if not p:
                continue
            region: tuple[int | slice, ...] = tuple(slice(0, int(n)) for n in v.shape)
            padded[(i, *region)] = v
            mask[(i, *region[:depth])] = True
        out[name] = padded
        out[f"{name}__mask"] = mask

    def _is_variable(self, name: str) -> bool:
        return any(
            name.startswith(v) if v.endswith("/") else name == v for v in self.variable_fields
        )

    def _shift(
        self,
        name: str,
        target: str,
        values: Sequence[Any] | torch.Tensor,
        out: dict[str, Any],
        lengths: dict[str, list[int]],
        present: Sequence[bool] | None = None,
    ) -> None:
        for value in values:
            if isinstance(value, torch.Tensor) and (
                    value.dtype.is_floating_point or value.dtype.is_complex
                    or value.dtype == torch.bool):
                # the mapping written the wrong way round shifted coordinates silently
                raise InvalidInputError(
                    f"index_fields: {name!r} holds {str(value.dtype).removeprefix('torch.')} "
                    f"values, not integer indices into {target!r}; index_fields maps an "
                    f"index field to the field it indexes, e.g. {{'cells': 'points'}}"
                )
        starts = [0]
        for n in lengths[target][:-1]:
            starts.append(starts[-1] + n)
        flags = [True] * len(starts) if present is None else present
        # in int64, as the offsets are: a uint8 or int16 field's indices into a packed
        # batch wrapped around past its type's range (torch adds a number in the
        # tensor's own dtype), and a batch's dtype must not depend on its size
        parts = [_as_index(name, v) + start if p else None
                 for v, start, p in zip(values, starts, flags, strict=True)]
        out[name] = torch.cat([p for p in parts if p is not None])
        if f"{name}__offsets" not in out:
            sizes = [int(p.shape[0]) if p is not None else 0 for p in parts]
            offsets = torch.zeros(len(parts) + 1, dtype=torch.int64)
            offsets[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)
            out[f"{name}__offsets"] = offsets


def _as_index(name: str, value: torch.Tensor) -> torch.Tensor:
    """An index field's values as int64; one past int64's range is refused, naming it."""
    if value.dtype == torch.int64:
        return value
    if value.dtype == torch.uint64:
        # torch has no comparisons of uint64 tensors: the values are checked in numpy
        if value.numel() and int(value.numpy().max()) > torch.iinfo(torch.int64).max:
            raise InvalidInputError(
                f"index_fields: {name!r} holds uint64 indices beyond int64's range; a "
                f"packed batch's indices are int64"
            )
    return value.to(torch.int64)


def _from_numpy(value: Any) -> Any:
    """A transform's NumPy value as torch's own collate takes it.

    An array of numbers becomes a tensor (stacked with the others), and so does a NumPy
    scalar (a 0-d tensor of its dtype: a column of ``np.float32`` is a float32 batch, not
    float64 by way of a Python float); anything else stays as it is.
    """
    if isinstance(value, _NUMPY) and value.dtype.kind in "biufc":
        # np.asarray: torch takes a uint64 scalar only as an array
        return torch.as_tensor(np.asarray(value))
    return value
