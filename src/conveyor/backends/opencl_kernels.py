"""Kernels of the OpenCL backend: building a program, loading a kernel from its binary, and
what the driver reports about each argument (``-cl-kernel-arg-info``), which conveyor checks
against the parameters it read from the source (kernels/argtypes.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyopencl as cl

from conveyor import config
from conveyor.backends import base
from conveyor.errors import CompileError, InputError
from conveyor.interrupts import deferred_sigint, start_thread
from conveyor.kernels.argtypes import DriverArg, from_driver
from conveyor.kernels.signature import Param, arg_converters

if TYPE_CHECKING:
    from conveyor.backends.opencl import Device


class Kernel(base.Kernel):
    """A ``cl.Kernel`` and the converters for its arguments."""

    def __init__(self, device: Device, cl_kernel: cl.Kernel, name: str,
                 params: Sequence[Param]) -> None:
        self.device = device
        self.cl_kernel = cl_kernel
        self.name = name
        self.params = tuple(params)
        self.lock = threading.Lock()  # set_args + enqueue must not interleave across threads
        from conveyor.backends.opencl import _buffer_arg  # the buffer types live there
        from conveyor.backends.opencl_images import OPAQUE_ARGS

        self.converters: list[Callable[[Any], Any]] = [
            OPAQUE_ARGS.get(param.base.split(" ")[-1], convert)  # "read_only image2d_t" too
            for param, convert in zip(self.params, arg_converters(self.params, _buffer_arg),
                                      strict=True)
        ]
        self.work_group_size = int(
            cl_kernel.get_work_group_info(
                cl.kernel_work_group_info.WORK_GROUP_SIZE, device.cl_device
            )
        )
        self.default_local_size = _required_local_size(cl_kernel, device, name) or min(
            self.work_group_size, 256)


def _required_local_size(cl_kernel: cl.Kernel, device: Device, name: str) -> int | None:
    """The work-group size the kernel declares with ``reqd_work_group_size(N, 1, 1)``, which
    every launch must then use (None when it declares none); InputError for a 2-D or 3-D one,
    since conveyor launches 1-D work."""
    try:
        required = tuple(int(v) for v in cl_kernel.get_work_group_info(
            cl.kernel_work_group_info.COMPILE_WORK_GROUP_SIZE, device.cl_device))
    except (cl.Error, TypeError, ValueError):
        return None
    if not required or required[0] == 0:
        return None
    if any(v != 1 for v in required[1:]):
        raise InputError(
            f"kernel {name!r} declares reqd_work_group_size{required}, but conveyor launches "
            f"1-D work: declare reqd_work_group_size(N, 1, 1) or remove the attribute"
        )
    largest = int(cl_kernel.get_work_group_info(
        cl.kernel_work_group_info.WORK_GROUP_SIZE, device.cl_device))
    if required[0] > largest:  # every launch would fail with INVALID_WORK_GROUP_SIZE
        raise InputError(
            f"kernel {name!r} declares reqd_work_group_size({required[0]}, 1, 1), but "
            f"{device.name} runs work groups of at most {largest} work items of this kernel: "
            f"declare {largest} or fewer, or remove the attribute")
    return required[0]


#: The stack a build runs on. Compilers recurse per level of an expression: PoCL's overflowed
#: the 8 MiB of a thread's default stack on a sum of 32,768 terms and killed the process
#: (SIGSEGV); 256 MiB built 262,144 terms. It is address space, touched only as deep as used.
_BUILD_STACK = 256 << 20
_stack_size_lock = threading.Lock()


def _on_a_deep_stack(build: Callable[[], Any]) -> None:
    """Run ``build`` on a thread of its own with a _BUILD_STACK stack, and wait for it (on
    the calling thread where no such thread can be started: address space refused)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            build()
        except BaseException as exc:  # noqa: BLE001 (raised again on the caller's thread)
            failed.append(exc)

    with _stack_size_lock:  # threading.stack_size is per process: set, start, put back
        try:
            before = threading.stack_size(_BUILD_STACK)
        except (ValueError, RuntimeError):
            before = None
        thread = threading.Thread(target=run, name="conveyor-build", daemon=True)
        try:
            start_thread(thread)
            started = True
        except RuntimeError:  # no address space for its stack: build on this thread
            started = False
        finally:
            if before is not None:
                threading.stack_size(before)
    if not started:
        build()
        return
    # A Ctrl-C waits for the build, as it did when the build ran on this thread (the
    # driver's call returns first): never a build left running on a thread of its own.
    with deferred_sigint():
        thread.join()
    if failed:
        raise failed[0]


