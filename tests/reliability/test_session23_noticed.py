"""Two things session 22 noticed and left, mended in session 23.

- A writable ``cv.resident`` handle nested inside a callable's args (``args=((h,),)``, a list,
  a dict) was passed to the callable as it was: the refusal looked at the top level only, and
  the copy-back a writable table promises never happened.
- Host addresses were read through ``__array_interface__``, which lists every field of a
  record dtype first (43 ms for 60,000 fields, once per block where chunks are compared):
  ``hostmem.address`` and ``hostmem.byte_bounds`` read them without it.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.array_utils import byte_bounds as numpy_byte_bounds

import conveyor as cv
from conveyor.memory import hostmem


def _never(*args, **kwargs):
    raise AssertionError("the callable ran: the writable handle was not refused")


def _nestings(handle):
    loop: list = [1]
    loop.append(loop)
    loop.append(handle)
    return [
        ("args[0][0]", ((handle,),)),
        ("args[1][1][0]", (1, [2, [handle]])),
        ("args[0]['table']", ({"table": handle},)),
        ("args[0][<an element>]", ({handle},)),
        ("args[0][<a key>]", ({handle: 1},)),
        ("args[0][2]", (loop,)),
    ]


@pytest.mark.parametrize("index", range(6))
def test_a_nested_writable_handle_in_a_callables_args_is_refused(device, index):
    x = np.ones(1000, np.float32)
    table = np.zeros(4, np.int32)
    with cv.resident(table, writable=True) as handle:
        where, args = _nestings(handle)[index]
        with pytest.raises(cv.InputError) as caught:
            cv.stream(_never, [x], device=device, reduce="sum", args=args, block_bytes=400)
    assert f"{where} is a writable cv.resident table" in str(caught.value)


def test_a_deeply_nested_list_is_walked_without_recursion(device):
    x = np.ones(100, np.float32)
    table = np.zeros(4, np.int32)
    with cv.resident(table, writable=True) as handle:
        deep: list = [handle]
        for _ in range(5_000):  # far past Python's recursion limit, under MOST_CONTAINERS
            deep = [deep]
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            cv.stream(_never, [x], device=device, reduce="sum", args=(deep,), block_bytes=400)


def test_a_nested_read_only_handle_is_passed_as_given(device):
    x = np.ones(1000, np.float32)
    seen = []

    def count(a, *args, **launch):
        seen.append(args[0][0])
        return np.int64(launch["n"])

    with cv.resident(np.zeros(4, np.int32)) as handle:
        total = cv.stream(count, [x], device=device, reduce="sum", args=((handle,),),
                          block_bytes=400).result
    assert total == 1000
    assert seen and all(item is handle for item in seen)


@pytest.mark.parametrize("view", [
    lambda a: a, lambda a: a[::2], lambda a: a[:, ::-1], lambda a: a[..., ::-3],
    lambda a: a.T, lambda a: a[:0], lambda a: a[:, :0, ::-1], lambda a: a[1],
    lambda a: a[::-1, 2:, ::2], lambda a: np.broadcast_to(a[0], (3, 5, 6)),
    lambda a: a.view(np.dtype([("p", np.float32), ("q", np.float32)])),
])
def test_byte_bounds_and_address_agree_with_numpy(view):
    array = view(np.arange(120, dtype=np.float32).reshape(4, 5, 6))
    assert hostmem.byte_bounds(array) == numpy_byte_bounds(array)
    assert hostmem.address(array) == array.__array_interface__["data"][0]


def test_a_dask_task_adds_its_note_to_its_own_copy_of_a_shared_failure():
    """Round forty-six's cluster helper: two tasks that waited for one failed build get the
    same exception object (kernels/build.py); each task's note went onto it, so the error a
    user saw named two chunks on two workers. Each task now notes its own copy."""
    from conveyor.dask.worker import _an_exception

    shared = cv.CompileError("build failed")
    shared.add_note("from the build")
    first, second = _an_exception(shared), _an_exception(shared)
    first.add_note("chunk 0")
    second.add_note("chunk 1")
    assert first.__notes__ == ["from the build", "chunk 0"]
    assert second.__notes__ == ["from the build", "chunk 1"]
    assert shared.__notes__ == ["from the build"]
    assert type(first) is cv.CompileError and str(first) == str(shared)

    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a}+{b}")

    odd = Odd(1, 2)
    assert _an_exception(odd) is odd or str(_an_exception(odd)) == "1+2"


# -- the session's last review (helper-155) ---------------------------------------------------
def test_a_handle_in_the_second_of_two_dict_items_views_is_refused(device):
    """The walk kept ids alone: a dict view's (key, value) tuples are made as it is read, a
    freed one's id came back for the next view's, and the handle in it was never seen."""
    x = np.ones(100, np.float32)
    with cv.resident(np.zeros(4, np.int32), writable=True) as handle:
        for args in (([{"a": 1}.items(), {"t": handle}.items()],),
                     ([{"t": handle}.items(), {"a": 1}.items()],)):
            with pytest.raises(cv.InputError, match=r"\[<an element>\]\[1\] is a writable"):
                cv.stream(_never, [x], device=device, reduce="sum", args=args,
                          block_bytes=400)


def test_a_callable_object_whose_getattr_raises_key_error_is_sent_as_it_is():
    from conveyor.dask import held

    class AttrCall(dict):
        __getattr__ = dict.__getitem__

        def __call__(self, *args, **kwargs):
            return None

    held.refuse_held(AttrCall(scale=2.0))  # no KeyError '__name__': it holds nothing of ours


def test_busy_seconds_of_the_host_wait_lane_is_the_host_stall(pair):
    """busy_seconds sums each device's busy time (as the bound weighs lanes), but host-wait
    is the host blocked: the union over the engines, as host_stall_seconds (they disagreed
    over two devices: 1.39 s against 0.705 s of a 0.708 s stream)."""
    d0, d1 = pair
    if d0.backend != "opencl" or d1.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    twice = cv.portable("""
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}""")
    x = np.ones(200_000, np.float32)
    report = cv.stream(d0.compile(twice, "twice"), [x], [np.float32], device=[d0, d1],
                       block_bytes=40_000, zero_copy=False)
    np.testing.assert_array_equal(report.outputs[0], 2 * x)
    assert report.busy_seconds.get("host-wait", 0.0) == pytest.approx(
        report.host_stall_seconds)


def test_a_pinned_limit_cuts_no_zero_copy_blocks_over_two_devices(pair):
    """The several-device plan counted every array as staged under a pinned limit: a
    zero-copy stream that one device ran in one block ran in 695 over two (helper-155)."""
    import gc

    from conveyor.backends import opencl

    d0, d1 = pair
    if not (d0.backend == d1.backend == "opencl" and d0.host_unified and d1.host_unified):
        pytest.skip("zero-copy over two OpenCL devices in host memory")
    own = [opencl.Device(d.cl_device, *(int(p) for p in d.spec.split(":")[1:]))
           for d in (d0, d1)]  # contexts of their own: the limits set here are theirs
    try:
        twice = cv.portable("""
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}""")
        k = own[0].compile(twice, "twice")
        x = np.ones(1 << 20, np.float32)
        before = cv.stream(k, [x], [np.float32], device=own, zero_copy=True).blocks
        for dev in own:
            dev.pinned_pool.limit = "256KiB"
        report = cv.stream(k, [x], [np.float32], device=own, zero_copy=True)
        np.testing.assert_array_equal(report.outputs[0], 2 * x)
        assert report.blocks == before, (report.blocks, before)
    finally:
        gc.collect()
        for dev in own:
            dev.close()
