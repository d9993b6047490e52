"""Round fifteen (helper a): numerics end to end. Every dtype a stream takes as input, output
and scalar argument at its extremes, the built-in reductions against NumPy's semantics
(NaN, -0.0, empty and wrapping totals, result types), block sizes that must not change an
integer answer, callables against kernels, outputs of other dtypes and lengths, and the
command's ``--cast``.

Found (each a strict xfail asserting the right behaviour):

- A bool input holding bytes other than 0 and 1 is refused only as an in-memory input of a
  plain kernel stream: the same bools as a .npy or ``cv.raw`` file, a ``cv.iterate`` input,
  a ``cv.chain`` input (an in-memory array) or a table in ``args=`` (plain or
  ``cv.resident``) ran, and PoCL's ``x ? 1 : 0`` gave the byte itself: 100 flags counted
  5240. Wrong answers with no error.
- ``reduce="sum"`` of integer partials raised ``FloatingPointError`` after the whole stream
  under the caller's ``np.errstate(over="raise")`` (and warned otherwise) where the blocks'
  partials wrapped on the host: NumPy's ``np.sum`` wraps silently, and the same stream in one
  block returned NumPy's answer, so the block size decided between an answer and an error.
- A callable's float16 partials were added in float16 one by one: a total of 2048 stayed
  2048 (2048 + 1 rounds back), where ``np.sum`` of the same partials (float32 inside) is 2064.
- A ``datetime64``/``timedelta64`` scalar in ``args=`` passed as its raw count in ns (and
  finer) units, was refused in s, us or D units, and NaT was refused as "None".
- The command told a complex ``.npy`` input to ``pass a.view(np.float32)`` (Python the command
  cannot run), and called ``--cast complex64`` "not a numeric dtype"; its own advice for a
  complex input's ``--cast float32`` is "cast to a complex type".
- A packed record dtype for a struct *output* (a dtype or ``cv.per_block``) was told to
  ``pass a.astype(...)``: there is no array to convert (a copy would not be written).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    compiled,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    opencl_c_only,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

COPY = """__kernel void cp(__global const {T} *x, __global {T} *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}}"""

PUT = """__kernel void put(__global const uchar *x, __global {T} *y, {T} v, ulong offset,
                  ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = v;
}}"""

# (C type, dtype) of every type a kernel's buffer can take on every device here.
C_TYPES = [("char", np.int8), ("uchar", np.uint8), ("short", np.int16), ("ushort", np.uint16),
           ("int", np.int32), ("uint", np.uint32), ("long", np.int64), ("ulong", np.uint64),
           ("float", np.float32), ("double", np.float64)]
INTS = [c for c in C_TYPES if np.dtype(c[1]).kind in "iu"]


def _extremes(dtype) -> np.ndarray:
    """Every edge value of ``dtype``, repeated to 600 elements."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        values = [True, False, False]
    elif dtype.kind == "f":
        fi = np.finfo(dtype)
        values = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, fi.max, fi.min, fi.tiny,
                  fi.smallest_subnormal, -fi.smallest_subnormal, 1.0]
    else:
        ii = np.iinfo(dtype)
        values = [ii.min, ii.max, 0, 1, ii.max - 1, ii.min + 1]
    out = np.array(values, dtype)
    return np.tile(out, -(-600 // len(out)))[:600]


def _random_ints(dtype, n: int, seed: int) -> np.ndarray:
    ii = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(ii.min, ii.max, n, dtype=dtype, endpoint=True)


def _bits(value) -> bytes:
    return np.asarray(value).tobytes()


def _first_device_only(request) -> None:
    """Skip a sweep over every type on devices after the first: what it checks (casts,
    folds, block cuts) is conveyor's, the same on every device, and a second device would
    double its kernel builds (two per type and fold)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.indices.get("device", 0) != 0:
        pytest.skip("type sweeps run on the first device")


# -- inputs and outputs of every dtype -------------------------------------------------------

@pytest.mark.parametrize("zero_copy", [False, None])
def test_every_scalar_type_passes_its_extremes_bit_for_bit(device, request, zero_copy):
    """guard: int8..uint64 at their bounds, float32/64 NaN (both signs), +-inf, -0.0,
    subnormals, through a copying and a zero-copy stream in blocks of 7 elements."""
    _first_device_only(request)
    for c_type, dtype in C_TYPES:
        x = _extremes(dtype)
        y = np.zeros_like(x)
        k = compiled(device, COPY.format(T=c_type), "cp")
        cv.stream(k, [x], [y], device=device, block_bytes=7 * x.itemsize, zero_copy=zero_copy)
        assert x.tobytes() == y.tobytes(), c_type
    assert_clean(device)


def test_bool_and_half_buffers_pass_their_values(device):
    """guard: a bool input/output (bytes 0 and 1) and float16 through ``half*`` with
    vload_half/vstore_half (PoCL has no cl_khr_fp16: direct half loads do not build)."""
    opencl_c_only(device)
    x = _extremes(np.bool_)
    k = compiled(device, COPY.format(T="bool"), "cp")
    y = cv.stream(k, [x], [np.bool_], device=device, block_bytes=5).outputs[0]
    assert y.dtype == np.bool_ and np.array_equal(x, y)
    half = """__kernel void h(__global const half *x, __global half *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) vstore_half(vload_half(i, x), i, y);
    }"""
    h = _extremes(np.float16)
    for zero_copy in (False, None):
        out = cv.stream(compiled(device, half, "h"), [h], [np.float16], device=device,
                        block_bytes=14, zero_copy=zero_copy).outputs[0]
        # NaN payloads go through float32 and back: compare values, NaN for NaN.
        assert out.dtype == np.float16
        np.testing.assert_array_equal(out, h)
        assert _bits(out[h == 0]) == _bits(h[h == 0])  # -0.0 stays -0.0
    assert_clean(device)


def test_a_float16_stencil_with_constant_boundaries_matches_np_pad(device):
    """guard: float16 input with a halo and NaN, -inf, 65504 and 65519 (which rounds to
    65504, as np.pad rounds it) as the constant, summed in float32 and stored as half."""
    opencl_c_only(device)
    src = """__kernel void h(__global const half *x, __global half *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) vstore_half(vload_half(i, x) + vload_half(i + 1, x), i, y);
    }"""
    k = compiled(device, src, "h")
    x = np.tile(np.array([0, -0.0, 1, 65504, 6e-8, np.nan, np.inf, -1.5, 3], np.float16), 20)
    for boundary in (np.nan, -np.inf, 65504.0, 65519.0):
        xp = np.pad(x, 1, mode="constant", constant_values=boundary)
        with np.errstate(all="ignore"):
            want = (xp[:-2].astype(np.float32) + xp[1:-1].astype(np.float32)).astype(np.float16)
        for block_bytes in (2, 18, None):
            out = cv.stream(k, [x], [np.float16], device=device, halo=1, boundary=boundary,
                            block_bytes=block_bytes).outputs[0]
            np.testing.assert_array_equal(out, want)
    assert_clean(device)


@pytest.mark.parametrize("zero_copy", [False, None])
def test_an_output_of_another_dtype_and_wider_rows_is_exact(device, request, zero_copy):
    """guard: uint8 rows in, four float64 / uint64 / int8 values per row out (8x to 32x the
    input's bytes per row), as a given array and as ``cv.rows(dtype, shape=(4,))``, in blocks
    that are not a multiple of anything."""
    _first_device_only(request)
    src = """__kernel void widen(__global const uchar *x, __global {T} *y, ulong offset,
                                 ulong n) {{
        ulong i = get_global_id(0);
        if (i < n) for (int k = 0; k < 4; k++)
            y[4 * i + k] = ({T})x[i] * ({T})(k + 1) - ({T})((offset + i) % 3);
    }}"""
    x = (np.arange(3001) % 251).astype(np.uint8)
    for c_type, dtype in (("double", np.float64), ("ulong", np.uint64), ("char", np.int8)):
        k = compiled(device, src.format(T=c_type), "widen")
        with np.errstate(all="ignore"):
            want = (x.astype(dtype)[:, None] * np.arange(1, 5).astype(dtype)
                    - (np.arange(3001) % 3).astype(dtype)[:, None])
        for block_bytes in (960, 4000, None):
            out = cv.stream(k, [x], [cv.rows(dtype, shape=(4,))], device=device,
                            block_bytes=block_bytes, zero_copy=zero_copy).outputs[0]
            assert out.dtype == dtype and np.array_equal(out, want), (c_type, block_bytes)
            given = np.zeros((3001, 4), dtype)
            cv.stream(k, [x], [given], device=device, block_bytes=block_bytes,
                      zero_copy=zero_copy)
            assert np.array_equal(given, want), (c_type, block_bytes)
    assert_clean(device)


def test_ratio_outputs_of_narrow_types_pool_exactly(device, request):
    """guard: ``cv.rows(ratio=(1, q))`` outputs of bool, int8, uint8, uint64 pooled from
    float64 rows, whatever the block size (blocks cut at multiples of q)."""
    _first_device_only(request)
    src = """__kernel void pool(__global const double *x, __global {T} *y, uint q, ulong offset,
                                ulong n) {{
        ulong j = get_global_id(0);
        if (j < n / q) {{
            double s = 0;
            for (uint k = 0; k < q; k++) s += x[j * q + k];
            y[j] = ({T})s;
        }}
    }}"""
    x = (np.arange(21 * 50) % 5).astype(np.float64)
    for c_type, dtype in (("bool", np.bool_), ("char", np.int8), ("uchar", np.uint8),
                          ("ulong", np.uint64)):
        k = compiled(device, src.format(T=c_type), "pool")
        for q in (3, 7):
            want = x.reshape(-1, q).sum(1).astype(dtype)
            for block_bytes in (8, 8 * 22, None):
                out = cv.stream(k, [x], [cv.rows(dtype, ratio=(1, q))], device=device,
                                args=(q,), block_bytes=block_bytes).outputs[0]
                assert out.dtype == dtype and np.array_equal(out, want), (c_type, q)
    assert_clean(device)


def test_per_block_records_of_a_c_struct_hold_each_blocks_figures(device):
    """guard: a ``cv.per_block(1, aligned record)`` of (ulong, double, char) per block:
    count, total and minimum of each block's rows, for three block sizes, both paths."""
    opencl_c_only(device)
    src = """typedef struct { ulong count; double total; char lo; } stat;
    __kernel void st(__global const double *x, __global stat *y, ulong offset, ulong n) {
        if (get_global_id(0) == 0) {
            stat s; s.count = n; s.total = 0; s.lo = 127;
            for (ulong i = 0; i < n; i++) { s.total += x[i]; if (x[i] < s.lo) s.lo = (char)x[i]; }
            y[0] = s;
        }
    }"""
    k = compiled(device, src, "st")
    record = np.dtype([("count", "u8"), ("total", "f8"), ("lo", "i1")], align=True)
    x = (np.arange(1000) % 50 - 25).astype(np.float64)
    for block_bytes in (800, 8 * 333, None):
        for zero_copy in (False, None):
            report = cv.stream(k, [x], [cv.per_block(1, record)], device=device,
                               block_bytes=block_bytes, zero_copy=zero_copy)
            want = np.array([[(b - a, x[a:b].sum(), x[a:b].min())]
                             for a, b in report.block_ranges], record)
            assert np.array_equal(report.outputs[0], want)
    assert_clean(device)


BOOL_COUNT = """__kernel void cnt(__global const bool *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] ? 1 : 0;
}"""
BOOL_LUT = """__kernel void lut(__global const int *x, __global int *y, __global const bool *t,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[x[i]] ? 1 : 0;
}"""


def test_a_bool_array_of_other_bytes_is_refused_as_a_stream_input(device):
    """guard: ``u8.view(bool)`` holding 2, 4 and 255 as a plain input (copying and
    zero-copy): refused before any work, as documented."""
    b = np.tile(np.array([0, 1, 2, 4, 255], np.uint8), 20).view(np.bool_)
    for zero_copy in (False, None):
        with pytest.raises(InputError, match="other than 0 and 1"):
            cv.stream(compiled(device, BOOL_COUNT, "cnt"), [b], [np.int32], device=device,
                      zero_copy=zero_copy)
    assert_clean(device)


@pytest.mark.parametrize("how", ["npy", "raw", "iterate", "chain", "table", "resident"])
def test_a_bool_of_other_bytes_is_refused_on_every_way_in(device, tmp_path, how):
    """The same bools as a .npy file, a ``cv.raw`` file, a ``cv.iterate`` input, an input of
    a ``cv.chain`` and a table in ``args=`` (plain and ``cv.resident``): no check, and
    PoCL's ``x ? 1 : 0`` is the byte itself, so the count of 100 flags is 5240 (and a table
    lookup gives 255 for "true"). The stream must refuse them (an InputError, as a plain
    in-memory input is refused), never return such a count."""
    raw = np.tile(np.array([0, 1, 2, 4, 255], np.uint8), 20)
    b = raw.view(np.bool_)
    want = int(np.count_nonzero(b))  # 80: what NumPy reads
    k = compiled(device, BOOL_COUNT, "cnt")
    args: tuple = ()
    if how == "npy":
        np.save(tmp_path / "b.npy", b)
        inputs: list = [cv.npy(tmp_path / "b.npy")]
    elif how == "raw":
        raw.tofile(tmp_path / "b.raw")
        inputs = [cv.raw(tmp_path / "b.raw", np.bool_)]
    elif how == "iterate":
        inputs = [cv.iterate(iter([b[:50], b[50:]]), length=100)]
    elif how == "chain":
        inputs, k = [b], cv.chain([k])
    else:
        k = compiled(device, BOOL_LUT, "lut")
        inputs = [np.tile(np.arange(5, dtype=np.int32), 20)]
        args = (b[:5] if how == "table" else cv.resident(b[:5]),)
    try:
        report = cv.stream(k, inputs, [np.int32], device=device, args=args)
    except InputError:
        return
    finally:
        for arg in args:
            if isinstance(arg, cv.Resident):
                arg.close()
        assert_clean(device)
    got = int(report.outputs[0].sum())
    assert got == want, f"no error, and {got} flags counted where NumPy reads {want}"


def test_file_outputs_of_records_half_and_bool_read_back_exactly(device, tmp_path):
    """guard: an aligned record ``cv.npy_out`` (padding kept in the header: 24-byte records),
    a float16 ``.npy`` (values past 65504 stored as inf, as astype rounds) and a bool
    ``cv.raw_out``, written in blocks that do not divide the rows."""
    opencl_c_only(device)
    src = """typedef struct { ulong count; double total; char lo; } stat;
    __kernel void st(__global const float *x, __global stat *y, __global half *h,
                     __global bool *b, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) {
            y[i].count = offset + i; y[i].total = x[i]; y[i].lo = (char)((offset + i) % 100 - 50);
            vstore_half(x[i], i, h); b[i] = x[i] > 0;
        }
    }"""
    record = np.dtype([("count", "u8"), ("total", "f8"), ("lo", "i1")], align=True)
    x = np.linspace(-70000, 70000, 1001).astype(np.float32)
    cv.stream(compiled(device, src, "st"), [x],
              [cv.npy_out(tmp_path / "s.npy", dtype=record), tmp_path / "h.npy",
               cv.raw_out(tmp_path / "b.raw", np.bool_)], device=device, block_bytes=24 * 37)
    s = np.load(tmp_path / "s.npy")
    assert s.dtype == record and s.dtype.itemsize == 24
    assert np.array_equal(s["count"], np.arange(1001))
    assert np.array_equal(s["total"], x.astype(np.float64))
    assert np.array_equal(s["lo"], (np.arange(1001) % 100 - 50).astype(np.int8))
    with np.errstate(over="ignore"):
        assert np.array_equal(np.load(tmp_path / "h.npy"), x.astype(np.float16))
    assert np.array_equal(np.fromfile(tmp_path / "b.raw", np.bool_), x > 0)
    assert_clean(device)


# -- reductions against NumPy ----------------------------------------------------------------

def test_kernel_reductions_of_every_type_are_numpys_at_every_block_size(device, request):
    """guard: sum/min/max of random values over the whole range of int8..uint64 (sums that
    wrap int64/uint64 many times) and floats; integer answers exactly NumPy's (value and
    type: sums as int64/uint64, min/max in the element type) at four block sizes."""
    _first_device_only(request)
    # One signed and one unsigned type per width that folds differently (8 bits widened,
    # 64 bits wrapping), and both floats: the others fold as these do.
    for c_type, dtype in [c for c in C_TYPES if c[0] in ("char", "ushort", "long", "ulong",
                                                           "float", "double")]:
        k = compiled(device, COPY.format(T=c_type), "cp")
        if np.dtype(dtype).kind == "f":
            x = np.random.default_rng(3).standard_normal(3000).astype(dtype)
        else:
            x = _random_ints(dtype, 3000, 3)
        for op in ("sum", "min", "max"):
            with np.errstate(over="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # known: int64 wrap warns
                got = [cv.stream(k, [x], device=device, reduce=op, block_bytes=bb).result
                       for bb in (None, 64, 24000)]
            want = getattr(np, op)(x)
            for result in got:
                if np.dtype(dtype).kind == "f" and op == "sum":
                    assert result.dtype == np.float64 and np.isclose(result, want)
                else:
                    assert type(result) is type(want) and result == want, (c_type, op)
    assert_clean(device)


def test_float_min_max_sum_follow_numpy_on_nan_inf_and_signed_zero(device, request):
    """guard: NaN anywhere wins min/max; inf - inf sums to NaN; min/max of signed zeros keep
    the sign NumPy returns; a sum of subnormals is exact; one element and many blocks."""
    _first_device_only(request)
    for c_type, dtype in (("float", np.float32), ("double", np.float64)):
        k = compiled(device, COPY.format(T=c_type), "cp")
        tiny = np.finfo(dtype).smallest_subnormal
        for values in ([np.inf, -np.inf, 1.0], [-0.0, -0.0], [np.nan, 1.0], [1.0, np.nan],
                       [tiny] * 5, [7.0]):
            x = np.array(values * (50 if len(values) > 1 else 1), dtype)
            for op in ("sum", "min", "max"):
                with np.errstate(invalid="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    want = np.float64(getattr(np, op)(x))
                    for block_bytes in (None, x.itemsize):
                        got = cv.stream(k, [x], device=device, reduce=op,
                                        block_bytes=block_bytes).result
                        if np.isnan(want):
                            assert np.isnan(got), (values, op)
                        else:
                            assert _bits(np.float64(got)) == _bits(want), (values, op, got)
    assert_clean(device)


def test_integer_stencil_reductions_agree_on_one_device_and_two(pair):
    """guard: a halo kernel's int8/uint64/int64 sum, min and max equal NumPy's over np.pad
    (edge) rows, bitwise, on one device and over two, at two block sizes."""
    src = """__kernel void diff(__global const {T} *x, __global {T} *y, ulong offset, ulong n) {{
        ulong i = get_global_id(0);
        if (i < n) y[i] = x[i + 1] - x[i];
    }}"""
    for c_type, dtype in (("char", np.int8), ("ulong", np.uint64), ("long", np.int64)):
        x = _random_ints(dtype, 2000, 5)
        xp = np.pad(x, 1, mode="edge")
        with np.errstate(over="ignore"):
            values = xp[1:-1] - xp[:-2]
        kernels = [compiled(d, src.format(T=c_type), "diff") for d in pair]
        for op in ("sum", "min", "max"):
            want = getattr(np, op)(values)
            for where, k in ((pair[0], kernels[0]), (pair, kernels[0])):
                for block_bytes in (8 * x.itemsize, None):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        with np.errstate(over="ignore"):
                            got = cv.stream(k, [x], device=where, reduce=op, halo=1,
                                            block_bytes=block_bytes).result
                    assert type(got) is type(want) and got == want, (c_type, op)
    for d in pair:
        assert_clean(d)


def test_reducing_a_half_buffer_is_refused_before_any_work(device):
    """guard: the built-in fold takes no half elements: an InputError that says what to
    declare, before any block, nothing left in use. (bool elements are counted since
    session 20: test_round11_tables.)"""
    opencl_c_only(device)
    half = """__kernel void c(__global const float *x, __global half *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) vstore_half(x[i], i, y);
    }"""
    with pytest.raises(InputError, match="cannot reduce elements of dtype"):
        cv.stream(compiled(device, half, "c"), [np.arange(10, dtype=np.float32)],
                  device=device, reduce="sum")
    assert_clean(device)


def test_callable_and_kernel_reductions_give_one_answer(device):
    """guard: an int32 sum (int64, exact), a float32 min with NaN in a later block and a
    uint8 max, each by a kernel and by a callable returning ``x.get().op()``: equal values."""
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")
    cases = [("int", _random_ints(np.int32, 2000, 7), "sum"),
             ("float", np.r_[np.arange(1500, dtype=np.float32), np.nan,
                             np.arange(499, dtype=np.float32)], "min"),
             ("uchar", _random_ints(np.uint8, 2000, 8), "max")]
    for c_type, x, op in cases:
        def partial(x, *, queue, offset, n, op=op):
            return getattr(x.get(), op)()

        by_kernel = cv.stream(compiled(device, COPY.format(T=c_type), "cp"), [x],
                              device=device, reduce=op, block_bytes=400 * x.itemsize).result
        by_callable = cv.stream(partial, [x], device=device, reduce=op,
                                block_bytes=300 * x.itemsize).result
        want = getattr(np, op)(x)
        if np.isnan(want):
            assert np.isnan(by_kernel) and np.isnan(by_callable)
        else:
            assert by_kernel == by_callable == want, c_type
    assert_clean(device)


def test_an_integer_sum_that_wraps_between_blocks_is_numpys_under_errstate_raise(device):
    """Three uint64 values of 2**63 + 5: np.sum wraps to 2**63 + 15 silently, even under
    ``np.errstate(over="raise")``; conveyor gives that in one block, and a FloatingPointError
    after the whole stream in blocks of one element (the host adds np.uint64 scalars)."""
    k = compiled(device, COPY.format(T="ulong"), "cp")
    x = np.full(3, 2**63 + 5, np.uint64)
    with np.errstate(over="raise"):
        want = np.sum(x)
        assert cv.stream(k, [x], device=device, reduce="sum").result == want
        got = cv.stream(k, [x], device=device, reduce="sum", block_bytes=8).result
    assert got == want and got.dtype == np.uint64
    assert_clean(device)


def test_a_callable_sum_of_float16_partials_is_np_sums(device):
    """2048 and then sixteen blocks of eight 0.125s: np.sum (float32 inside) gives 2064, and
    so does conveyor in blocks of 128 elements; in blocks of 8 each partial 1.0 is added to
    a float16 2048 and rounded away: 2048."""
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")

    def total(x, *, queue, offset, n):
        return x.get().sum()

    x = np.array([2048] + [0] * 7 + [0.125] * 120, np.float16)
    partials = np.array([x[i:i + 8].sum() for i in range(0, x.size, 8)])
    want = np.sum(partials)
    assert want == np.sum(x) == 2064
    assert cv.stream(total, [x], device=device, reduce="sum", block_bytes=256).result == want
    got = cv.stream(total, [x], device=device, reduce="sum", block_bytes=16).result
    assert got == want and np.asarray(got).dtype == np.float16
    assert_clean(device)


# -- scalar arguments at the edges of their C types -----------------------------------------

NAN_PAYLOAD = np.array([0x7FC00123], np.uint32).view(np.float32)[0]
SIGNALLING = np.array([0x7F800001], np.uint32).view(np.float32)[0]

ARRIVES = [  # (C type, dtype, value, what the kernel must receive)
    ("ulong", np.uint64, 2**64 - 1, 2**64 - 1),
    ("ulong", np.uint64, np.float64(2**63), 2**63),
    ("ulong", np.uint64, np.longdouble(2**64 - 1), 2**64 - 1),
    ("ulong", np.uint64, True, 1),
    ("long", np.int64, -(2**63), -(2**63)),
    ("long", np.int64, -9.223372036854775808e18, -(2**63)),
    ("char", np.int8, -128.9, -128),
    ("uchar", np.uint8, -0.9, 0),
    ("uint", np.uint32, np.float64(4294967295.0), 4294967295),
    ("int", np.int32, np.float32(-2147483648.0), -(2**31)),
    ("float", np.float32, NAN_PAYLOAD, NAN_PAYLOAD),
    ("float", np.float32, SIGNALLING, SIGNALLING),
    ("float", np.float32, -0.0, np.float32(-0.0)),
    ("float", np.float32, 1e-45, np.float32(1e-45)),
    ("float", np.float32, 3.4028235e38, np.float32(3.4028235e38)),
    ("double", np.float64, -0.0, -0.0),
    ("double", np.float64, 5e-324, 5e-324),
]
REFUSED = [
    ("ulong", 2**64), ("ulong", -1), ("ulong", 1.8446744073709552e19),
    ("long", 2**63), ("long", np.uint64(2**63)), ("long", 9.223372036854775807e18),
    ("char", np.uint8(255)), ("uchar", np.int8(-1)), ("uint", np.float32(4294967295.0)),
    ("int", np.float32(2147483647.0)), ("int", float("nan")), ("int", float("-inf")),
    ("float", 3.4028236e38), ("float", 2**128), ("double", 10**400),
    ("double", np.longdouble("1e400")),
]


def test_scalar_args_at_their_types_edges_arrive_exactly(device, request):
    """guard: bounds of each integer type, truncation toward zero, floats that round to an
    integer bound, NaN payloads (quiet and signalling), -0.0, subnormals and FLT_MAX arrive
    bit for bit."""
    _first_device_only(request)
    x = np.zeros(5, np.uint8)
    for c_type, dtype, value, want in ARRIVES:
        k = compiled(device, PUT.format(T=c_type), "put")
        out = cv.stream(k, [x], [dtype], device=device, args=(value,)).outputs[0]
        if device.backend == "cuda" and want is SIGNALLING:
            # The argument arrives whole; NVIDIA's kernel quiets a signalling NaN where it
            # stores it (the quiet bit set, the payload kept), as its float moves do.
            assert int(np.asarray(out[0]).view(np.uint32)) == 0x7FC00001, (c_type, out[0])
            continue
        assert _bits(out[0]) == _bits(dtype(want)), (c_type, value, out[0])
    assert_clean(device)


def test_scalar_args_past_their_types_edges_are_input_errors(device, request):
    """guard: one past each bound, a float that rounds past it (2**63 as a double), NaN/inf
    for integers and overflow to inf for floats: an InputError naming the type's range."""
    _first_device_only(request)
    x = np.zeros(5, np.uint8)
    for c_type, value in REFUSED:
        k = compiled(device, PUT.format(T=c_type), "put")
        dtype = dict(C_TYPES)[c_type]
        with pytest.raises(InputError, match="cannot be passed as kernel parameter 'v'"):
            cv.stream(k, [x], [dtype], device=device, args=(value,))
    assert_clean(device)


def test_a_date_or_duration_arg_is_taken_alike_whatever_its_unit(device):
    """np.timedelta64(5, "ns") and np.datetime64(5, "ns") for a ``long`` are passed as 5,
    while np.timedelta64(5, "s") or "us" and np.datetime64(5, "D") are refused ("a timedelta
    is not a number"): ``.item()`` gives an int for ns units only. Either every unit is
    refused or every one is its count; NaT is refused naming NaT, not "None"."""
    k = compiled(device, PUT.format(T="long"), "put")
    x = np.zeros(5, np.uint8)
    outcomes = []
    for value in (np.timedelta64(5, "ns"), np.datetime64(5, "ns"), np.timedelta64(5, "us"),
                  np.timedelta64(5, "s"), np.datetime64(5, "D")):
        try:
            out = cv.stream(k, [x], [np.int64], device=device, args=(value,)).outputs[0]
            outcomes.append(int(out[0]))
        except InputError:
            outcomes.append("refused")
    assert outcomes in (["refused"] * 5, [5] * 5), outcomes
    with pytest.raises(InputError) as caught:
        cv.stream(k, [x], [np.int64], device=device, args=(np.datetime64("NaT", "ns"),))
    assert "None" not in str(caught.value), str(caught.value)
    assert_clean(device)


# -- messages about record outputs -----------------------------------------------------------

def test_a_packed_record_output_is_not_told_to_convert_an_array(device):
    """A packed (NumPy default) record dtype for a struct output, as a dtype and as
    ``cv.per_block``: refused, but told to ``pass a.astype(np.dtype(..., align=True))`` and
    that the kernel would "read" each record: there is no array ``a`` (conveyor makes the
    output), and an array converted with astype is a copy the stream would write instead."""
    opencl_c_only(device)
    src = """typedef struct { ulong count; double total; char lo; } stat;
    __kernel void st(__global const double *x, __global stat *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) { y[i].count = i; y[i].total = x[i]; y[i].lo = 0; }
    }"""
    k = compiled(device, src, "st")
    packed = np.dtype([("count", "u8"), ("total", "f8"), ("lo", "i1")])
    x = np.zeros(10)
    messages = []
    for output in (packed, cv.per_block(1, packed)):
        with pytest.raises(InputError, match="align=True") as caught:
            cv.stream(k, [x], [output], device=device)
        messages.append(str(caught.value))
    assert all("np.dtype(" in m for m in messages), messages
    assert_clean(device)


def test_a_packed_record_output_is_told_which_dtype_to_ask_for(device):
    """The messages of the guard above, held to the right advice."""
    opencl_c_only(device)
    src = """typedef struct { ulong count; double total; char lo; } stat;
    __kernel void st(__global const double *x, __global stat *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) { y[i].count = i; y[i].total = x[i]; y[i].lo = 0; }
    }"""
    k = compiled(device, src, "st")
    packed = np.dtype([("count", "u8"), ("total", "f8"), ("lo", "i1")])
    for output in (packed, cv.per_block(1, packed)):
        with pytest.raises(InputError) as caught:
            cv.stream(k, [np.zeros(10)], [output], device=device)
        message = str(caught.value)
        assert "a.astype" not in message, message
        assert "read each record" not in message, message
    assert_clean(device)


# -- the command's --cast -------------------------------------------------------------------

@pytest.fixture
def cli(tmp_path):
    """A float32 copy kernel file and the first OpenCL device's spec."""
    opencl = [d for d in cv.devices() if d.backend == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL device")
    (tmp_path / "k.cl").write_text(COPY.format(T="float"))
    (tmp_path / "h.cl").write_text(
        """__kernel void cp(__global const half *x, __global half *y, ulong offset, ulong n) {
            ulong i = get_global_id(0);
            if (i < n) vstore_half(vload_half(i, x), i, y);
        }""")
    return tmp_path, opencl[0].spec


def _cli(argv, capsys) -> tuple[int, str]:
    from conveyor.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_cast_to_half_refuses_integers_past_its_range_and_writes_nothing(cli, capsys):
    """guard: ``--cast float16`` of int32 70000 (inf as a half) and of int64 65520 (rounds
    to inf) exits 2 naming the value and row, and writes no output; 65519 rounds to 65504
    and is taken."""
    tmp, spec = cli
    for dtype, big in ((np.int32, 70000), (np.int64, 65520)):
        np.save(tmp / "x.npy", np.array([1, 2, big, 3], dtype))
        code, err = _cli(["map", tmp / "h.cl", "--kernel", "cp", "--device", spec, "-q",
                          "-i", tmp / "x.npy", "-o", tmp / "y.npy", "--cast", "float16"], capsys)
        assert code == 2 and f"cannot hold {big} (row 2)" in err, err
        assert not (tmp / "y.npy").exists()
    np.save(tmp / "x.npy", np.array([1, 65519], np.int64))
    code, err = _cli(["map", tmp / "h.cl", "--kernel", "cp", "--device", spec, "-q",
                      "-i", tmp / "x.npy", "-o", tmp / "y.npy", "--cast", "float16"], capsys)
    assert code == 0, err
    assert np.load(tmp / "y.npy").tolist() == [1.0, 65504.0]


def test_the_command_tells_a_complex_input_what_the_command_can_do(cli, capsys):
    tmp, spec = cli
    np.save(tmp / "c.npy", np.arange(10).astype(np.complex64))
    code, err = _cli(["map", tmp / "k.cl", "--kernel", "cp", "--device", spec, "-q",
                      "-i", tmp / "c.npy", "-o", tmp / "y.npy"], capsys)
    assert code == 2, err
    assert "pass a.view" not in err, err


def test_cast_advice_for_a_complex_input_is_advice_the_command_takes(cli, capsys):
    """``--cast float32`` of a complex128 file says "cast to a complex type"; ``--cast
    complex64`` then says "complex64 is not a numeric dtype". Complex is numeric: either the
    cast is taken, or it is refused for what it is and the first advice does not offer it."""
    tmp, spec = cli
    np.save(tmp / "c.npy", np.arange(10).astype(np.complex128))
    base = ["map", tmp / "k.cl", "--kernel", "cp", "--device", spec, "-q",
            "-i", tmp / "c.npy", "-o", tmp / "y.npy"]
    code, first = _cli([*base, "--cast", "float32"], capsys)
    assert code == 2, first
    code, second = _cli([*base, "--cast", "complex64"], capsys)
    assert "not a numeric dtype" not in second, second
    assert "cast to a complex type" not in first or code != 2, (first, second)


def test_reduce_json_gives_nan_inf_and_uint64_results_as_strict_json(cli, capsys):
    """guard: ``conveyor reduce --json`` of a NaN min, an inf max, a uint64 max of 2**64 - 1
    and a -0.0 max: strict JSON (NaN and inf as strings, no bare NaN), the integer exact and
    the zero's sign kept."""
    import json

    tmp, spec = cli
    (tmp / "kd.cl").write_text(COPY.format(T="double") + "\n" + COPY.format(T="ulong")
                               .replace("void cp(", "void cpu("))
    cases = [("cp", np.array([np.nan, 1.0]), "min", "nan"),
             ("cp", np.array([np.inf, 1.0]), "max", "inf"),
             ("cpu", np.array([2**64 - 1, 5], np.uint64), "max", 2**64 - 1),
             ("cp", np.array([-0.0, -0.0]), "max", -0.0)]
    for name, x, op, want in cases:
        np.save(tmp / "x.npy", x)
        try:
            from conveyor.cli import main

            code = main(["reduce", str(tmp / "kd.cl"), "--kernel", name, "--device", spec,
                         "-i", str(tmp / "x.npy"), "--op", op, "--json"])
        except SystemExit as exc:
            code = exc.code
        out = capsys.readouterr().out
        assert code == 0, out

        def strict(constant):
            raise AssertionError(f"not strict JSON: {constant}")

        result = json.loads(out, parse_constant=strict)["result"]
        assert result == want and type(result) is type(want), (name, op, result)
        if want == 0.0:
            assert str(result) == "-0.0"
