"""What a callable or an ``args=`` value sent to Dask workers holds of this process.

A device, a kernel, a ``cv.resident`` table or a device array cannot travel to a worker:
Dask failed to pickle the graph with "Could not serialize object of type _HLGExprSequence",
naming none of them. :func:`refuse_held` and :func:`refuse_value` look for them on the
client and raise an InputError naming what holds one and what to pass instead.

The look is bounded and never runs user code beyond attribute reads: a closure's filled
cells, the ``__main__`` globals the code loads (sent by value), default arguments, a
``functools.partial``'s arguments, a bound method's or a callable object's attributes
(``__dict__`` and ``__slots__``), a ``functools.wraps`` wrapper's wrapped function; and in
each value, up to :data:`MOST_DEPTH` levels of tuples, lists, sets, dicts and plain objects'
attributes, :data:`MOST_ITEMS` items of each and :data:`MOST_VALUES` in all (a vocabulary of
10**6 words in ``args=`` was walked item by item: 3.2 s on the client). A value whose
attribute read raises is taken as holding nothing (an ``AttrDict`` whose ``__getattr__``
raises KeyError stopped the call).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor.containers import slot_members, standard_items
from conveyor.errors import InputError

#: Levels of containers looked into below a value.
MOST_DEPTH = 3
#: Items of one container looked at.
MOST_ITEMS = 1000
#: Values looked at below one value in all (three levels of a thousand each would be 10**9).
MOST_VALUES = 10_000


def device_array(value: Any) -> bool:
    """True for an array in a device's memory (PyOpenCL, CuPy, a CUDA tensor, Numba); False
    for a class (``cupy.ndarray`` itself, as a default: the property is on the class) and for
    anything whose attribute read raises."""
    if isinstance(value, type):
        return False
    try:
        if type(value).__module__.startswith("pyopencl") and hasattr(value, "base_data"):
            return True
        return hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray)
    except Exception:  # a __getattr__ that raises KeyError, say: no device array
        return False


def is_resident(value: Any) -> bool:
    """Whether ``value`` is a ``cv.resident`` handle (told by its class, not imported: the
    client loads no engine; a user's own class named Resident is not one)."""
    kind = type(value)
    return kind.__name__ == "Resident" and kind.__module__ == "conveyor.pipeline.resident"


def refuse_held(compute: Callable[..., Any]) -> None:
    """InputError when callable ``compute`` holds a device, a kernel, a resident table or a
    device array of this process (see the module)."""
    label = _name(compute)
    for name, value in _held_by(compute, 0, set()):
        refuse_value(value, f"the callable {label!r} uses {name!r}, ")


def _name(compute: Any) -> str:
    """A callable's name for messages: a function's own, a callable object's ``__name__``
    where it keeps one as a string (read statically: its ``__getattr__`` may raise
    anything, an AttrDict's KeyError), else its type's name."""
    if isinstance(compute, types.FunctionType | types.BuiltinFunctionType | types.MethodType):
        try:  # the type's descriptor (static reads give it, not the name); a method's reads
            name: Any = compute.__name__  # its __func__'s, whose __getattr__ may raise
        except Exception:
            name = None
    else:
        try:
            name = inspect.getattr_static(compute, "__name__", None)
        except Exception:
            name = None
    return name if isinstance(name, str) else type(compute).__name__


def refuse_value(value: Any, where: str) -> None:
    """InputError where ``value``, or what it holds (see the module), is a device, a kernel,
    a resident table or a device array; ``where`` begins the message ("args[0] is ")."""
    from conveyor.backends.base import Device, Kernel
    from conveyor.kernels.build import KernelFuture

    remedies: list[tuple[Callable[[Any], bool], str, str]] = [
        (lambda v: isinstance(v, Device), "a device of this process",
         "each worker opens its own: pass device='SPEC' to conveyor.dask and use the "
         "queue= the callable is given"),
        (lambda v: isinstance(v, Kernel | KernelFuture), "a kernel built in this process",
         "pass the kernel as compute (or conveyor.dask.kernel(source, name)), which each "
         "worker builds"),
        (is_resident, "a cv.resident table of this process",
         "pass its array in args=, which each worker uploads"),
        (device_array, "a device array of this process",
         "pass a NumPy array (a.get()) in args="),
    ]
    # seen holds what it has looked into, not ids alone (a dict view's item tuples are made
    # as it is read: a freed one's id came back for the next view's, in resident.py's walk).
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen: dict[int, Any] = {}
    looked = 0
    while stack and looked < MOST_VALUES:
        item, depth = stack.pop()
        looked += 1
        for test, what, fix in remedies:
            if test(item):
                raise InputError(f"{where}{what}, which cannot travel to Dask workers: {fix}")
        if depth < MOST_DEPTH and id(item) not in seen:
            seen[id(item)] = item
            stack.extend((inner, depth + 1) for inner in _inside(item))


def _inside(value: Any) -> list[Any]:
    """Up to MOST_ITEMS of what container ``value`` holds (a mapping's keys and values, a
    plain object's attributes); none for text, arrays, classes, modules and functions."""
    if isinstance(value, str | bytes | bytearray | memoryview | range | np.ndarray | type
                  | types.ModuleType | types.FunctionType | types.BuiltinFunctionType):
        return []
    found = standard_items(value)  # Python's own containers, read without the user's code
    if found is not None:
        kind, items = found
        items = items[:MOST_ITEMS]
        return [part for pair in items for part in pair] if kind == "map" else items
    # Anything else by its attributes only (a user's Sequence or Mapping keeping self.device:
    # iterating it is the user's code, and a one-shot collection was emptied by the look).
    try:
        return [v for _, v in itertools.islice(_attributes(value, ""), MOST_ITEMS)]
    except Exception:  # attributes that cannot be read without raising: nothing held
        return []


def _held_by(compute: Any, depth: int, seen: set[int]) -> list[tuple[str, Any]]:
    """(name, value) of what ``compute`` holds and sends along with it."""
    if depth > MOST_DEPTH or id(compute) in seen:
        return []
    seen.add(id(compute))
    if isinstance(compute, functools.partial):
        held = [(f"partial args[{i}]", v) for i, v in enumerate(compute.args)]
        held += [(f"partial {k}=", v) for k, v in compute.keywords.items()]
        return held + _held_by(compute.func, depth + 1, seen)
    if inspect.ismethod(compute):
        return _attributes(compute.__self__, "self") + _held_by(compute.__func__, depth + 1,
                                                                seen)
    if not inspect.isfunction(compute):  # a callable object: its attributes and __call__
        call = inspect.getattr_static(type(compute), "__call__", None)
        return _attributes(compute, "self") + (
            _held_by(call, depth + 1, seen) if inspect.isfunction(call) else [])
    code = compute.__code__
    held = []
    for name, cell in zip(code.co_freevars, compute.__closure__ or (), strict=False):
        try:
            held.append((name, cell.cell_contents))
        except ValueError:  # a cell never filled (a variable set on another branch)
            continue
    if getattr(compute, "__module__", None) == "__main__":
        # Globals it loads, not every name its code holds (queue.device is no global).
        names = compute.__globals__
        held += [(k, names[k]) for k in sorted(_globals_loaded(code)) if k in names]
    held += [(f"default {i}", v) for i, v in enumerate(compute.__defaults__ or ())]
    held += [(f"default {k}=", v) for k, v in (compute.__kwdefaults__ or {}).items()]
    wrapped = getattr(compute, "__wrapped__", None)  # functools.wraps: the function inside
    return held + (_held_by(wrapped, depth + 1, seen) if wrapped is not None else [])


def _attributes(instance: Any, label: str) -> list[tuple[str, Any]]:
    """An object's own attributes (``__dict__`` and ``__slots__``), as ``label.name``; none
    where reading them raises."""
    found: list[tuple[str, Any]] = []
    try:
        found += [(f"{label}.{k}", v) for k, v in vars(instance).items()]
    except Exception:  # no __dict__, or one whose read raises
        pass
    for member in slot_members(type(instance)):  # a private __x is stored as _Class__x
        try:
            found.append((f"{label}.{member.__name__}", member.__get__(instance)))
        except Exception:  # unset
            continue
    return found


def _globals_loaded(code: Any) -> set[str]:
    """The global names ``code`` (and the functions defined in it) loads."""
    import dis

    names: set[str] = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            names.add(str(instruction.argval))
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            names |= _globals_loaded(const)
    return names
