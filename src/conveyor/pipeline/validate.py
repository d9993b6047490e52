"""Check a stream's arguments before anything is allocated; every problem is an InputError
that says what to change."""

from __future__ import annotations

import array as pyarray
import ctypes
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Kernel, named_beside
from conveyor.errors import InputError
from conveyor.kernels.argcast import caster
from conveyor.kernels.signature import Param
from conveyor.pipeline.plan import ArraySpec
from conveyor.pipeline.reduce import BUILTIN_OPS
from conveyor.pipeline.structs import check_fields, check_nesting, struct_source
from conveyor.pipeline.structs import check_struct as _check_layout


def _foreign(value: Any, role: str) -> str | None:
    """What to say of an object that is not a NumPy array but looks like one (it has a
    ``dtype``: a cv.resident handle, a device array of PyOpenCL, CuPy or PyTorch, a NumPy
    scalar), or None for anything else. Taken as a dtype, an output would be a new array and
    the object never written; taken by ``np.asarray``, an input holds Python objects."""
    if isinstance(value, np.ndarray | np.dtype | type) or not hasattr(value, "dtype"):
        return None
    from conveyor.pipeline.resident import Resident
    from conveyor.pipeline.sinks import dtype_code

    kind = type(value).__name__
    if isinstance(value, Resident):
        return (f"is a cv.resident(...) handle: resident tables go in args= (where the kernel "
                f"declares a pointer); pass the NumPy array itself as {role}")
    if isinstance(value, np.generic):
        return (f"is a NumPy scalar ({kind}): {role}s are arrays"
                + (f"; for a new array, pass the dtype itself ({dtype_code(value.dtype)})"
                   if role == "output" else "; pass scalars in args="))
    return (f"is a {type(value).__module__}.{kind}, not a NumPy array: conveyor reads and "
            f"writes host NumPy arrays; pass one (np.empty(shape, dtype), or the dtype itself "
            f"for a new array) and copy it to or from your {kind}"
            if role == "output" else
            f"is a {type(value).__module__}.{kind}, not a NumPy array: conveyor streams host "
            f"NumPy arrays; pass one (e.g. a PyOpenCL array's .get(), CuPy's .get()), "
            f"or a device array in args= where the kernel declares a pointer")


def device_memory(value: Any, what: str, fix: str) -> None:
    """InputError naming ``what`` when ``value`` is device memory (PyOpenCL's arrays, buffers
    and SVM, anything with ``__cuda_array_interface__``) where a host array goes, saying
    ``fix``: ``np.asarray`` walked a PyOpenCL array one element at a time (seconds for 10**5
    elements, before any check) and made Python objects of it."""
    kind = type(value)
    if not (kind.__module__.startswith("pyopencl")
            or hasattr(value, "__cuda_array_interface__")):
        return
    raise InputError(f"{what} is a {kind.__module__}.{kind.__name__}, device memory, not a "
                     f"host array: {fix}")


def as_input(value: Any, index: int) -> np.ndarray:
    """Input ``index`` as an ndarray (memmaps stay memmaps); InputError if unusable."""
    given = value
    if isinstance(value, bytes):  # np.asarray(b"...") is one 0-d string, not its bytes
        raise InputError(f"input {index} is bytes, which NumPy reads as one string, not an "
                         f"array: pass np.frombuffer(data, dtype) for its bytes as numbers "
                         f"(or a path as str for a file)")
    device_memory(value, f"input {index}", "conveyor streams host NumPy arrays; pass one (a "
                  "PyOpenCL array's .get(), CuPy's .get()), or a device array in args= where "
                  "the kernel declares a pointer")
    check_values(value, f"input {index}")
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except Exception as exc:
            raise InputError(
                f"input {index} ({type(value).__name__}) is not an array: pass a NumPy array"
            ) from exc
    if value.dtype.hasobject:
        foreign = _foreign(given, "input")
        if foreign is not None:  # np.asarray made Python objects of a device array, a handle
            raise InputError(f"input {index} {foreign}")
        raise InputError(
            f"input {index} has dtype {value.dtype}, which holds Python objects: "
            f"convert it to a numeric dtype first"
        )
    if value.ndim == 0:
        raise InputError(f"input {index} is a scalar: pass scalars in args=, arrays in inputs=")
    return plain(value)


