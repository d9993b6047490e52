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
import collections.abc
import gc
import types
from typing import Any

#: Dict views: iterated by the dict's own storage, whatever the dict's class.
_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()), type({}.items()))
#: The mapping behind a ``collections.abc`` view (a UserDict's or a ChainMap's ``values()``),
#: read through the slot's own descriptor, not an attribute lookup a subclass could take.
_MAPPING_OF: Any = collections.abc.MappingView.__dict__["_mapping"]
#: Every type whose instances (and subclasses') :func:`standard_items` reads.
CONTAINERS: tuple[type, ...] = (
    tuple, list, set, frozenset, dict, collections.deque, collections.UserList,
    collections.UserDict, collections.ChainMap, types.MappingProxyType,
    collections.abc.MappingView, *_VIEWS)
#: These types (and their subclasses) keep their items where C reads many containers' at
#: once: ``gc.get_referents`` for the sequences and sets, ``dict.keys``/``dict.values`` for
#: dicts (an instance's ``__dict__`` keeps its values where get_referents does not see them
#: on Python 3.13).
PLAIN: tuple[type, ...] = (tuple, list, set, frozenset, dict)


def standard_items(value: Any) -> tuple[str, list[Any]] | None:
    """``("seq", items)``, ``("set", items)`` or ``("map", [(key, value), ...])`` for one of
    Python's own containers (or a subclass of one), read through the base type; None for
    anything else, or where even that read raises (a container being changed meanwhile).
    Wrappers (a UserDict's ``data``, a ChainMap's ``maps``, the mapping a mappingproxy or a
    view wraps) are unwrapped to any depth, each object once (a ChainMap holding itself k
    times was read k**9 times; ten nested proxies were taken for no container at all)."""
    try:
        return _read(value)
    except Exception:
        return None


def _is(value: Any, kinds: Any) -> bool:
    """``isinstance`` by the object's own type: ``isinstance`` also asks the object for its
    ``__class__``, which runs a user's ``__getattribute__`` (a lazy proxy's)."""
    return issubclass(type(value), kinds)


def _read(value: Any) -> tuple[str, list[Any]] | None:
    if _is(value, _VIEWS):  # no subclass can be made of a view
        view: Any = value
        return "set", list(view)
    if collections.abc.MappingView in type(value).__mro__:  # not dict's: registered only
        pairs = _pairs(_MAPPING_OF.__get__(value))
        if pairs is None:
            return None
        if _is(value, collections.abc.KeysView):
            return "set", [key for key, _ in pairs]
        if _is(value, collections.abc.ValuesView):
            return "seq", [inner for _, inner in pairs]
        return "set", pairs
    if _is(value, collections.UserList):
        value = _unwrapped(value)
    if _is(value, list):
        return "seq", list(list.__iter__(value))
    if _is(value, tuple):
        return "seq", list(tuple.__iter__(value))
    if _is(value, set):
        return "set", list(set.__iter__(value))
    if _is(value, frozenset):
        return "set", list(frozenset.__iter__(value))
    if _is(value, collections.deque):
        return "seq", list(collections.deque.__iter__(value))
    pairs = _pairs(value)
    return None if pairs is None else ("map", pairs)


def _unwrapped(value: Any) -> Any:
    """What a UserList holds, through UserLists holding UserLists (each once)."""
    seen: set[int] = set()
    while _is(value, collections.UserList) and id(value) not in seen:
        seen.add(id(value))  # every object here is held by ``value``'s chain: ids stay
        value = vars(value).get("data")  # the instance's own, not a subclass's property
    return value


def _pairs(mapping: Any) -> list[Any] | None:
    """(key, value) pairs of a dict, a UserDict, a ChainMap or a mappingproxy, through any
    depth of them (a stack, each once); None where ``mapping`` is none of them. A mapping of
    another kind inside one (a user's own) is not read."""
    if not _is(mapping, dict | collections.UserDict | collections.ChainMap
                      | types.MappingProxyType):
        return None
    pairs: list[Any] = []
    stack: list[Any] = [mapping]
    seen: set[int] = set()
    while stack:
        inner = stack.pop()
        if id(inner) in seen:  # all held by ``mapping``: an id is not reused meanwhile
            continue
        seen.add(id(inner))
        if _is(inner, dict):
            pairs += dict.items(inner)
        elif _is(inner, collections.UserDict):
            stack.append(vars(inner).get("data"))
        elif _is(inner, collections.ChainMap):
            maps = vars(inner).get("maps")
            if _is(maps, list):
                stack.extend(reversed(list(list.__iter__(maps))))
        elif _is(inner, types.MappingProxyType):
            wrapped = gc.get_referents(inner)  # the mapping it wraps, never its own items()
            if len(wrapped) == 1:
                stack.append(wrapped[0])
    return pairs


def slot_members(kind: type) -> list[Any]:
    """The ``__slots__`` member descriptors of class ``kind`` and its bases (the standard
    library's and the user's; not the built-in types' own), read from the classes' own
    dicts: ``__slots__`` itself may have been an iterator used up when the class was made,
    rebound since, or name a private ``__x`` stored as ``_Class__x``."""
    found = []
    for base in type.__dict__["__mro__"].__get__(kind):  # type's own: no metaclass's
        if type.__dict__["__module__"].__get__(base) == "builtins":
            continue
        own = type.__dict__["__dict__"].__get__(base)
        found += [member for member in own.values()
                  if isinstance(member, types.MemberDescriptorType)]
    return found
