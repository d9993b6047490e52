"""Structured NumPy records against the C struct a kernel reads them as.

NumPy packs a structured dtype's fields unless ``align=True``; C pads a struct's members to
their alignment. Records of ``[('a', 'u1'), ('b', 'f4')]`` are 5 bytes, ``struct { uchar a;
float b; }`` is 8: the kernel then reads every record but the first from the wrong bytes,
with no error (OpenCL reports no pointee sizes). :func:`check_struct` compares the two where
the struct can be read from the kernel's source (pipeline/clayout.py: its definition there,
with members of scalar, vector and nested struct types, and arrays of them). Anything else
(a struct from a header or a macro, bit fields, unions, a source that mentions ``pack``) is
not judged, so a layout the kernel really uses is never refused.
"""

from __future__ import annotations

import bisect
import math
import re
from typing import Any

import numpy as np

from conveyor.errors import InputError
from conveyor.pipeline.clayout import C_DTYPES, CType, Member, c_dtype, c_layout, struct_type
from conveyor.pipeline.recordvalues import (
    C_SIZES,
    c_values,
    check_nesting,
    fields_of,
    flat,
    value_misfit,
)

__all__ = ["c_dtype", "c_layout", "check_fields", "check_nesting", "check_struct", "packs",
           "records_dtype", "spell", "struct_source"]

def packs(source: str) -> bool:
    """True when ``source`` (its code: see :func:`struct_source`) may pack a struct: a
    ``packed`` attribute anywhere in an ``__attribute__((...))`` list (``aligned(1),
    packed``), ``#pragma pack`` or ``#pragma options align=...`` (clang takes both), or
    either as ``_Pragma("...")`` (whose text ``code_only`` keeps); the word in a comment did
    not count."""
    if re.search(r'#\s*pragma\s+(?:pack|options\s+align)\b|\b_Pragma\s*\(\s*(?:L|u8|u|U)?"'
                 r'\s*(?:pack|options\s+align)\b', source):
        return True
    return any(re.search(r"\b(?:__)?packed(?:__)?\b", text) for text in _attributes(source))


def _attributes(source: str) -> list[str]:
    """The text of each outermost ``__attribute__(...)`` of ``source``, to its balanced
    close (or the end), in one pass: one nested in another is read as part of it."""
    found: list[str] = []
    end = 0
    parens = re.compile(r"[()]")
    for match in re.finditer(r"__attribute__\s*+\(", source):
        if match.start() < end:
            continue
        depth, end = 1, len(source)
        for paren in parens.finditer(source, match.end()):
            depth += 1 if paren.group() == "(" else -1
            if not depth:
                end = paren.end()
                break
        found.append(source[match.end():end])
    return found


def struct_source(kernel: Any) -> str | None:
    """The code of ``kernel``'s source as its compiler reads it, where struct definitions
    are read from: preprocessed with the device's macros and the kernel's options (the
    branch of an ``#ifdef`` the compiler takes), comments and string literals blanked (a
    commented-out old definition decided the layout). None without a source."""
    source = getattr(kernel, "source", None)
    if source is None:
        return None
    from conveyor.kernels.build import expanded_source
    from conveyor.kernels.signature import code_only

    options = getattr(kernel, "options", None) or ()
    return code_only(expanded_source(kernel.device, source, options))


def records_dtype(kernel: Any, param: Any) -> np.dtype | None:
    """The dtype of records of the struct that pointer parameter ``param`` of ``kernel``
    points to, as the compiler lays it out: what a file output of it holds where no dtype
    is given. None where conveyor cannot lay it out, or the source packs structs."""
    code = struct_source(kernel)
    if code is None or packs(code):
        return None
    return c_dtype(code, param.struct_name)


def spell(dtype: np.dtype) -> str:
    """``dtype`` (structured) as the ``np.dtype(...)`` call that makes it, for messages:
    a list of fields where NumPy's own placing gives its offsets (packed, or with
    ``align=True``), else names, formats, offsets and itemsize. Nested records are spelled
    the same way."""
    return _spelled(dtype)[0]