def plain(array: np.ndarray) -> np.ndarray:
    """``array`` as a plain ndarray view of its memory, for a subclass (memmaps stay
    memmaps: they are told apart as files). The engine reads and writes rows through
    ``array[lo:hi]``: a subclass whose indexing copies (an overridden ``__getitem__``) had its
    copies written, and the caller's array left as it was, with no error."""
    if type(array) is np.ndarray or isinstance(array, np.memmap):
        return array
    return array.view(np.ndarray)


def check_values(value: Any, what: str) -> None:
    """InputError for ``value`` (an input, a ``cv.iterate`` chunk, a resident table) where
    ``np.asarray`` would give other values than the ones it holds: a masked array with masked
    elements (the values under the mask come too), PyArrow data with nulls (NumPy makes them
    NaN, or Python objects), a PyArrow table of columns of different types (NumPy promotes
    them to one: int64 to float64 loses every odd integer past 2**53). A dictionary-encoded
    PyArrow column is decoded, as ``np.asarray`` and ``to_numpy()`` do: its values, not its
    indices, are what the kernel gets."""
    _check_mask(value, what, "pass a.filled(value) (e.g. a.filled(0) for a sum) or a.data")
    _check_arrow(value, what)


def arrow_nulls(column: Any) -> int:
    """Nulls of a PyArrow Array or ChunkedArray, counting in a dictionary-encoded one the
    entries whose dictionary value is null: its ``null_count`` counts null indices only, and
    ``is_null()`` of a dictionary array does not see null values in every PyArrow release,
    so it is decoded (cast to its value type) to count them."""
    import pyarrow

    if pyarrow.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return int(getattr(column, "null_count", 0) or 0)


def _check_arrow(value: Any, what: str) -> None:
    """InputError for PyArrow data (an Array, ChunkedArray, Table or RecordBatch) with nulls,
    or for a table whose columns' types differ (see :func:`check_values`)."""
    if not type(value).__module__.startswith("pyarrow"):  # PyArrow is not imported here
        return
    import pyarrow

    if isinstance(value, pyarrow.Table | pyarrow.RecordBatch):
        columns, names = list(value.columns), list(value.schema.names)
    elif isinstance(value, pyarrow.Array | pyarrow.ChunkedArray):
        columns, names = [value], [None]
    else:
        return
    for name, column in zip(names, columns, strict=True):
        nulls = arrow_nulls(column)
        if nulls:
            where = f" in column {name!r}" if name is not None else ""
            raise InputError(
                f"{what} is PyArrow data with {nulls} nulls{where}, which NumPy would make NaN "
                f"(or Python objects): fill them first (pyarrow.compute.fill_null(column, "
                f"value)), or drop those rows (.drop_null())")
    if len(columns) > 1:
        types = [column.type for column in columns]
        values = [t.value_type if pyarrow.types.is_dictionary(t) else t for t in types]
        try:
            dtypes = [np.dtype(t.to_pandas_dtype()) for t in values]
        except (NotImplementedError, TypeError):
            return  # not numbers: np.asarray's own result is checked as any input is
        common = np.result_type(*dtypes)
        if not all(_exact_cast(d, common) for d in dtypes):
            listing = ", ".join(f"{n!r} {t}" for n, t in zip(names, types, strict=True))
            raise InputError(
                f"{what} is a PyArrow table whose columns have types ({listing}) that NumPy "
                f"would promote to {common}, changing values (int64 to float64 rounds past "
                f"2**53): cast them to one type first (table.cast(schema)), or stream the "
                f"columns as separate inputs (table.column(name))")


def _exact_cast(source: np.dtype, target: np.dtype) -> bool:
    """Whether every value of ``source`` survives a cast to ``target``: NumPy's "safe" casts
    but integers to a float whose mantissa is too short (int64 to float64)."""
    if target.kind == "f" and source.kind in "iu":
        return source.itemsize * 8 - (source.kind == "i") <= np.finfo(target).nmant + 1
    return bool(np.can_cast(source, target, "safe"))


def _check_mask(value: Any, what: str, fix: str) -> None:
    """InputError for a masked array with masked elements: conveyor streams the values under
    the mask as well (np.ma would leave them out of a sum), and an output's mask would hide
    what the stream wrote there."""
    # No masked array exists before numpy.ma is imported, and importing it for the check
    # was half of a first stream's set-up once conveyor was byte-compiled (bench/NOTES.md,
    # session 11): look only when it is there.
    ma = sys.modules.get("numpy.ma")
    if ma is None or not isinstance(value, ma.MaskedArray):
        return
    if ma.getmask(value) is not ma.nomask and bool(ma.getmask(value).any()):
        raise InputError(
            f"{what} is a masked array with {int(ma.count_masked(value))} masked elements: "
            f"conveyor streams every value, the masked ones too (np.ma leaves them out), and "
            f"does not touch a mask: {fix}, and mask the result yourself")


