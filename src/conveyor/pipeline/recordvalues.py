"""Records judged value by value against the C struct a kernel reads them as.

A record's fields need not stand one for one for the struct's members: ``ab`` may hold
floats a and b, a nested struct's members may come flat, a float3 may come as 4 floats.
What must hold is that each number the records hold lies where the struct holds a number of
its own type (or in padding), and that the struct's values are all covered by some field:
:func:`c_values` lists the struct's values by byte, :func:`np_values` the records', and
:func:`value_misfit` compares them. :func:`check_nesting` refuses records nested past any
struct, or naming exponentially many fields, before anything walks, prints or hashes them.
"""

from __future__ import annotations

import bisect
import functools
import math
import threading
from typing import Any

import numpy as np

from conveyor.errors import InputError
from conveyor.pipeline.clayout import C_DTYPES, C_SIZES, CType


def flat(ftype: np.dtype) -> tuple[np.dtype, tuple[int, ...]]:
    """A field's element type and its whole shape, sub-arrays of sub-arrays walked
    (``(('<f4', (4,)), (2,))`` is float32 of shape (2, 4); its element's ``.str`` is
    ``V16``)."""
    shape: tuple[int, ...] = ()
    while ftype.subdtype is not None:
        ftype, inner = ftype.subdtype
        shape += inner
    return ftype, shape


def fields_of(dtype: np.dtype) -> list[tuple[str, np.dtype, int]]:
    """(name, dtype, offset) of each field of structured ``dtype``, in order."""
    described: Any = dtype.fields or {}
    return [(field, described[field][0], described[field][1]) for field in dtype.names or ()]


#: Records whose values are compared one by one (:func:`value_misfit`) hold at most this many
#: (tens of milliseconds, once a stream): beyond, a member of a million floats is judged by
#: its field's type only, and the fields need cover only its members' extents.
_MOST_LEAVES = 65536


#: Structs of at most this many values keep their list between calls (:func:`c_values`);
#: larger ones are listed again at each call (tens of ms at _MOST_LEAVES), so that no stream
#: leaves megabytes of member paths behind it (16 structs of 64,513 values kept 170 MiB).
_KEPT_LEAVES = 4096


def c_values(struct: CType) -> dict[int, tuple[str, str]]:
    """Each value ``struct`` holds (vectors as lanes, arrays as elements, nested structs
    walked), by its byte: (C scalar type, member path). Empty where there are more than
    _MOST_LEAVES. A small struct's list is made once (clayout reads each struct once per
    source): the coverage and the value checks, and every stream of one kernel, share it
    (read only)."""
    with _kept_lock:
        kept = _kept.get(struct)
    if kept is not None:
        return kept
    values = _values_at(struct, 0, "")
    if len(values) <= _KEPT_LEAVES:
        with _kept_lock:
            if len(_kept) >= _KEPT_STRUCTS:
                _kept.pop(next(iter(_kept)))  # the oldest
            _kept[struct] = values
    return values


#: Small structs' value lists, oldest first (:func:`c_values`).
_kept: dict[CType, dict[int, tuple[str, str]]] = {}
_kept_lock = threading.Lock()
_KEPT_STRUCTS = 64


def _values_at(struct: CType, at: int, path: str) -> dict[int, tuple[str, str]]:
    """:func:`c_values` of ``struct`` placed at byte ``at``, its members named under
    ``path``."""
    found: dict[int, tuple[str, str]] = {}
    for member in struct.members:
        ctype = member.ctype
        for index in range(math.prod(member.dims)):
            where = at + member.offset + index * ctype.size
            named = f"{path}{member.field}" + (f"[{index}]" if member.dims else "")
            if ctype.members:
                inner = _values_at(ctype, where, f"{named}.")
                if not inner:
                    return {}
                found.update(inner)
            elif ctype.element is not None:
                size = C_SIZES[ctype.element]
                for lane in range(ctype.lanes):
                    found[where + lane * size] = (ctype.element, f"{named}.s{lane:x}")
            else:
                found[where] = (str(ctype.scalar), named)
            if len(found) > _MOST_LEAVES:
                return {}
    return found


def np_values(dtype: np.dtype) -> list[tuple[int, np.dtype, str]] | None:
    """Each numeric value a record of ``dtype`` holds, by its byte: (byte, dtype, field
    path); a complex value as its two floats, a date or a duration as the int64 it is.
    None (not judged) beyond _MOST_LEAVES values or 4 x _MOST_LEAVES steps (fields that hold
    no number are not walked at all: a million records of no bytes)."""
    found: list[tuple[int, np.dtype, str]] = []
    steps = 0

    def walk(dtype: np.dtype, at: int, path: str) -> bool:
        nonlocal steps
        for field, ftype, offset in fields_of(dtype):
            base, shape = flat(ftype)
            if base.names and not _holds_numbers(base):
                continue  # a million records of no number: not walked one by one
            for index in range(math.prod(shape)):
                steps += 1
                if len(found) > _MOST_LEAVES or steps > 4 * _MOST_LEAVES:
                    return False
                where = at + offset + index * base.itemsize
                named = f"{path}{field}" + (f"[{index}]" if shape else "")
                if base.names:
                    if not walk(base, where, f"{named}."):
                        return False
                elif base.kind in "biuf":
                    found.append((where, base, named))
                elif base.kind == "c":
                    half = np.dtype(f"{base.byteorder}f{base.itemsize // 2}")
                    found.extend([(where, half, f"{named}.real"),
                                  (where + half.itemsize, half, f"{named}.imag")])
                elif base.kind in "mM":
                    found.append((where, np.dtype("int64"), named))
        return True

    return found if walk(dtype, 0, "") else None