def build_binary(device: Device, source: str, options: Sequence[str]) -> bytes:
    """Build ``source`` for ``device`` with ``options`` (and the argument-info option);
    the program binary. CompileError with the driver's log."""
    from conveyor.backends.opencl import _backend_error

    # cache_dir=False below: PyOpenCL's own build cache stores pickles on some platforms;
    # conveyor keeps its own cache, which holds no pickle.
    program = cl.Program(device.context, source)
    try:
        _on_a_deep_stack(lambda: program.build(options=_with_arg_info(options),
                                               devices=[device.cl_device], cache_dir=False))
    except cl.RuntimeError as exc:
        log = _build_log(program, device.cl_device) or str(exc)
        raise CompileError(f"OpenCL build failed on {device.name}{_variable_options()}",
                           log=log, source=source) from exc
    except cl.Error as exc:
        raise _backend_error(exc, "clBuildProgram") from exc
    _check_names(device, program)
    binaries = program.get_info(cl.program_info.BINARIES)
    return bytes(binaries[0])


def _variable_options() -> str:
    """Where PYOPENCL_BUILD_OPTIONS is set, a note naming it for a failed build's message:
    PyOpenCL adds its words to every build, so "Invalid build option: -bogus" blamed an
    option the caller never passed and named no place to change it."""
    value = config.pyopencl_build_options()
    if not value:
        return ""
    return (f" (with {config.PYOPENCL_BUILD_OPTIONS_VAR}={value!r} set, whose options PyOpenCL "
            f"adds to every build: if the log below blames one, correct or unset the variable)")


#: PoCL aborts the process (SIGABRT, "Final linking of kernel ... failed.") when it links a
#: program holding a kernel of a longer name, as it does for the binary.
POCL_LONGEST_NAME = 252


def _pocl(device: Device) -> bool:
    return "Portable Computing Language" in device.info.platform


def _check_names(device: Device, program: Any) -> None:
    """InputError for a kernel name PoCL cannot link (before it is asked to)."""
    if not _pocl(device):
        return
    names = str(program.get_info(cl.program_info.KERNEL_NAMES)).split(";")
    long = next((n for n in names if len(n.encode()) > POCL_LONGEST_NAME), None)
    if long is not None:
        raise InputError(f"kernel {long[:40]}... has a name of {len(long.encode())} bytes: "
                         f"PoCL aborts the process when it links a kernel of a name longer "
                         f"than {POCL_LONGEST_NAME} bytes; shorten it")


def load_kernel(device: Device, binary: bytes, name: str, options: Sequence[str],
                params: Sequence[Param]) -> Kernel:
    """Kernel ``name`` of ``binary`` on ``device``, its parameters checked against what
    the driver reports."""
    from conveyor.backends.opencl import _code_name

    try:
        program = cl.Program(device.context, [device.cl_device], [binary])
        program.build(options=_with_arg_info(options), devices=[device.cl_device],
                      cache_dir=False)
        cl_kernel = cl.Kernel(program, name)
    except cl.Error as exc:
        if exc.code == cl.status_code.INVALID_KERNEL_NAME:  # the compiler's names, listed
            try:
                names = str(program.get_info(cl.program_info.KERNEL_NAMES)).split(";")
            except cl.Error:
                names = []
            listing = ", ".join(n for n in names if n) or "none"
            raise InputError(f"no kernel named {name!r} in the program the compiler built "
                             f"(after its #define and #if); kernels found: {listing}") from exc
        raise CompileError(
            f"could not load kernel {name!r} from its binary on {device.name}: "
            f"{_code_name(exc.code)}"
        ) from exc
    params = from_driver(name, params, _arg_info(cl_kernel, params, ask_names=not _pocl(device)),
                         device.name)
    return Kernel(device, cl_kernel, name, params)


