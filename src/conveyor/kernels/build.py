"""Build and load kernels ahead of time, through an in-process memo and the disk cache.

A kernel must be built and loaded before the first block is sent: compiling while the device
is busy stalls until it is idle. ``compile_kernel`` is what ``Device.compile`` calls;
``compile_async`` runs the same work on a compiler thread so several kernels build at once.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor import config, hazards
from conveyor.errors import CompileError, InputError
from conveyor.kernels import identity, sizecheck
from conveyor.kernels.buildlock import build_lock
from conveyor.kernels.cache import KernelCache, cache_key
from conveyor.kernels.includes import header_state
from conveyor.kernels.preprocess import expand_checked
from conveyor.kernels.signature import Param, params_from_json, params_to_json, parse_params

if TYPE_CHECKING:
    from conveyor.backends.base import Device, Kernel

_MemoKey = tuple[int, str, str]

_lock = threading.Lock()
# Each device's loaded kernels, (cache key, kernel name) -> kernel, kept on the device itself:
# a kernel holds its device, so a process-wide dict of them kept every device that ever built
# one alive (a closed second context and its pools, for good). On the device, the cycle goes
# with the device once nothing else holds it. The set names the devices for clear_memo().
_MEMO_ATTRIBUTE = "_conveyor_kernel_memo"
_memo_owners: weakref.WeakSet[Device] = weakref.WeakSet()
# Builds under way: a second caller of the same kernel waits for the first instead of building.
_in_flight: dict[_MemoKey, Future[Kernel]] = {}
_caches: dict[Path, KernelCache] = {}
_executor: ThreadPoolExecutor | None = None
_warned_no_home = False


def default_cache() -> KernelCache | None:
    """The cache for the configured directory, or None when ``CONVEYOR_NO_CACHE`` is set.

    The environment is read here, at each call, so a changed ``CONVEYOR_CACHE_DIR`` takes
    effect; one KernelCache (and its counters) is kept per directory.
    """
    if config.cache_disabled():
        return None
    try:
        path = config.cache_dir()
    except config.NoHomeError as exc:  # the cache is optional: build uncached, say so once
        global _warned_no_home
        if not _warned_no_home:
            _warned_no_home = True
            warnings.warn(f"conveyor: kernels are built uncached: {exc}", RuntimeWarning,
                          stacklevel=3)
        return None
    with _lock:
        cache = _caches.pop(path, None)
        if cache is not None and cache.removed():  # removed by hand: made again, not off
            cache.close()
            cache = None
        cache = cache or KernelCache(path)
        _caches[path] = cache  # the most recently used last
        # Each cache holds its folder open: a process that gives every job its own folder,
        # removed after the job, held one descriptor per job. A cache whose folder is gone
        # serves nothing again: it is closed. (One whose folder exists stays: another thread
        # may be reading it through that descriptor now.)
        for other, held in list(_caches.items()):
            if other != path and held.removed():
                _caches.pop(other).close()
        return cache


def build_identity(device: Device) -> str:
    """What the cache key takes as the compiler: the device's ``compiler_identity()`` and, on
    OpenCL, the options PyOpenCL adds from ``PYOPENCL_BUILD_OPTIONS`` to every build and the
    drivers' own variables that change builds (``POCL_EXTRA_BUILD_FLAGS``...), so a binary
    built under one is never loaded by a run without it, nor the reverse."""
    compiler = f"{device.compiler_identity()}|checks={identity.checks_identity()}"
    if device.backend != "opencl":
        return compiler
    forced = config.pyopencl_build_options()
    if forced:
        compiler += f"|{config.PYOPENCL_BUILD_OPTIONS_VAR}={forced}"
    for name, value in config.driver_build_variables():
        compiler += f"|{name}={value!r}"
    return compiler


def device_key(device: Device, options: Sequence[str], source: str) -> str:
    """The cache key of ``source`` built with ``options`` on ``device``: its
    :func:`build_identity`, and the headers found through ``-I`` folders of ``options`` or of
    ``PYOPENCL_BUILD_OPTIONS`` (PyOpenCL splits that variable at spaces and adds its words
    after a build's own options)."""
    forced = config.pyopencl_build_options().split() if device.backend == "opencl" else []
    return cache_key(build_identity(device), options, source, forced)


#: The header state of a kernel whose headers changed while it was built: the binary may
#: hold either version, so it is neither stored nor memoized, and never equals a state now
#: (a stream over several devices refuses it: pipeline/multi.py).
CHANGED_WHILE_BUILT = (("", "changed while the kernel was built", "-"),)


def kernel_headers(device: Device, options: Sequence[str], source: str
                   ) -> tuple[tuple[str, str, str], ...]:
    """The headers a build of ``source`` on ``device`` reads now (``includes.header_state``),
    found through ``options`` and, on OpenCL, ``PYOPENCL_BUILD_OPTIONS``, whose words lead
    the state: the same source under other forced options is other code."""
    forced = config.pyopencl_build_options().split() if device.backend == "opencl" else []
    state = header_state(source, [*options, *forced])
    # The drivers' own build variables (POCL_EXTRA_BUILD_FLAGS...) need no entry: a change
    # of one after the process's first build is refused (config.driver_build_variables),
    # so every build of a process reads the same ones.
    if forced:
        return ((config.PYOPENCL_BUILD_OPTIONS_VAR, "", " ".join(forced)), *state)
    return state


def source_params(
    device: Device, source: str, name: str, options: Sequence[str]
) -> tuple[Param, ...]:
    """The parameters of kernel ``name`` read from ``source`` after preprocessing it as
    ``device``'s compiler would (its predefined macros, the ``-D``/``-I`` of ``options``).
    The loaded kernel's driver corrects or checks them (``kernels/argtypes.py``). InputError
    when ``source`` defines no kernel ``name``."""
    return _read_params(device, source, name, options, device_key(device, options,
                                                                source))[0]


def expanded_source(device: Device, source: str, options: Sequence[str]) -> str:
    """``source`` preprocessed as ``device``'s compiler would (memoized; the raw text where
    the preprocessor failed on it)."""
    macros = tuple(sorted(device.source_macros().items()))
    key = device_key(device, options, source)
    return expand_checked(source, tuple(options), macros, key)[0]


def _read_params(
    device: Device, source: str, name: str, options: Sequence[str], key: str
) -> tuple[tuple[Param, ...], bool]:
    """:func:`source_params`, and whether they were read from the expanded text (False: from
    the raw text, which must not be kept in the cache as if it had been expanded). ``key``
    (the cache key: it covers included headers' contents) keys the memoized expansion."""
    macros = tuple(sorted(device.source_macros().items()))
    text, expanded = expand_checked(source, tuple(options), macros, key)
    try:
        return parse_params(text, name), expanded
    except InputError:
        # Not found after expansion (an #if conveyor's preprocessor decided otherwise than
        # the compiler will): the raw text; if not there either, the error names the
        # kernels of the expanded text, as the compiler names them (``KNAME`` is mykernel).
        try:
            return parse_params(source, name), False
        except InputError:
            if not expanded:
                raise
            return parse_params(text, name), expanded


class _Params:
    """A kernel's parameters for a build, and the ``.sig`` entry to store beside its binary
    once the binary is in the cache (None: it is there already, or must not be kept)."""

    def __init__(self, device: Device, source: str, name: str, options: Sequence[str],
                 key: str, disk: KernelCache | None) -> None:
        self.name = name
        self.signature: bytes | None = None
        self.entry = f"{name}|{identity.reader_identity()}"  # a new parser or pcpp: a new .sig
        if disk is not None:
            stored = disk.load_signature(key, self.entry)
            params = None if stored is None else params_from_json(stored)
            if params is not None:  # a warm build: no preprocessing (bench/NOTES.md)
                self.params = params
                return
        self.params, expanded = _read_params(device, source, name, options, key)
        if disk is not None and expanded:
            self.signature = params_to_json(self.params)

    def store(self, key: str, disk: KernelCache | None) -> None:
        """Store the signature (call once the binary is stored: no ``.sig`` without it)."""
        if disk is not None and self.signature is not None:
            disk.store_signature(key, self.entry, self.signature)
            self.signature = None


def check_text(source: str, options: Sequence[str], name: str = "") -> None:
    """InputError for text no compiler can take, found before the cache key is made:

    - a NUL character in ``source`` or an option: compilers take C strings, so everything
      after it would be dropped unseen (``["-DA\\0", "-DN=2"]`` built without ``N``), while
      the cache key and conveyor's parser still read it;
    - a character with no UTF-8 form (a lone surrogate, as text read with
      ``errors="surrogateescape"`` holds for a byte that is not UTF-8) in ``source``, an
      option or the kernel's ``name``.
    """
    for index, option in enumerate(options):
        if "\0" in option:
            raise InputError(f"options[{index}]={option!r} holds a NUL character, which ends "
                             f"the compiler's options there: remove it")
        _utf8(option, f"options[{index}]={option!r}")
    _utf8(name, f"the kernel name {name!r}")
    if "\0" in source:
        line = source.count("\n", 0, source.index("\0")) + 1
        raise InputError(f"the kernel source holds a NUL character (line {line}), where the "
                         f"compiler would stop reading it: remove it")
    _utf8(source, "the kernel source")


def _utf8(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        where = f" (line {line})" if "\n" in text else ""
        raise InputError(f"{what}{where} holds {text[exc.start]!r}, a character with no UTF-8 "
                         f"form (a byte that was not UTF-8, read with "
                         f"errors='surrogateescape'): read the file as UTF-8 or Latin-1, or "
                         f"remove it") from None


def clear_memo() -> None:
    """Forget the kernels loaded in this process (the next compile goes to the disk cache)."""
    with _lock:
        for device in list(_memo_owners):
            _memo_of(device).clear()


def memo_count() -> int:
    """How many kernels the in-process memo holds, over every device (Dask tests ask
    workers this)."""
    with _lock:
        return sum(len(_memo_of(device)) for device in list(_memo_owners))


def _memo_of(device: Device) -> dict[tuple[str, str], Kernel]:
    """``device``'s loaded kernels (made on first use); hold ``_lock``."""
    memo: dict[tuple[str, str], Kernel] | None = device.__dict__.get(_MEMO_ATTRIBUTE)
    if memo is None:
        memo = {}
        setattr(device, _MEMO_ATTRIBUTE, memo)
        _memo_owners.add(device)
    return memo


def compile_kernel(
    device: Device,
    source: str,
    name: str,
    options: tuple[str, ...],
    cache: KernelCache | None | bool = True,
) -> Kernel:
    """Build (or fetch) and load kernel ``name`` of ``source`` on ``device``.

    ``cache`` is a KernelCache, None for no disk cache, or True for :func:`default_cache`.
    Raises InputError when ``name`` is not a kernel in ``source`` and CompileError (with the
    build log) when the source does not build.
    """
    options = tuple(options)
    check_text(source, options, name)
    disk = default_cache() if cache is True else cache or None
    key = device_key(device, options, source)
    # Read with the key, before the build: read after it, a header edited meanwhile was
    # recorded as the binary's, and another device's build of the new code passed the check.
    headers = kernel_headers(device, options, source)
    memo_key: _MemoKey = (id(device), key, name)
    with _lock:
        kernel = _memo_of(device).get((key, name))
        if kernel is not None:
            return kernel
        pending = _in_flight.get(memo_key)
        if pending is None:
            future: Future[Kernel] = Future()
            _in_flight[memo_key] = future
    if pending is not None:
        return pending.result()
    try:
        params = _Params(device, source, name, options, key, disk)
        kernel, kept = _build_and_load(device, source, name, options, params, key, disk,
                                       headers)
        kernel.source, kernel.options = source, options
        kernel.headers = headers if kept else CHANGED_WHILE_BUILT
    except BaseException as exc:
        with _lock:
            _in_flight.pop(memo_key, None)
        future.set_exception(exc)
        raise
    with _lock:
        if kept:  # else the next compile builds again, from the headers as they are then
            _memo_of(device)[key, name] = kernel
        _in_flight.pop(memo_key, None)
    future.set_result(kernel)
    return kernel


class KernelFuture:
    """A kernel whose compiler runs on a host thread; :meth:`result` loads it.

    Building (NVRTC, the OpenCL compiler) happens on a compiler thread while the device keeps
    streaming; loading the module waits for the device to go idle on CUDA, so it happens only
    when the caller asks for the kernel, on the caller's thread: ``cv.stream`` does it before
    its first block, never while its own blocks are in flight.
    """

    def __init__(self, device: Device, source: str, name: str, options: tuple[str, ...]) -> None:
        self.device = device
        self.source = source
        self.name = name
        self.options = options
        check_text(source, options, name)
        self._disk = default_cache()
        self._key = device_key(device, options, source)
        # With the key, before the build (after it, an edit in between passed the check).
        self._headers = kernel_headers(device, options, source)
        # A wrong name fails now, not on the compiler thread.
        read = _Params(device, source, name, options, self._key, self._disk)
        self.params = read.params
        self._binary = _compiler_pool().submit(
            _fetch_or_build, device, source, options, self._key, self._disk, read,
            self._headers)

    def done(self) -> bool:
        """True once the compiler has finished (successfully or not)."""
        return self._binary.done()

    def result(self, timeout: float | None = None) -> Kernel:
        """The loaded kernel; waits for the build. Raises CompileError if it failed."""
        with _lock:
            kernel = _memo_of(self.device).get((self._key, self.name))
        if kernel is not None:
            return kernel
        binary, kept = self._binary.result(timeout)
        hazards.kernel_build(self.device, self.name, "loaded")
        with build_lock(self._key, self._disk):
            kernel = self.device.load_kernel(binary, self.name, self.options, self.params)
        kernel.source, kernel.options = self.source, self.options
        if not kept:
            kernel.headers = CHANGED_WHILE_BUILT
            return kernel
        kernel.headers = self._headers
        with _lock:
            return _memo_of(self.device).setdefault((self._key, self.name), kernel)


def _fetch_or_build(
    device: Device, source: str, options: tuple[str, ...], key: str, disk: KernelCache | None,
    params: _Params, headers: tuple[tuple[str, str, str], ...],
) -> tuple[bytes, bool]:
    """The binary (from the cache, or built and stored) and whether it is the one ``key``
    names (False: a header changed during the build; nothing stored)."""
    # Under the build lock: another process building the same kernel finishes (and stores
    # it) first, so this one finds the entry instead of racing it in the driver's own cache.
    with build_lock(key, disk):
        binary = disk.load(key) if disk is not None else None
        if binary is None:
            binary = sizecheck.build(device, source, expanded_source(device, source, options),
                                    options)
            if kernel_headers(device, options, source) != headers:
                return binary, False
            if disk is not None:
                disk.store(key, binary)
        params.store(key, disk)
        return binary, True


def compile_async(
    device: Device, source: str, name: str, options: Sequence[str] = ()
) -> Future[Kernel]:
    """Start building kernel ``name`` on a compiler thread; the future gives the Kernel.

    The basis of ``Device.compile(..., wait=False)``: build every kernel a stream needs at
    once, then wait on the futures before sending the first block. The future raises what
    :func:`compile_kernel` raises (InputError, CompileError). Compiler threads are shared by
    the whole process.
    """
    return _compiler_pool().submit(compile_kernel, device, source, name, tuple(options))


def _compiler_pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            workers = max(1, min(4, os.cpu_count() or 1))
            _executor = ThreadPoolExecutor(workers, thread_name_prefix="conveyor-compile")
        return _executor


def _build_and_load(
    device: Device,
    source: str,
    name: str,
    options: tuple[str, ...],
    params: _Params,
    key: str,
    disk: KernelCache | None,
    headers: tuple[tuple[str, str, str], ...],
) -> tuple[Kernel, bool]:
    """The loaded kernel and whether its binary is the one ``key`` names (False: a header
    read with the key changed during the build, so the compiler may have read the new text;
    nothing is stored under the old key)."""
    # Build, store and load while holding the kernel's cross-process lock (buildlock.py says
    # why): the processes that wait then load the stored binary one at a time.
    with build_lock(key, disk):
        binary = disk.load(key) if disk is not None else None
        hazards.kernel_build(device, name, "built" if binary is None else "loaded")
        if binary is not None:
            try:
                kernel = device.load_kernel(binary, name, options, params.params)
            except CompileError:
                # The entry passed its checksum but the driver rejects it (another driver
                # build, a truncated binary from an older conveyor): drop it, build from source.
                assert disk is not None
                disk.discard(key)
            else:
                params.store(key, disk)
                return kernel, True
        binary = sizecheck.build(device, source, expanded_source(device, source, options),
                                    options)
        kept = kernel_headers(device, options, source) == headers
        if disk is not None and kept:
            disk.store(key, binary)
        kernel = device.load_kernel(binary, name, options, params.params)
        if kept:
            params.store(key, disk)
        return kernel, kept
