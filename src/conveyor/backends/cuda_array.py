"""Arrays for Python compute callables on the CUDA backend: DLPack and
``__cuda_array_interface__`` views of device memory, so CuPy (``cupy.asarray``), PyTorch
(``torch.from_dlpack``) and Numba (``cuda.as_cuda_array``) take a block without a copy.

cuda.core 1.2 exports no DLPack capsule for an arbitrary shape and dtype, so the (unversioned)
capsule is built here with ctypes; it keeps the owner alive until the consumer deletes it.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from conveyor.backends.cuda import Queue

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
    ]  # fmt: skip


_DL_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DL_DELETER)]


_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DL_NAME = b"dltensor"
_dl_alive: dict[int, tuple[Any, ...]] = {}  # managed tensors not yet deleted, by address


@_DL_DELETER
def _dl_delete(address: int | None) -> None:
    if address is not None:
        _dl_alive.pop(address, None)


_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_pyapi = ctypes.PyDLL(None)  # private handles, so argtypes set here touch no one else's
_pyapi.PyCapsule_New.restype = ctypes.py_object
_pyapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_pyapi.PyCapsule_IsValid.restype = ctypes.c_int
_pyapi.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_pyapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pyapi.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule: int | None) -> None:
    # A consumer renames the capsule to "used_dltensor" and deletes the tensor itself.
    if capsule and _pyapi.PyCapsule_IsValid(capsule, _DL_NAME):
        _dl_delete(_pyapi.PyCapsule_GetPointer(capsule, _DL_NAME))


def _dlpack_capsule(pointer: int, shape: tuple[int, ...], dtype: np.dtype,
                    device: tuple[int, int], owner: object) -> Any:
    """A legacy (unversioned) DLPack capsule over ``pointer``; ``owner`` lives until the
    consumer deletes the tensor."""
    code = _DL_CODES.get(dtype.kind)
    if code is None:
        raise BufferError(f"DLPack cannot describe dtype {dtype}")
    ndim = len(shape)
    shape_array = (ctypes.c_int64 * max(ndim, 1))(*shape)
    steps = [1] * ndim
    for axis in range(ndim - 2, -1, -1):
        steps[axis] = steps[axis + 1] * shape[axis + 1]
    strides_array = (ctypes.c_int64 * max(ndim, 1))(*steps)
    managed = _DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = pointer
    tensor.device = _DLDevice(*device)
    tensor.ndim = ndim
    tensor.dtype = _DLDataType(code, dtype.itemsize * 8, 1)
    tensor.shape = shape_array
    tensor.strides = strides_array
    tensor.byte_offset = 0
    managed.deleter = _dl_delete
    address = ctypes.addressof(managed)
    _dl_alive[address] = (managed, shape_array, strides_array, owner)
    return _pyapi.PyCapsule_New(address, _DL_NAME, _capsule_destructor)


class DeviceArray:
    """A typed view of device memory for CuPy (``cupy.asarray``), PyTorch
    (``torch.from_dlpack``) and Numba (``cuda.as_cuda_array``): no copy.

    The interface names the queue's stream, so consumers order their work after it.
    """

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: np.dtype,
                 dl_device: tuple[int, int], queue: Queue | None, owner: object) -> None:
        self.ptr = pointer
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.queue = queue
        self._dl_device = dl_device
        self._owner = owner

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3 of the CUDA array interface, with the queue's stream."""
        interface: dict[str, Any] = {
            "shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
            "strides": None, "version": 3,
        }
        if self.queue is not None:
            interface["stream"] = self.queue.handle
        return interface

    def __dlpack_device__(self) -> tuple[int, int]:
        """(device type, device id): (2, ordinal) for CUDA memory."""
        return self._dl_device

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule; first makes ``stream`` (None: the legacy default stream, -1: no
        ordering) wait for the queue's work."""
        if copy:
            raise BufferError("conveyor device arrays are exported without a copy")
        if dl_device is not None and tuple(dl_device) != self._dl_device:
            raise BufferError(f"the array lives on DLPack device {self._dl_device}")
        if self.queue is not None and stream != -1:
            self.queue.order_before(1 if stream is None else int(stream))
        return _dlpack_capsule(self.ptr, self.shape, self.dtype, self._dl_device, self)
