"""One kernel source for both backends: OpenCL C spellings that also compile as CUDA C.

Prepend :data:`PRELUDE` (or call :func:`portable`) to an OpenCL C kernel written with
``__kernel``, ``__global``, ``ulong``/``uint``/``ushort``/``uchar`` and ``get_global_id(0)``,
and NVRTC compiles it as CUDA C too: under ``__CUDACC__`` those names become their CUDA
equivalents, and OpenCL compilers never see the definitions. ``#line 1`` keeps the compiler's
line numbers those of your source (NVIDIA's OpenCL compiler ignores it and counts the
prelude's lines too). 1-D kernels only (``get_global_id(0)``); no local memory, barriers or
vector types.
"""

from __future__ import annotations

from conveyor.errors import InputError

PRELUDE = """#ifdef __CUDACC__
#define __kernel extern "C" __global__
#define __global
#define ulong unsigned long long
#define uint unsigned int
#define ushort unsigned short
#define uchar unsigned char
#define get_global_id(dim) (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x)
#endif
#line 1
"""


def portable(source: str) -> str:
    """``source`` with :data:`PRELUDE` in front: builds on OpenCL and CUDA alike."""
    if isinstance(source, bytes | bytearray):
        raise InputError("portable() takes the source as a str: decode it first "
                         "(source.decode('utf-8'))")
    if not isinstance(source, str):
        raise InputError(f"portable() takes the kernel's source as a str, got "
                         f"{type(source).__name__}")
    return PRELUDE + source