def _spelled(dtype: np.dtype) -> tuple[str, np.dtype]:
    """:func:`spell`'s text, and the dtype that text makes, built beside it (never by
    evaluating text): the first form whose dtype is ``dtype`` is taken. A nested record
    spelled with ``align=True`` is aligned as a field, which moved the outer fields of a
    packed record (an np.fromfile advised that read other rows)."""
    described: Any = dtype.fields or {}
    names = list(dtype.names or ())
    texts, made = [], []  # each field's element type spelled and made, and its shape
    for field in names:
        base, shape = flat(described[field][0])
        text, one = _spelled(base) if base.names else (repr(base.str.lstrip("|")), base)
        texts.append((text, shape))
        made.append(np.dtype((one, shape)) if shape else one)
    listed = ", ".join(f"({field!r}, {one}, {shape!r})" if shape else f"({field!r}, {one})"
                       for field, (one, shape) in zip(names, texts, strict=True))
    parts = ", ".join(f"({one}, {shape!r})" if shape else one for one, shape in texts)
    offsets = [described[field][1] for field in names]
    placed = (f"{{'names': {names!r}, 'formats': [{parts}], 'offsets': {offsets!r}, "
              f"'itemsize': {dtype.itemsize}}}")
    fields = list(zip(names, made, strict=True))
    layout: Any = {"names": names, "formats": made, "offsets": offsets,
                   "itemsize": dtype.itemsize}
    candidates = [(f"np.dtype([{listed}], align=True)", lambda: np.dtype(fields, align=True)),
                  (f"np.dtype([{listed}])", lambda: np.dtype(fields)),
                  (f"np.dtype({placed}, align=True)", lambda: np.dtype(layout, align=True)),
                  (f"np.dtype({placed})", lambda: np.dtype(layout))]
    for text, make in candidates:
        try:
            built = make()
        except (TypeError, ValueError):  # offsets NumPy's align=True refuses
            continue
        if built == dtype:
            return text, built
    return candidates[-1][0], dtype


def _paired(fields: list[tuple[str, np.dtype, int]], struct: CType
            ) -> list[tuple[tuple[str, np.dtype, int], Member]]:
    """Each field named as a member beside that member (by name: in any order, whatever the
    other fields are called: a field named ``x`` at ``y``'s bytes ran with x and y swapped
    where one other field was named otherwise). Fields named otherwise may group the values
    otherwise (``ab`` for floats a and b): they are judged value by value
    (:func:`value_misfit`), not field by member."""
    by_name = {member.field: member for member in struct.members}
    return [(field, by_name[field[0]]) for field in fields if field[0] in by_name]


def _placed_misfit(dtype: np.dtype, struct: CType) -> str | None:
    """What keeps the records of ``dtype`` from being placed as ``struct``'s members: a
    field at another offset than the member it stands for (:func:`_paired`); another record
    size. None when both agree."""
    name = struct.name.removeprefix("struct ")
    fields = fields_of(dtype)
    for (field, ftype, at), member in _paired(fields, struct):
        if at != member.offset:
            number = struct.members.index(member) + 1
            return (f"field {field!r} ({ftype}) lies at byte {at}, where C puts member "
                    f"{number} of struct {name!r} at byte {member.offset}")
    if struct.size != dtype.itemsize:
        return f"C lays out struct {name!r} in {struct.size} bytes"
    return None


def _member_misfit(dtype: np.dtype, struct: CType) -> str | None:
    """What, beside the offsets and the size, keeps records of ``dtype`` from being read as
    ``struct``'s members, or None: a member no field covers (a view of some fields keeps the
    stride but not the others: the kernel read the hidden or stale bytes), a numeric field
    of another kind or size than
    its member (a float32 for an int: its bits; 3 floats for a float4), or a nested record
    that misfits its member's struct."""
    name = struct.name.removeprefix("struct ")
    fields = fields_of(dtype)
    members = struct.members
    pairs = _paired(fields, struct)
    at_offset = {m.offset: m for m in members if m.ctype.members}
    for field, ftype, at in fields:  # a nested struct's record, judged first: the field
        base = flat(ftype)[0]  # named as its member, or any record of its size at its bytes
        member = dict(pairs).get((field, ftype, at)) or at_offset.get(at)
        if member is not None and member.ctype.members and base.names and (
                member.field == field or base.itemsize == member.ctype.size):
            inner = _placed_misfit(base, member.ctype) or _member_misfit(base, member.ctype)
            if inner is not None:
                return f"in field {field!r} (member {member.field!r} of struct {name!r}), {inner}"
    # The bytes the fields cover, as disjoint runs; the bytes the struct's values hold (a
    # nested struct's padding needs no field), or its members' whole extents where it holds
    # too many values to list.
    runs: list[list[int]] = []
    for lo, hi in sorted((at, at + ftype.itemsize) for _, ftype, at in fields):
        if runs and lo <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], hi)
        else:
            runs.append([lo, hi])
    starts = [lo for lo, _ in runs]
    values = c_values(struct)
    spans = ([(at, C_SIZES[ctype], path) for at, (ctype, path) in sorted(values.items())]
             if values else [(m.offset, m.extent, m.field) for m in members
                             if not m.ctype.members])  # a nested one's padding needs none
    for at, size, path in spans:
        run = bisect.bisect_right(starts, at) - 1
        if size and (run < 0 or runs[run][1] < at + size):
            return (f"no field covers member {path!r} (bytes {at} to {at + size - 1}), so "
                    f"the kernel would read bytes the records do not hold")
    for (field, ftype, _), member in pairs:  # paired by name: a field named as another
        base, shape = flat(ftype)  # member than the one at its bytes is misplaced, above
        ctype, dims = member.ctype, member.dims
        if ctype.members:  # a nested struct: its records were judged above, numbers
            continue  # over it value by value (_leaf_misfit)
        want = np.dtype(C_DTYPES[ctype.scalar or ctype.element or "char"])
        lanes = ctype.size // want.itemsize  # a vector's lanes, its padding lane too
        # the member's own shape (an array's dims, then a vector's lanes), or all its values
        # in a row: float m[2][3] given as (3, 2) read m[i][j] from another place
        whole = dims + ((lanes,) if ctype.element is not None else ())
        shapes = {whole, (math.prod(whole),)}
        if not dims:
            shapes |= {(ctype.lanes,)} if ctype.element is not None else {(), (1,)}
        if base.kind in "biuf" and (base.kind != want.kind or base.itemsize != want.itemsize
                                    or shape not in shapes):
            return (f"field {field!r} holds {ftype} where member {member.field!r} of struct "
                    f"{name!r} is {ctype.name}{''.join(f'[{d}]' for d in dims)}, so the "
                    f"kernel would read its bytes as another type")
    return None