def as_output(value: Any, index: int, rows: int, row_shape: tuple[int, ...]) -> np.ndarray:
    """Output ``index``: the caller's array (checked) or a new one for a dtype."""
    if value is None:  # np.dtype(None) is float64: never what None meant
        raise InputError(f"output {index} is None: pass an array, a dtype or a file")
    foreign = _foreign(value, "output")
    if foreign is not None:  # np.dtype() would read its dtype: a new array, it never written
        raise InputError(f"output {index} {foreign}")
    # ctypes arrays and structures too: np.dtype() of one is its whole type ('<f4', (1000,)),
    # and a new array of 1000 such rows was made, the caller's buffer never written.
    if isinstance(value, bytearray | memoryview | pyarray.array | ctypes.Array
                  | ctypes.Structure | ctypes.Union):
        kind = "array.array" if isinstance(value, pyarray.array) else type(value).__name__
        raise InputError(
            f"output {index} is a {kind}, not a NumPy array: conveyor writes "
            f"NumPy arrays; pass np.asarray(buffer) (a writable view of its memory, of its "
            f"own item type) or np.frombuffer(buffer, dtype) for another dtype")
    if not isinstance(value, np.ndarray):
        try:
            dtype = np.dtype(value)
        except (TypeError, ValueError, SyntaxError) as exc:
            raise InputError(
                f"output {index} must be a NumPy array or a dtype, got {value!r} "
                f"({type(value).__name__}: {exc})") from None
        if dtype.hasobject:
            raise InputError(f"output {index} asks for dtype {dtype}: use a numeric dtype")
        from conveyor.memory import prefault

        try:
            return prefault.empty((rows, *row_shape), dtype)  # huge pages asked for
        except (ValueError, MemoryError) as exc:  # cv.iterate(length=2**62): NumPy's words
            nbytes = rows * math.prod(row_shape) * dtype.itemsize
            raise InputError(
                f"output {index} asks for a new {dtype} array of {rows} rows of {row_shape} "
                f"({nbytes} bytes), like input 0: more than this host can allocate ({exc}): "
                f"check input 0's length, or pass a file output (cv.npy_out(path))") from None
    _check_mask(value, f"output {index}", "pass a plain array (np.empty(shape, dtype))")
    if value.dtype.hasobject:
        raise InputError(f"output {index} has dtype {value.dtype}: use a numeric dtype")
    if value.ndim == 0:
        raise InputError(f"output {index} is a scalar: outputs must be arrays")
    if not value.flags.writeable:
        raise InputError(f"output {index} is read-only: pass a writable array")
    if not value.flags.c_contiguous:
        raise InputError(
            f"output {index} is not C-contiguous: pass np.empty(shape, dtype) and copy "
            f"into your view afterwards"
        )
    return plain(value)


def check_widths(sources: Sequence[Any], sinks: Sequence[Any]) -> None:
    """InputError for an input or output (with ``shape`` and ``dtype``) that has no bytes in
    a row (shape ``(n, 0)``, or a dtype of no size: ``np.void``, ``np.dtype([])``) beside
    arrays that have some: its ring and device buffers would be 0 bytes, which no driver
    allocates. A stream in which every array is so has nothing to move, and runs no block."""
    ends = [("input", i, e) for i, e in enumerate(sources)]
    ends += [("output", i, e) for i, e in enumerate(sinks)]
    widths = [(kind, i, e, math.prod(e.shape[1:]) * e.dtype.itemsize)
              for kind, i, e in ends if e.dtype is not None and len(e.shape) >= 1]
    if not sources or not sources[0].shape[0] or not any(w for *_, w in widths):
        return
    for kind, index, end, width in widths:
        if not width:
            why = (f"dtype {end.dtype} has no size" if not end.dtype.itemsize
                   else f"its rows {tuple(end.shape[1:])} hold no elements")
            what = f"{kind} {index}"
            what += f" ({end.name})" if end.name != what else ""
            raise InputError(
                f"{what} has shape {tuple(end.shape)} of {end.dtype}: "
                f"{why}, so a block of it has 0 bytes to copy: drop it from {kind}s=, or "
                f"give it at least one element of a numeric dtype per row")