ARG_INFO_OPTION = "-cl-kernel-arg-info"
_ADDRESS_NAMES = {
    cl.kernel_arg_address_qualifier.GLOBAL: "global",
    cl.kernel_arg_address_qualifier.LOCAL: "local",
    cl.kernel_arg_address_qualifier.CONSTANT: "constant",
    cl.kernel_arg_address_qualifier.PRIVATE: "private",
}


def _with_arg_info(options: Sequence[str]) -> list[str]:
    """The build options with ``-cl-kernel-arg-info``, so the driver can report each kernel
    argument's type (conveyor checks arrays and casts scalars against it)."""
    options = list(options)
    return options if ARG_INFO_OPTION in options else [*options, ARG_INFO_OPTION]


def _arg_info(cl_kernel: cl.Kernel, source: Sequence[Param] = (), *, ask_names: bool = True
              ) -> list[DriverArg] | None:
    """What the driver reports about each argument of ``cl_kernel``; None where it reports
    nothing (KERNEL_ARG_INFO_NOT_AVAILABLE, or a driver without clGetKernelArgInfo).

    ``source``: the parameters read from the source. An argument the source leaves unnamed
    (``float,``) is not asked its name: PoCL answers that query with a segmentation fault.
    ``ask_names=False`` asks none (PoCL: an argument named in conveyor's reading of the
    source but not in the compiler's, through a macro conveyor does not know, crashed it
    too); the names are then the source's (argtypes.from_driver)."""
    info = cl.kernel_arg_info
    reported: list[DriverArg] = []
    try:
        count = int(cl_kernel.num_args)
        # A source whose parameters do not line up with the driver's cannot say which are
        # named: none is asked its name then (PoCL answers an unnamed one with SIGSEGV).
        unnamed = ({i for i, p in enumerate(source) if not p.name}
                   if len(source) == count and ask_names else set(range(count)))
        for index in range(count):
            address = cl_kernel.get_arg_info(index, info.ADDRESS_QUALIFIER)
            type_name = str(cl_kernel.get_arg_info(index, info.TYPE_NAME)).strip("\0 ")
            qualifier = int(cl_kernel.get_arg_info(index, info.TYPE_QUALIFIER))
            try:
                name = "" if index in unnamed else str(
                    cl_kernel.get_arg_info(index, info.NAME)).strip("\0 ")
            except cl.Error:
                name = ""
            reported.append(DriverArg(
                name=name, address=_ADDRESS_NAMES.get(address, "private"),
                type_name=type_name,
                is_const=bool(qualifier & cl.kernel_arg_type_qualifier.CONST),
            ))
    except (cl.Error, cl.LogicError, AttributeError):
        return None
    return reported


def _version_number(text: str) -> str:
    """"OpenCL C 1.2 pocl" -> "120", as ``__OPENCL_VERSION__`` spells a version."""
    for word in str(text).split():
        major, dot, minor = word.partition(".")
        if dot and major.isdigit() and minor[:1].isdigit():
            return str(int(major) * 100 + int(minor[:1]) * 10)
    return "120"


def _build_log(program: cl.Program, device: cl.Device) -> str:
    try:
        return str(program.get_build_info(device, cl.program_build_info.LOG)).strip()
    except cl.Error:
        return ""