def check_fields(where: str, dtype: np.dtype, source: str | None, type_name: str) -> None:
    """InputError when ``dtype`` has no fields but ``where`` (a kernel parameter) points to
    the struct ``type_name`` that ``source`` defines: the kernel would read the array's
    elements as the bytes of records. Not judged where the source is unknown or does not
    define the struct so that :func:`c_layout` reads it (a header, a macro)."""
    if dtype.names or source is None:
        return
    struct = struct_type(source, type_name)
    wanted = c_dtype(source, type_name)
    if struct is None or wanted is None:
        return
    name, size = struct.name.removeprefix("struct "), wanted.itemsize
    if packs(source):  # #pragma pack(2), a packed struct: conveyor does not lay them out
        raise InputError(
            f"{where} points to struct {name!r}, but the array holds {dtype}, which has no "
            f"fields, so the kernel would read its bytes as records: pass a structured array "
            f"laid out as the compiler lays out the struct (the source packs structs, which "
            f"conveyor does not lay out), with the fields filled in")
    raise InputError(
        f"{where} points to struct {name!r} of {size} bytes, but the array holds {dtype}, "
        f"which has no fields, so the kernel would read its bytes as records: pass a "
        f"structured array of the struct's members, e.g. np.zeros(n, {spell(wanted)}), with "
        f"the fields filled in (or a.view() of that dtype, for an array of the records' raw "
        f"bytes)")


def check_struct(where: str, dtype: np.dtype, source: str | None, type_name: str = "",
                 output: bool = False, temp: str = "") -> None:
    """InputError when structured ``dtype``, for a pointer to struct ``type_name`` (``where``
    names the parameter), is not laid out as C lays out that struct in ``source``: other
    record size, or, with as many fields as members, a field at another offset. Not judged
    (no error) where :func:`c_layout` cannot read the struct, the source is unknown (None),
    or it mentions ``pack`` (``__attribute__((packed))``, ``#pragma pack``). ``output``: the
    records are a stream's output (the kernel writes them; asked for by dtype, not
    converted); ``temp``: they are a chain's temp of that name (declared in ``temps=``, not
    an array the caller holds)."""
    if not dtype.names or source is None or packs(source):
        return
    check_nesting(where, dtype)
    struct = struct_type(source, type_name)
    wanted = c_dtype(source, type_name)
    if struct is None or wanted is None:
        return
    verb = f"declare temp {temp!r} in temps= as" if temp else "ask for" if output else "pass"
    misfit = _placed_misfit(dtype, struct)
    if misfit is None:
        members = _member_misfit(dtype, struct) or value_misfit(dtype, struct)
        if members is None:
            return
        raise InputError(f"{where} has structured dtype {dtype}, but {members}: {verb} "
                         f"records of the struct's own dtype, {spell(wanted)}, with each "
                         f"field filled by its name")
    fields = fields_of(dtype)
    aligned = np.dtype([(field, ftype) for field, ftype, _ in fields], align=True)
    if aligned == wanted:
        padded = spell(aligned)
        fix = (f"declare temp {temp!r} in temps= as {padded}, which pads the fields as C "
               f"does" if temp else
               f"ask for {padded} as the output's dtype (outputs=[dt], cv.per_block(1, dt) "
               f"or np.empty(shape, dt)), which pads the fields as C does" if output else
               f"pass a.astype({padded}), which pads the fields as C does")
    else:
        fix = (f"{verb} records of the struct's own dtype, {spell(wanted)} (its members at "
               f"offsets {[m.offset for m in struct.members]}, {struct.size} bytes in all)")
    raise InputError(
        f"{where} has structured dtype {dtype} of {dtype.itemsize} bytes, but {misfit}, so "
        f"the kernel would {'write' if output else 'read'} each record "
        f"{'to' if output else 'from'} the wrong bytes: {fix} (or declare the "
        f"struct __attribute__((packed)) if the kernel means NumPy's layout)")