@functools.lru_cache(maxsize=256)
def _holds_numbers(dtype: np.dtype) -> bool:
    """Whether records of ``dtype`` hold any number (nested records walked)."""
    for _, ftype, _ in fields_of(dtype):
        base = flat(ftype)[0]
        if base.kind in "biufcmM" or (base.names and _holds_numbers(base)):
            return True
    return False


def value_misfit(dtype: np.dtype, struct: CType) -> str | None:
    """A numeric value of the records that lies where the struct holds a value of another
    type (a float field over a nested struct's int, a record of floats over an int4, a
    nested struct's members given flat), or over part of one; None when every value the
    records hold lies on values of its own type, or in padding. Integers over integers of
    other sizes pass: packed binary read as the struct's own integers is a layout a kernel
    means (a u2 then a u4 for ``ushort w[3]``: round eight)."""
    held = c_values(struct)
    values = np_values(dtype)
    if not held or values is None:
        return None
    starts = sorted(held)
    name = struct.name.removeprefix("struct ")
    for at, ftype, field in values:
        own = held.get(at)
        if own is not None:
            want = np.dtype(C_DTYPES[own[0]])
            if ftype.kind == want.kind and ftype.itemsize == want.itemsize or \
                    _both_integers(ftype, want):
                continue
            return (f"field {field!r} holds {ftype} at byte {at}, where struct {name!r} "
                    f"holds {own[0]} ({own[1]}), so the kernel would read its bytes as "
                    f"another type")
        # over part of one of the struct's values: the last that starts before its end
        # (the struct's values do not overlap, so no earlier one reaches it)
        last = bisect.bisect_left(starts, at + ftype.itemsize) - 1
        if last >= 0 and starts[last] + C_SIZES[held[starts[last]][0]] > at:
            ctype, member = held[starts[last]]
            if _both_integers(ftype, np.dtype(C_DTYPES[ctype])):
                continue
            return (f"field {field!r} holds {ftype} at byte {at}, across {ctype} {member} of "
                    f"struct {name!r}, so the kernel would read its bytes as another type")
    return None


def _both_integers(one: np.dtype, other: np.dtype) -> bool:
    """Both integer types of other sizes (packed binary; of one size, a signed int over an
    unsigned one is judged as any other type is)."""
    return one.kind in "biu" and other.kind in "biu" and one.itemsize != other.itemsize


#: Records nested deeper than this are refused before they are walked (no C struct a kernel
#: reads nests so deep; conveyor lays out 8 levels): 3,000 levels in a .npy header raised a
#: RecursionError from the walk, and 400 from NumPy's own printing of the dtype.
_MOST_NESTING = 64
#: Records whose dtype names more fields than this (nested ones counted where they stand) are
#: refused too: a record of two records of two records... of 40 levels is 2**40 fields to
#: print in a message, to walk or to spell.
_MOST_FIELDS = 65536


def check_nesting(where: str, dtype: np.dtype) -> None:
    """InputError (naming no dtype: its text is what overflows) when records of ``dtype``
    nest records more than _MOST_NESTING levels deep, or name more than _MOST_FIELDS fields
    counted where they stand; walked without recursion, each nested dtype once a level."""
    level, layer = 0, [dtype]
    while layer:
        level += 1
        if level > _MOST_NESTING:
            raise InputError(
                f"{where} has records nested more than {_MOST_NESTING} levels deep (records "
                f"within records), which no C struct a kernel reads is: flatten them to the "
                f"struct's members")
        inner = []
        for one in layer:
            for name in one.names or ():
                ftype = one.fields[name][0]  # type: ignore[index]
                while ftype.subdtype is not None:
                    ftype = ftype.subdtype[0]
                if ftype.names:
                    inner.append(ftype)
        # one record dtype shared by many fields, once (by identity: a dtype's hash and ==
        # walk all its nesting, 2**40 fields for 40 levels of two)
        layer = list({id(one): one for one in inner}.values())
    counted: dict[int, int] = {}
    for one in _innermost_first(dtype):
        total = 0
        for name in one.names or ():
            base = flat(one.fields[name][0])[0]  # type: ignore[index]
            total += counted[id(base)] if base.names else 1
        counted[id(one)] = min(total, _MOST_FIELDS + 1)
    if counted[id(dtype)] > _MOST_FIELDS:
        raise InputError(
            f"{where} has records of more than {_MOST_FIELDS} fields (records within records "
            f"counted where they stand), more than conveyor judges: for a struct of that "
            f"many members, pass the records as their bytes, a.view(np.dtype((np.void, "
            f"a.itemsize))) (then nothing checks that they are laid out as the kernel's "
            f"struct), or group members into arrays")


def _innermost_first(dtype: np.dtype) -> list[np.dtype]:
    """``dtype`` and every record dtype nested in it, each once, innermost first (the
    nesting is bounded: :func:`check_nesting` walked its levels)."""
    order: list[np.dtype] = []
    seen: set[int] = set()  # by identity, as check_nesting's layers
    stack: list[tuple[np.dtype, bool]] = [(dtype, False)]
    while stack:
        one, done = stack.pop()
        if done:
            order.append(one)
            continue
        if id(one) in seen:
            continue
        seen.add(id(one))
        stack.append((one, True))
        for name in one.names or ():
            base = flat(one.fields[name][0])[0]  # type: ignore[index]
            if base.names and id(base) not in seen:
                stack.append((base, False))
    return order