def spec(array: Any) -> ArraySpec:
    """The ArraySpec of an array, or of anything with ``shape`` and ``dtype`` (a source or
    sink of pipeline/io.py)."""
    return ArraySpec(tuple(int(s) for s in array.shape), array.dtype,
                     getattr(array, "ratio", (1, 1)), getattr(array, "per_block", False),
                     getattr(array, "dtype_hint", ""))


def check_kernel(
    kernel: Kernel,
    device: Device,
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    args: Sequence[Any],
    reduce: str | Callable[[Any, Any], Any] | None,
) -> np.dtype | None:
    """Check ``kernel`` against the stream's arrays; return the reduce element dtype, if any."""
    if kernel.device is not device:
        raise InputError(
            f"kernel {kernel.name!r} was built for {named_beside(kernel.device, device)}, the "
            f"stream runs on {device.spec}: compile it with that device"
        )
    buffers = len(inputs) + len(outputs) + (1 if reduce is not None else 0)
    expected = buffers + len(args) + 2
    params = list(kernel.params)
    from conveyor.pipeline import image

    images = image.indices(inputs)
    if images:  # image2d_t, sampler_t (CUDA: cudaTextureObject_t): checked, samplers dropped
        params = image.kernel_params(kernel.name, params, images, expected, device.backend)
    else:
        image.refuse_plain_for_image(kernel.name, params, len(inputs))
    if len(params) != expected:
        what = "1 partial buffer, " if reduce is not None else f"{len(outputs)} outputs, "
        raise InputError(
            f"kernel {kernel.name!r} takes {len(params)} parameters; this stream passes "
            f"{expected}: {len(inputs)} inputs, {what}{len(args)} args, then offset and n"
        )
    arrays: list[tuple[str, np.dtype | None, Any]] = [
        (f"input {i}", a.dtype, a) for i, a in enumerate(inputs)
    ]
    arrays += [(f"output {i}" + (f" ({a.name})" if _file_out(a) else ""), a.dtype,
                a if _file_out(a) else None) for i, a in enumerate(outputs)]
    if reduce is not None:
        arrays.append(("the per-element reduce buffer", None, None))
    # Struct layouts are read from the code the compiler sees (preprocessed, no comments).
    code = (struct_source(kernel) if any(p.is_pointer and p.dtype is None for p in params)
            else None)
    for index, (param, (what, dtype, given)) in enumerate(zip(params, arrays, strict=False)):
        if index not in images:
            check_buffer(kernel.name, param, what, dtype, code, given)
        if index >= len(inputs) and (param.is_const or param.address == "constant"):
            # The kernel cannot write it: the stream would copy back what the device buffer
            # held (the chain refuses the same, chainbind).
            raise InputError(
                f"kernel {kernel.name!r} receives {what} through parameter {param.name!r} "
                f"({param.type_text}), which is const: the kernel cannot write it, and the "
                f"stream would return what the device buffer held. Drop const (and "
                f"__constant) from that parameter")
    check_args(params[buffers:], args, kernel)
    for param in params[buffers + len(args):]:
        if param.is_pointer:
            raise InputError(
                f"kernel parameter {param.name!r} is a pointer but receives offset/n: "
                f"the convention is buffers, then args, then ulong offset, ulong n"
            )
        check_count(param)
    if reduce is None:
        return None
    if not isinstance(reduce, str) or reduce not in BUILTIN_OPS:
        raise InputError(
            f"reduce={reduce!r} with a kernel: use 'sum', 'min' or 'max'; for another "
            f"combine, pass a Python callable that returns each block's partial"
        )
    element = params[len(inputs)].dtype
    if element is None:
        raise InputError(
            f"cannot tell the element type of kernel parameter {params[len(inputs)].name!r}: "
            f"declare it as a pointer to a numeric type"
        )
    return element


