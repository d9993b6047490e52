"""A loaded kernel's parameter types, from what its driver reports.

The source text alone is not to be trusted for types: a macro, a typedef or a ``-D`` option
can make ``T`` anything. OpenCL reports each argument's address space, type name and
qualifiers when the program is built with ``-cl-kernel-arg-info`` (the OpenCL backend always
builds so); :func:`from_driver` makes the parameters from that report and uses the
preprocessed source only to resolve typedef names. CUDA reports each argument's size only;
:func:`check_sizes` compares them with the preprocessed source's types. Where a driver reports
nothing, the preprocessed source is used and a warning says so, once per process.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

from conveyor.errors import InputError
from conveyor.kernels.signature import Param, resolve


@dataclass(frozen=True)
class DriverArg:
    """One argument as an OpenCL driver reports it (``clGetKernelArgInfo``).

    ``address``: "global", "local", "constant" or "private"; ``type_name`` as the driver spells
    it (``float*``, ``real*``, ``uint``); ``is_const`` from its type qualifier.
    """

    name: str
    address: str
    type_name: str
    is_const: bool


def from_driver(kernel: str, source_params: Sequence[Param],
                reported: Sequence[DriverArg] | None, device: str) -> tuple[Param, ...]:
    """The parameters of ``kernel`` with the driver's types where it ``reported`` them.

    A builtin type name the driver reports (a macro already expanded) wins over the source; a
    typedef name is resolved through the matching source parameter. With no report, the
    source's parameters are returned and a warning says so (once per device).
    """
    if reported is None:
        warn_once(
            f"the OpenCL driver of {device} reports no kernel argument types (even built with "
            f"-cl-kernel-arg-info): conveyor reads kernel parameter types from the "
            f"preprocessed source there, which a typedef or macro it cannot see may mislead"
        )
        return tuple(source_params)
    matched = len(source_params) == len(reported)
    params: list[Param] = []
    for index, arg in enumerate(reported):
        spelled = " ".join(arg.type_name.replace("*", " * ").split())
        is_pointer = "*" in spelled or arg.address in ("global", "local", "constant")
        base = " ".join(w for w in spelled.split() if w not in ("*", "const", "volatile"))
        dtype, width = resolve(base)
        source = source_params[index] if matched else None
        if source is not None and source.base == base and (dtype is None or source.spelled):
            # A typedef the source resolves, also of a name that is built in elsewhere
            # (``typedef short int32_t;``: the driver says int32_t, the compiler reads short).
            dtype, width = source.dtype, source.width
        elif (source is not None and dtype is None and source.dtype is not None
              and source.is_pointer == is_pointer):
            # A typedef that adds a qualifier to another (``typedef const real creal``): the
            # driver names the inner one, which the source resolves through its chain (left
            # unresolved, 2.5 reached a float parameter as 0.0 and a float64 table was read
            # as ints).
            dtype, width = source.dtype, source.width
        name = arg.name or (source.name if source is not None else "") or f"arg{index}"
        # "wide" of "typedef long long wide" is long long too (the source says what it is).
        if _WIDE.search(base) or (source is not None and source.base == base
                                  and _WIDE.search(source.spelled)):
            raise InputError(
                f"kernel {kernel!r} parameter {name!r} is {arg.type_name}: OpenCL C's long long "
                f"is 128 bits wide and no NumPy type matches it, so conveyor cannot pass or "
                f"check it: declare it long or ulong (64 bits)"
            )
        qualifier = f"__{arg.address} " if arg.address != "private" else ""
        const = "const " if arg.is_const else ""
        text = f"{qualifier}{const}{base}{'*' if is_pointer else ''} {name}"
        params.append(Param(name=name, is_pointer=is_pointer, dtype=dtype,
                            is_const=arg.is_const, type_text=text, width=width, base=base,
                            address=arg.address, origin="driver"))
    return tuple(params)


# OpenCL C reserves ``long long`` and clang-based compilers (PoCL, most GPU drivers) make it
# 128 bits; a driver may spell the unsigned one ``ulong long``.
_WIDE = re.compile(r"long long\b")

POINTER_BYTES = 8


def check_sizes(kernel: str, params: Sequence[Param], sizes: Sequence[int] | None,
                device: str) -> tuple[Param, ...]:
    """``params`` (read from the preprocessed source) checked against the argument sizes of
    the loaded CUDA kernel; InputError naming the parameter, both sizes and the fix on a
    mismatch. With no sizes (a driver older than CUDA 12.4), a warning once per device."""
    if sizes is None:
        warn_once(
            f"the CUDA driver of {device} reports no kernel argument sizes (CUDA 12.4 or "
            f"newer does): conveyor reads kernel parameter types from the preprocessed "
            f"source unchecked there"
        )
        return tuple(params)
    if len(sizes) != len(params):
        raise InputError(
            f"kernel {kernel!r} has {len(sizes)} parameters but conveyor read "
            f"{len(params)} from its preprocessed source: write its parameter list without "
            f"macros that expand to several parameters"
        )
    for param, size in zip(params, sizes, strict=True):
        expected = expected_size(param)
        if expected is not None and expected != size:
            raise InputError(
                f"kernel {kernel!r} parameter {param.name!r}: conveyor read its type as "
                f"{param.describe()}, {expected} bytes, from the preprocessed source, but the "
                f"compiled kernel's argument is {size} bytes: spell the type without macros "
                f"or typedefs conveyor cannot see, or pass the -D defines in options="
            )
    return tuple(replace(p, origin="source+sizes") for p in params)


def expected_size(param: Param) -> int | None:
    """The bytes a CUDA kernel argument of ``param``'s type takes; None if not known."""
    if param.is_pointer:
        return POINTER_BYTES
    if param.dtype is None:
        return None
    return param.dtype.itemsize * param.width


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(message: str) -> None:
    """Warn ``message`` (a RuntimeWarning) the first time it comes up in this process."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
