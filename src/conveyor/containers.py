"""The items of Python's own containers, read without running a user's code.

conveyor looks inside what a user passes beside a stream (a callable's ``args=``, for a
writable table the callable would get as a handle; what a Dask callable holds, for a device
that cannot travel). A user's subclass may override ``__iter__`` or ``items()`` (to hide
items, to raise, or never to end), and reading through them ran that code before every
stream. :func:`standard_items` reads the built-in and standard-library containers, their
subclasses included, through the base type's own storage: a list subclass through
``list.__iter__``, a ``UserDict`` through its ``data``, a ``ChainMap`` through its ``maps``,
a ``mappingproxy`` through the mapping it wraps. Anything else is not a container here.
"""

from __future__ import annotations

import collections
import gc
import types
from typing import Any

#: Dict views: iterated by the dict's own storage, whatever the dict's class.
_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()), type({}.items()))
#: Every type whose instances (and subclasses') :func:`standard_items` reads.
CONTAINERS: tuple[type, ...] = (
    tuple, list, set, frozenset, dict, collections.deque, collections.UserList,
    collections.UserDict, collections.ChainMap, types.MappingProxyType, *_VIEWS)


def standard_items(value: Any, depth: int = 0) -> tuple[str, list[Any]] | None:
    """``("seq", items)``, ``("set", items)`` or ``("map", [(key, value), ...])`` for one of
    Python's own containers (or a subclass of one), read through the base type; None for
    anything else, or where even that read raises (a container being changed meanwhile)."""
    try:
        return _read(value, depth)
    except Exception:
        return None


def _read(value: Any, depth: int) -> tuple[str, list[Any]] | None:
    if depth > 8:  # proxies of proxies, ChainMaps of ChainMaps: enough
        return None
    if isinstance(value, dict):
        return "map", list(dict.items(value))
    if isinstance(value, list):
        return "seq", list(list.__iter__(value))
    if isinstance(value, tuple):
        return "seq", list(tuple.__iter__(value))
    if isinstance(value, set):
        return "set", list(set.__iter__(value))
    if isinstance(value, frozenset):
        return "set", list(frozenset.__iter__(value))
    if isinstance(value, collections.deque):
        return "seq", list(collections.deque.__iter__(value))
    if isinstance(value, _VIEWS):  # no subclass can be made of a view
        view: Any = value
        return "set", list(view)
    if isinstance(value, collections.UserList | collections.UserDict):
        data = vars(value).get("data")  # the instance's own, not a property of a subclass
        return _read(data, depth + 1) if data is not None else None
    if isinstance(value, collections.ChainMap):
        maps = vars(value).get("maps") or []
        pairs: list[Any] = []
        for inner in list.__iter__(maps) if isinstance(maps, list) else ():
            found = _read(inner, depth + 1)
            if found is not None and found[0] == "map":
                pairs += found[1]
        return "map", pairs
    if isinstance(value, types.MappingProxyType):
        wrapped = gc.get_referents(value)  # the mapping it wraps, never its own items()
        return _read(wrapped[0], depth + 1) if len(wrapped) == 1 else None
    return None
