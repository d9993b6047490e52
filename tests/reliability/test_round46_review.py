"""Round forty-six: a review of session 22's last fixes (d423722, a576d63) and rounds forty-one
to forty-five.

Tried (scripts under /tmp/r46rev, not kept): 20,000 seeded sequences of one to four partials
(every NumPy bool/int/uint/float/complex scalar, 0-d arrays of them, Python bools, ints,
floats and complexes, NaN/inf/-0.0) under "sum", "min" and "max", folded by ``fold.combine``
and compared with np.sum/np.min/np.max of the partials as one array; chains of kernels from
two devices, of KernelFutures, and of a kernel with a callable link, with ``device=`` d0,
[d0], [d1], [d0, d1], "opencl:0:0,", ("opencl:1:0",) and "opencl:all" (and a reducing
chain); a writable ``cv.resident`` handle in a callable's args flat and nested in tuples,
lists, dicts, over one and two devices, and in a callable link's args; integral floats,
float16, Fractions, Decimals, NaN, inf, -0.0, 1e300, 2**63, 2**70, bools and 0-d arrays for
``cv.per_block``/``cv.rows`` shapes and ratios, chain temps' row shapes and depth; empty
inputs with those; ``POCL_EXTRA_BUILD_FLAGS`` set, seen by a PyOpenCL build, then unset, in
child processes.

Found (each a strict xfail asserting the right behaviour):

- A Python bool partial between integer partials and a float16 one: the sum is rounded to
  float32 (``[int32(2**24 + 1), False, float16(0)]`` gives 16777216.0, np.sum 16777217.0).
  A regression of d423722: ``widened(True)`` is a Python int, so the integer total becomes
  a Python int, and NumPy adds a Python int to the float16's float32 in float32.
- ``POCL_EXTRA_BUILD_FLAGS`` seen by PoCL in a PyOpenCL build (a callable's ``a * 2``), then
  unset before conveyor's first build: conveyor records "unset" as the process's first state,
  PoCL keeps the value, and the kernel comes out x5 where its source says x3, stored under a
  key that names no variable (a second process with a clean environment is then served x5).
- A read-only ``cv.resident`` handle that lives on the other device: ``device=[d0, d1]``
  copies it, ``device=[d0]`` (the one-device stream the README names) refuses it, for a
  kernel and for a chain: the k = 1 of ``devices[:k]`` that rounds forty-four and forty-five
  made work for the kernels themselves.
- An empty input with an output of ``cv.rows(ratio=(1, q))`` for a large q is refused by the
  host-memory check, for a staging ring no block would use (round forty-one took the device
  check out for no rows, not this one).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, child_env  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.pipeline.fold import combine  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"

ADD_TABLE = """__kernel void add_t(__global const float *x, __global float *y,
                    __global const float *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[0];
}"""


def _opencl(pair) -> None:
    for dev in pair:
        if dev.backend != "opencl":
            pytest.skip("OpenCL C kernels")


def _same(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


# -- 1. a Python bool between integer partials and a float16 one ---------------------------------
@pytest.mark.parametrize("partials", [
    [np.int32(2**24 + 1), False, np.float16(0.0)],
    [np.uint64(12417436028018888775), True, np.float16(-47.8)],
    [np.uint32(3089171994), False, np.float16(48.0)],
], ids=["int32", "uint64", "uint32"])
def test_a_python_bool_among_integer_partials_keeps_a_float16_sum_in_float64(partials):
    """A callable that returns ``bool(found)`` for a block with nothing, between blocks that
    return NumPy integer counts and one that returns a float16: np.sum of the partials is
    float64 and exact. Since d423722 the bool counts as NumPy's bool (right for min/max),
    but ``reduce.widened(True)`` is still the Python int 1, so ``_python_int_pair`` makes
    the total a Python int, and the float16 partial (widened to float32) is added to it in
    float32 (NEP 50: a Python int takes the other operand's type): 16777216.0 for 16777217,
    1.24174357e19 for 1.24174360e19. d423722^ gave np.sum's values."""
    want = np.sum(np.array(partials))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = combine("sum", list(partials))
    assert _same(got, want), (got, want)


def test_numpy_bools_among_integer_partials_keep_a_float16_sum_exact():
    # guard: the same partials with np.bool_ (widened to np.int64) give np.sum's total.
    partials = [np.int32(2**24 + 1), np.False_, np.float16(0.0)]
    assert _same(combine("sum", partials), np.sum(np.array(partials)))


# -- 2. a driver variable seen by a PyOpenCL build before conveyor's first -----------------------
CHILD = textwrap.dedent("""
    import os, sys, numpy as np, conveyor as cv
    SRC = '''// round46 review
    #ifndef FACTOR
    #define FACTOR 3.0f
    #endif
    __kernel void f(__global const float *x, __global float *y, ulong offset, ulong n) {
        ulong i = get_global_id(0); if (i < n) y[i] = FACTOR * x[i]; }'''
    dev = cv.device(sys.argv[1])
    x = np.ones(256, np.float32)

    def double(a, b, *, queue, offset, n):
        return a * 2  # a PyOpenCL elementwise kernel, built under the variable

    cv.stream(double, [x], [np.zeros_like(x)], device=dev)
    del os.environ["POCL_EXTRA_BUILD_FLAGS"]
    y = np.zeros_like(x)
    try:
        cv.stream(dev.compile(SRC, "f"), [x], [y], device=dev)
        print("factor", float(y[0]))
    except cv.InputError as exc:
        print("refused", "POCL_EXTRA_BUILD_FLAGS" in str(exc))
""")


def test_a_driver_variable_seen_before_conveyors_first_build_is_not_built_in_unnamed(
        pair, tmp_path):
    """A notebook sets ``POCL_EXTRA_BUILD_FLAGS=-DFACTOR=5.0f``, runs a stream whose
    callable uses PyOpenCL (``a * 2``: PoCL builds it and keeps the value for the process),
    unsets the variable and compiles a kernel. config.driver_build_variables takes its
    "first build" state at conveyor's first build (now: unset), so nothing is refused, PoCL
    builds with -DFACTOR=5.0f, and the binary is stored under a key that names no variable
    (seen: a second process with a clean environment and the same cache is served x5).
    Right: 3 (the source's value, as the key says), or an InputError naming the variable."""
    pocl = [d for d in pair if d.backend == "opencl"
            and "Portable Computing Language" in d.info.platform]
    if not pocl:
        pytest.skip("POCL_EXTRA_BUILD_FLAGS is PoCL's")
    env = child_env(str(SRC))
    env.update(POCL_EXTRA_BUILD_FLAGS="-DFACTOR=5.0f", CONVEYOR_CACHE_DIR=str(tmp_path / "c"),
               POCL_CACHE_DIR=str(tmp_path / "pocl"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    (tmp_path / "pocl").mkdir()
    done = subprocess.run([sys.executable, "-c", CHILD, pocl[0].spec], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] in (["factor", "3.0"], ["refused", "True"]), done.stdout


# -- 3. a table of the other device on a list of one device --------------------------------------
@pytest.mark.parametrize("chained", [False, True], ids=["kernel", "chain"])
def test_a_table_of_the_other_device_runs_on_a_list_of_one_as_on_two(pair, chained):
    """Code that streams over ``devices[:k]`` with a read-only table made on the last device
    (``cv.resident(t, device=devices[-1])``): for k = 2 every device gets the table
    (multi._Homes copies it to the devices it does not live on), for k = 1 the stream is
    refused ("this resident array lives on opencl:1:0 ... make a cv.resident(...) per
    device"): stream.py rebuilds the kernel (kernel_for, chain_kernels_for) but binds its
    args as on one device."""
    _opencl(pair)
    d0, d1 = pair
    x = np.arange(3001, dtype=np.float32)
    with cv.resident(np.array([5.0], np.float32), device=d1) as table:
        kernel = d1.compile(ADD_TABLE, "add_t")

        def made():
            if chained:
                return cv.chain(cv.link(kernel, "in0", "out0", args=(table,)))
            return kernel

        extra = {} if chained else {"args": (table,)}
        for devices in ([d0, d1], [d0]):
            y = np.zeros_like(x)
            cv.stream(made(), [x], [y], device=devices, block_bytes=4000, **extra)
            np.testing.assert_array_equal(y, x + 5)
    for dev in pair:
        assert_clean(dev)


# -- 4. an empty input with a large ratio -----------------------------------------------------
def test_an_empty_input_with_a_large_ratio_plans_no_host_ring(device):
    """Round forty-one: "an empty input with cv.rows(ratio=(1, 10**6)) was refused for a ring
    no block would use" (plan.py skips its device check for no rows). The host-memory check
    (stream.check_host_memory, plan.host_bytes) still counts that ring: ratio=(1, 2**40)
    on an empty input is "this stream would hold about 3.5e13 bytes of host memory ... use
    a smaller block_bytes or depth", which neither helps. Right: an empty output."""
    def nothing(x, y, *, queue, offset, n):
        return None

    report = cv.stream(nothing, [np.zeros(0, np.float32)],
                       [cv.rows(np.float32, ratio=(1, 2**40))], device=device)
    assert report.outputs[0].shape == (0,)