def check_byte_order(inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """InputError for an input or output (anything with ``dtype`` and ``name``) whose dtype is
    not in the machine's byte order: a Python callable gets device arrays, which have none."""
    for kind, arrays in (("input", inputs), ("output", outputs)):
        for index, array in enumerate(arrays):
            dtype = array.dtype
            if dtype is not None and (not dtype.isnative or _swapped_field(dtype)):
                raise InputError(
                    f"{kind} {index} ({array.name}) has dtype "
                    f"{dtype if dtype.names else dtype.str}, not in this machine's byte "
                    f"order, which a Python callable's device arrays need: "
                    f"{native_order_fix(array if kind == 'input' else None, dtype)}"
                )


def _converted(have: np.dtype | None, want: np.dtype, expr: str) -> str | None:
    """The NumPy call that makes the array ``expr`` (of ``have``) one of ``want``: records
    and text cannot be cast with ``.astype`` (NumPy raises), so a numeric field, or the
    bytes viewed; None where no call does (text, records of no numeric field)."""
    if have is not None and have.names:
        fields: Any = have.fields
        numeric = [name for name in have.names if fields[name][0].base.kind in "biuf"]
        return (f"np.ascontiguousarray({expr}[{numeric[0]!r}], dtype=np.{want})" if numeric
                else None)  # a text or nested field does not convert
    if have is not None and have.kind in "SV" and have.itemsize == want.itemsize:
        return f"{expr}.view(np.{want})"
    if have is not None and have.kind in "SUV":
        return None
    return f"{expr}.astype(np.{want})"


def _array_fix(have: np.dtype | None, want: np.dtype) -> str:
    """How to give an array of ``have`` the dtype ``want``, in a call that works (see
    :func:`_converted`)."""
    call = _converted(have, want, "a")
    if have is not None and have.names:
        example = f" (e.g. {call})" if call else ""
        return (f"pass one numeric field of the records as an array of {want}{example}, or "
                f"declare the parameter a pointer to a struct of the records' fields")
    if have is not None and have.kind in "SV" and call is not None:
        return f"pass its bytes as {want}: {call}"
    if call is None:
        return (f"pass an array of {want} (a dtype of {have} holds text or bytes, which "
                f"conveyor does not convert: make numbers of it first)")
    return f"pass an array of {want} (e.g. {call})"


def _file_in_fix(source: Any, want: np.dtype) -> str:
    """How to give input ``source`` the dtype ``want``: convert the array, or, for a file
    given by path (an array the caller never held), write a converted copy and pass that."""
    from conveyor.pipeline.io import FileSource

    if not isinstance(source, FileSource):
        return _array_fix(getattr(source, "dtype", None), want)
    path, copy, have = str(source.path), f"as_{want}.npy", source.dtype
    read = (f"np.load({path!r}, mmap_mode='r')" if source.is_npy
            else _fromfile(source, have))
    call = _converted(have, want, read)
    if call is None:
        return (f"{path} holds {have}, text or bytes that conveyor does not convert: make "
                f"numbers of it first, write them as {want} and pass that file")
    what = "one numeric field of it" if have.names else "a copy of it"
    also = (", or declare the parameter a pointer to a struct of the records' fields"
            if have.names else "")
    return (f"{path} holds {have}: write {what} as {want} and pass that: "
            f"np.save({copy!r}, {call}){also}")


def _fromfile(source: Any, dtype: np.dtype) -> str:
    """The NumPy call that reads raw file input ``source``'s values as ``dtype``."""
    from conveyor.pipeline.structs import spell

    offset = f", offset={source.offset}" if source.offset else ""
    shape = f".reshape({source.shape})" if len(source.shape) > 1 else ""
    spelled = spell(dtype) if dtype.names else repr(dtype.str)
    return f"np.fromfile({str(source.path)!r}, {spelled}{offset}){shape}"


def native_order_fix(source: Any, dtype: np.dtype) -> str:
    """What to do about ``dtype``, not in this machine's byte order, of input ``source`` (a
    Source, or None for an array): convert the array, or, for a file given by path (whose
    array the caller never held, so ``a.astype(...)`` said nothing to do), rewrite it."""
    from conveyor.pipeline.io import FileSource

    if _file_out(source):
        return _file_out_fix(source, dtype.newbyteorder("="))
    if not isinstance(source, FileSource):
        return "pass a.astype(a.dtype.newbyteorder('='))"
    path = str(source.path)
    native = dtype.newbyteorder("=")
    if source.is_npy:
        if dtype.names:
            return (f"rewrite the file in this machine's byte order: a = np.load({path!r}); "
                    f"np.save({path!r}, a.astype(a.dtype.newbyteorder('=')))")
        return (f"rewrite the file in this machine's byte order: np.save({path!r}, "
                f"np.load({path!r}).astype({native.str!r}))")
    return (f"write its values in this machine's byte order to a .npy file and pass that: "
            f"np.save('native.npy', {_fromfile(source, dtype)}.astype({native.str!r}))")


def check_args(params: Sequence[Param], args: Sequence[Any], kernel: Any = None) -> None:
    """``args`` suit the kernel parameters ``params`` that receive them (scalars a cast that
    means something; pointers are resident arrays, checked by pipeline/resident.py). A struct
    passed by value (``kernel``'s source defines it) takes a structured NumPy scalar laid out
    as C lays the struct out: a packed one (NumPy's default) or a plain number was passed as
    its bytes, and the kernel read its members at the wrong offsets."""
    from conveyor.pipeline.resident import Resident

    code: str | None = None
    for index, (param, value) in enumerate(zip(params, args, strict=False)):
        if (not param.is_pointer and param.dtype is None and param.width == 1
                and kernel is not None and not isinstance(value, Resident)):
            code = struct_source(kernel) if code is None else code
            _check_struct_arg(param, index, value, code)
        if param.is_pointer:
            continue  # an array uploaded once: pipeline/resident.py checks it
        if isinstance(value, Resident):
            raise InputError(
                f"args[{index}]: kernel parameter {param.name!r} is a scalar "
                f"({param.type_text}) but receives a resident array: declare it as a "
                f"pointer (__global const {param.type_text}*), or pass a scalar")
        _check_arg(param, index, value)


def check_bool_bytes(what: str, array: Any) -> None:
    """InputError for a bool array holding bytes other than 0 and 1 (``np.frombuffer(raw,
    bool)``, ``u8.view(bool)``): NumPy reads every nonzero byte as True, but a kernel's
    ``bool`` load is the compiler's (PoCL's reads the low bit: 2 was false, NVIDIA's reads
    nonzero). ``array`` is an ndarray, or a Source (an array input is checked here; another
    is checked block by block as it is read: :func:`guard_bools`)."""
    array = getattr(array, "array", array)
    if isinstance(array, np.ndarray) and array.size and bool(
            np.any(np.ascontiguousarray(array).view(np.uint8) > 1)):
        raise InputError(
            f"{what} is a bool array holding bytes other than 0 and 1, which NumPy reads as "
            f"True but a kernel's bool load may not: pass np.not_equal(a.view(np.uint8), 0) "
            f"(NumPy's own bools), or declare the parameter uchar* and test != 0")


def bool_inputs(params: Sequence[Param], sources: Sequence[Any]) -> list[int]:
    """The inputs a kernel of ``params`` (buffers first, inputs first among them) reads
    through a ``bool`` pointer."""
    return [i for i, (param, source) in enumerate(zip(params, sources, strict=False))
            if param.dtype == np.bool_ and np.dtype(source.dtype) == np.bool_]


def guard_bools(sources: list[Any], indices: Sequence[int]) -> None:
    """Check the bool inputs at ``indices`` (read through a ``bool`` pointer) for bytes other
    than 0 and 1 (:func:`check_bool_bytes`): an array now, any other source (a file, an
    iterable, a table file) block by block as it is read, replacing it in ``sources`` by a
    checking wrapper (``io.BoolChecked``): its rows go through the stream's thread."""
    from conveyor.pipeline.io import BoolChecked

    for i in indices:
        source = sources[i]
        if isinstance(getattr(source, "array", None), np.ndarray):
            check_bool_bytes(f"input {i}", source)
        elif not isinstance(source, BoolChecked):
            sources[i] = BoolChecked(source, f"input {i}")


def check_count(param: Param) -> None:
    """InputError unless ``param``, which receives offset or n (counts of elements), has an
    integer type: a float one rounds them past 2^24 (double: 2^53) and the kernel would
    index the wrong elements with no error. (A too narrow integer type is refused when a
    count does not fit it, at launch.)"""
    if param.dtype is not None and param.dtype.kind not in "iu":
        raise InputError(
            f"kernel parameter {param.name!r} ({param.type_name}) receives offset/n, counts "
            f"of elements: declare it ulong"
            + (f" (a {param.dtype} rounds counts past "
               f"{ {2: '2^11', 4: '2^24', 8: '2^53'}[param.dtype.itemsize]})"
               if param.dtype.kind == "f" and param.dtype.itemsize in (2, 4, 8) else ""))


def check_buffer(kernel: str, param: Param, what: str, dtype: np.dtype | None,
                 source: str | None = None, given: Any = None, temp: str = "") -> None:
    """``param`` receives ``what`` (an input or output of ``dtype``, or the reduce buffer).
    ``source``, the kernel's source, tells whether a structured dtype may be packed (see
    :func:`check_struct`); without it, a structured dtype's layout is not checked. ``given``
    is the input's Source, for what a message says to do (a file is rewritten, not
    converted with ``a.astype``); ``temp``, a chain's temp of that name (declared in
    ``temps=``)."""
    if dtype is not None and dtype.names:  # before any message prints the dtype
        check_nesting(f"kernel parameter {param.name!r} ({param.type_text}), which receives "
                      f"{what},", dtype)
    if not param.is_pointer:
        raise InputError(
            f"kernel parameter {param.name!r} ({param.type_text}) receives {what}, so it "
            f"must be a pointer; the convention is buffers, then args, then offset, n"
        )
    if param.address == "local":
        raise InputError(
            f"kernel parameter {param.name!r} ({param.type_text}) is __local memory but "
            f"receives {what}: declare it __global"
        )
    if param.width > 1:
        # The element's C name from its dtype: a typedef's name (typedef float4 V) has no
        # lane count to strip.
        element = _c_name(param.dtype) if param.dtype is not None else "the element type"
        raise InputError(
            f"kernel parameter {param.name!r} of kernel {kernel!r} is {param.describe()}, a "
            f"vector type, but conveyor counts offset and n in scalars (elements of input 0), "
            f"so the kernel would run {param.width}x past its buffer: declare it as "
            f"{element}* and load {param.width} lanes at a time inside the kernel "
            f"(vload{param.width}(i, p) / vstore{param.width} in OpenCL C, "
            f"reinterpret_cast<{param.base}*>(p) in CUDA C)"
        )
    if dtype is None:
        return
    if param.dtype is None:
        if dtype.kind == "V":  # a structured array for a struct pointer: its layout only
            check_struct(f"kernel parameter {param.name!r} ({param.type_text}), which "
                         f"receives {what},", dtype, source, param.struct_name,
                         native_order_fix(given, dtype), output=what.startswith("output"),
                         temp=temp)
            return
        # a plain array for a struct the source defines: the records' dtype to pass
        check_fields(f"kernel parameter {param.name!r} ({param.type_text}), which receives "
                     f"{what},", dtype, source, param.struct_name)
        if dtype.kind == "c":  # no C scalar is complex ("complex64*" was advised)
            part = f"f{dtype.itemsize // 2}"
            raise InputError(
                f"kernel parameter {param.name!r} is {param.describe()}, and {what} has dtype "
                f"{dtype}, which no C type is: for a struct of two {_c_name(np.dtype(part))} "
                f"members, pass the array viewed as records named as those members, e.g. "
                f"a.view(np.dtype([('re', '{part}'), ('im', '{part}')])); or declare it "
                f"{_c_name(np.dtype(part))}* and pass a.view(np.{np.dtype(part)}), the parts "
                f"interleaved (2 elements per value: offset and n count them)")
        if str(dtype) not in _C_NAMES:
            raise InputError(
                f"kernel parameter {param.name!r} is {param.describe()}, so conveyor cannot "
                f"check that {what} (dtype {dtype}) matches it, and {dtype} has no C type: "
                f"pass numbers of a plain type (e.g. a.view(np.int64) for datetimes) to a "
                f"pointer to that type")
        raise InputError(
            f"kernel parameter {param.name!r} is {param.describe()}, so conveyor cannot check "
            f"that {what} (dtype {dtype}) matches it: declare it as a pointer to a scalar "
            f"type such as {_c_name(dtype)}*"
        )
    if param.dtype != dtype and param.dtype == dtype.newbyteorder("="):
        raise InputError(
            f"kernel parameter {param.name!r} is {param.describe()} but {what} has dtype "
            f"{dtype.str}, not in this machine's byte order (kernels read native order): "
            f"{native_order_fix(given, dtype)}"
        )
    if dtype.kind == "c" and param.dtype == np.dtype(f"f{dtype.itemsize // 2}"):
        # a.astype(float) would drop the imaginary parts (NumPy only warns).
        raise InputError(
            f"kernel parameter {param.name!r} is {param.describe()} but {what} has dtype "
            f"{dtype}: kernels have no complex type; pass a.view(np.{param.dtype}), the real "
            f"and imaginary parts interleaved (2 elements per value: offset and n count them)")
    if param.dtype != dtype:
        # Suggest a C declaration only for a dtype that has one (not datetime64, structured).
        declare = (f" or declare the parameter {_c_name(dtype)}*"
                   if str(dtype) in _C_NAMES else "")
        fix = (_file_out_fix(given, param.dtype) if _file_out(given) else
               _file_in_fix(given, param.dtype))
        raise InputError(
            f"kernel parameter {param.name!r} is {param.describe()} but {what} has dtype "
            f"{dtype}: {fix}{declare}"
        )


def _file_out(sink: Any) -> bool:
    """True for an output file (cv.npy_out, cv.raw_out): no array the caller could convert."""
    from conveyor.pipeline.sinks import FileSink

    return isinstance(sink, FileSink)


def _file_out_fix(sink: Any, want: np.dtype) -> str:
    """How to give output file ``sink`` the dtype ``want`` (there is no array to convert)."""
    from conveyor.pipeline.sinks import dtype_code

    maker = "cv.npy_out" if sink.header else "cv.raw_out"
    return (f"pass dtype={dtype_code(want)} to {maker} (or no dtype: the kernel's output "
            f"type)")


def check_struct(where: str, dtype: np.dtype, source: str | None, type_name: str = "",
                 fix: str | None = None, output: bool = False, temp: str = "") -> None:
    """InputError when structured ``dtype`` (records for a pointer to struct ``type_name``,
    which ``where`` names) has a field not in this machine's byte order (a kernel reads its
    struct's members in native order: every value would come byte-swapped), or is not laid out
    as C lays out that struct in ``source`` (pipeline/structs.py: check_struct; not judged
    without the source). ``fix`` says what to do about the byte order (default: convert the
    array; see :func:`native_order_fix`)."""
    check_nesting(where, dtype)
    swapped = _swapped_field(dtype)
    if swapped is not None:
        field, ftype = swapped
        raise InputError(
            f"{where} has structured dtype {dtype}, whose field {field!r} is {ftype.str}, not "
            f"in this machine's byte order: the kernel reads its struct's members in native "
            f"order, so every value would come byte-swapped: "
            f"{fix or native_order_fix(None, dtype)} (same fields, same offsets)")
    if source is not None:
        _check_layout(where, dtype, source, type_name, output, temp)


def _swapped_field(dtype: np.dtype, prefix: str = "") -> tuple[str, np.dtype] | None:
    """(name, dtype) of the first field of structured ``dtype`` (nested records and
    sub-arrays walked: NumPy's ``isnative`` misses a ``>u2`` sub-array field) whose bytes are
    not in this machine's order; None when all are."""
    for name in dtype.names or ():
        ftype = dtype.fields[name][0]  # type: ignore[index]
        if ftype.subdtype is not None:
            ftype = ftype.subdtype[0]
        if ftype.names:
            found = _swapped_field(ftype, f"{prefix}{name}.")
            if found is not None:
                return found
        elif not ftype.isnative:
            return f"{prefix}{name}", ftype
    return None


def _check_struct_arg(param: Param, index: int, value: Any, code: str | None) -> None:
    """InputError when struct parameter ``param`` (by value) receives anything but a
    structured scalar of its C layout (not judged where the struct cannot be read)."""
    from conveyor.pipeline.structs import c_layout, packs

    if code is None or packs(code):
        return
    layout = c_layout(code, param.struct_name)
    if layout is None:
        return
    where = f"args[{index}]: kernel parameter {param.name!r} ({param.type_text})"
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.names:
        value = value[()]  # a 0-d record array: its record (argcast takes it so too)
    if not isinstance(value, np.void) or not value.dtype.names:
        from conveyor.pipeline.structs import c_dtype, spell

        wanted = c_dtype(code, param.struct_name)
        spelled = spell(wanted) if wanted is not None else "np.dtype([...], align=True)"
        raise InputError(
            f"{where} is a struct of {layout[1]} bytes passed by value, but receives "
            f"{type(value).__name__} {value!r}: pass a structured NumPy scalar laid out as C "
            f"lays the struct out, e.g. np.array((...), {spelled})[()]")
    check_struct(f"{where}, which receives a {value.dtype.itemsize}-byte record,", value.dtype,
                 code, param.struct_name, "pass np.array(value, dtype.newbyteorder('='))[()]")


def _check_arg(param: Param, index: int, value: Any) -> None:
    """``args[index]`` suits scalar parameter ``param`` (a cast that means something)."""
    if param.width > 1:
        raise InputError(
            f"args[{index}]: kernel parameter {param.name!r} is {param.describe()}, a vector "
            f"passed by value, which conveyor does not pass: declare {param.width} scalar "
            f"parameters instead"
        )
    try:
        caster(param)(value)
    except InputError as exc:
        raise InputError(f"args[{index}]: {exc}") from None


_C_NAMES = {
    "int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort", "int32": "int",
    "uint32": "uint", "int64": "long", "uint64": "ulong", "float16": "half",
    "float32": "float", "float64": "double", "bool": "bool",
}  # fmt: skip


def _c_name(dtype: np.dtype) -> str:
    """The OpenCL C name of a NumPy dtype (CUDA C: unsigned int for uint, and so on)."""
    return _C_NAMES.get(str(dtype), str(dtype))
