"""The bad input matrix: each case is an InputError that names the fix (asserted by a key
phrase) raised before anything is allocated, or the right result. Extends
tests/pipeline/test_stream_errors.py (which covers 1-D length mismatches, a wrong input dtype,
a strided output column, a read-only output, an object input, halo > block) without repeating
it; the > 2^31 elements case runs on a GPU only.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))
from streamkit import add_reference, data, kernel, stencil_reference  # noqa: E402

import conveyor as cv  # noqa: E402

N = 1000
ZERO_COPY = pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])


@contextlib.contextmanager
def no_allocation(device: cv.Device, monkeypatch: pytest.MonkeyPatch):
    """Asserts that no pool allocated or handed out anything inside the block."""
    pools = (device.memory_pool, device.pinned_pool)
    calls: list[int] = []
    for pool in pools:
        real = pool.allocate
        monkeypatch.setattr(pool, "allocate", lambda n, real=real: calls.append(n) or real(n))
    before = [pool.stats() for pool in pools]
    yield
    assert calls == []
    assert [pool.stats() for pool in pools] == before


def refuses(device, monkeypatch, phrase, compute, inputs, outputs=None, **kw) -> None:
    with no_allocation(device, monkeypatch), pytest.raises(cv.InputError, match=phrase):
        cv.stream(compute, inputs, outputs, device=device, **kw)


def vadd(device, a, b, c, **kw) -> None:
    cv.stream(kernel(device, "add", a.dtype), [a, b], [c], device=device, **kw)


# -- wrong dtypes --------
def test_output_of_the_wrong_dtype(device, monkeypatch):
    a, b = data((N,), np.float32, 1), data((N,), np.float32, 2)
    refuses(device, monkeypatch, r"output 0 has dtype float64: pass an array of float32",
            kernel(device, "add"), [a, b], [np.zeros(N, np.float64)])


def test_second_input_of_a_wider_dtype(device, monkeypatch):
    a, b = data((N,), np.float32, 1), data((N,), np.float64, 2)
    refuses(device, monkeypatch, r"input 1 has dtype float64: pass an array of float32 "
            r"\(e\.g\. a\.astype\(np\.float32\)\)", kernel(device, "add"), [a, b],
            [np.zeros(N, np.float32)])


def test_unsigned_input_for_a_signed_kernel(device, monkeypatch):
    x = np.arange(N, dtype=np.uint32)
    refuses(device, monkeypatch, "pass an array of int32", kernel(device, "ident", np.int32),
            [x], [np.zeros(N, np.int32)])


def test_string_input_for_a_numeric_kernel(device, monkeypatch):
    x = np.array(["a", "b", "c"] * 10)
    refuses(device, monkeypatch, "pass an array of float32", kernel(device, "ident"), [x],
            [np.zeros(30, np.float32)])


# -- non-contiguous inputs are staged; non-contiguous outputs are refused
NON_CONTIGUOUS = {
    "every-other": lambda x: x[::2],
    "reversed": lambda x: x[::-1],
    "column-of-2d": lambda x: x.reshape(-1, 2)[:, 1],
}


@ZERO_COPY
@pytest.mark.parametrize("view", list(NON_CONTIGUOUS), ids=list(NON_CONTIGUOUS))
def test_non_contiguous_1d_inputs_are_staged(device, zero_copy, view):
    a = NON_CONTIGUOUS[view](data((4 * N,), np.float32, 1))
    b = NON_CONTIGUOUS[view](data((4 * N,), np.float32, 2))
    assert not a.flags.c_contiguous
    c = np.zeros(a.shape, np.float32)
    vadd(device, a, b, c, block_bytes=4 * 300, zero_copy=zero_copy)
    np.testing.assert_array_equal(c, add_reference(np.ascontiguousarray(a),
                                                   np.ascontiguousarray(b)))


@ZERO_COPY
def test_fortran_ordered_2d_input_is_staged(device, zero_copy):
    x = np.asfortranarray(data((N, 3), np.float32, 3))
    assert not x.flags.c_contiguous
    y = np.zeros((N, 3), np.float32)
    cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(3, 0),
              block_bytes=3 * 4 * 128, zero_copy=zero_copy)
    np.testing.assert_array_equal(y, x)


def test_strided_input_with_a_halo_is_staged(device):
    x = data((3 * N, 3), np.float32, 4)[::3]
    y = np.zeros((N, 3), np.float32)
    cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(3, 2), halo=2,
              block_bytes=3 * 4 * 100)
    np.testing.assert_array_equal(y, stencil_reference(np.ascontiguousarray(x), 2))


@pytest.mark.parametrize(
    "make",
    [lambda: np.zeros((N, 3), np.float32, order="F"), lambda: np.zeros((N, 3), np.float32)[::-1]],
    ids=["fortran", "reversed"],
)
def test_non_contiguous_2d_output_is_refused(device, monkeypatch, make):
    x = data((N, 3), np.float32, 5)
    refuses(device, monkeypatch, r"not C-contiguous: pass np\.empty\(shape, dtype\)",
            kernel(device, "sten"), [x], [make()], args=(3, 0))


# -- read-only outputs ----------------------------------------------------------------------------
def test_broadcast_output_is_refused(device, monkeypatch):
    a, b = data((N,), np.float32, 1), data((N,), np.float32, 2)
    c = np.broadcast_to(np.zeros(1, np.float32), (N,))
    refuses(device, monkeypatch, "read-only: pass a writable array", kernel(device, "add"),
            [a, b], [c])


def test_read_only_memmap_output_is_refused(device, monkeypatch, tmp_path):
    a, b = data((N,), np.float32, 1), data((N,), np.float32, 2)
    path = tmp_path / "c.bin"
    np.zeros(N, np.float32).tofile(path)
    c = np.memmap(path, np.float32, mode="r", shape=(N,))
    refuses(device, monkeypatch, "read-only: pass a writable array", kernel(device, "add"),
            [a, b], [c])


def test_writable_memmap_output_gets_the_result(device, tmp_path):
    a, b = data((N,), np.float32, 1), data((N,), np.float32, 2)
    c = np.memmap(tmp_path / "c.bin", np.float32, mode="w+", shape=(N,))
    vadd(device, a, b, c, block_bytes=4 * 128)
    c.flush()
    np.testing.assert_array_equal(np.fromfile(tmp_path / "c.bin", np.float32),
                                  add_reference(a, b))


# -- mismatched lengths --------
def test_output_shorter_than_the_inputs(device, monkeypatch):
    a, b = data((N,), np.float32, 1), data((N,), np.float32, 2)
    refuses(device, monkeypatch, "disagree in length along axis 0: input 0 has 1000 rows, "
            "output 0 has 999", kernel(device, "add"), [a, b], [np.zeros(N - 1, np.float32)])


def test_2d_inputs_with_different_rows(device, monkeypatch):
    x, y = data((N, 3), np.float32, 1), data((N + 1, 3), np.float32, 2)
    refuses(device, monkeypatch, "disagree in length", kernel(device, "add"), [x, y],
            [np.zeros((N, 3), np.float32)])


def test_empty_input_beside_a_full_one(device, monkeypatch):
    a = data((N,), np.float32, 1)
    refuses(device, monkeypatch, "disagree in length", kernel(device, "add"),
            [a, np.zeros(0, np.float32)], [np.zeros(N, np.float32)])


# -- zero-length: not an error, nothing runs ------------------------------------------------------
@ZERO_COPY
def test_zero_length_kernel_map_allocates_nothing(device, monkeypatch, zero_copy):
    a = b = np.zeros(0, np.float32)
    c = np.zeros(0, np.float32)
    with no_allocation(device, monkeypatch):
        report = cv.stream(kernel(device, "add"), [a, b], [c], device=device,
                           zero_copy=zero_copy)
    assert report.blocks == 0 and report.outputs == [c]


def test_zero_length_stencil_with_a_halo_allocates_nothing(device, monkeypatch):
    x = np.zeros((0, 3), np.float32)
    with no_allocation(device, monkeypatch):
        report = cv.stream(kernel(device, "sten"), [x], [np.float32], device=device,
                           args=(3, 2), halo=2)
    assert report.blocks == 0 and report.outputs[0].shape == (0, 3)


@ZERO_COPY
def test_rows_of_no_elements_run_nothing(device, monkeypatch, zero_copy):
    # Found in review: shape (5, 0) reached the driver as a 0-byte buffer (BackendError on the
    # zero-copy path, "cannot allocate 0 bytes" on the copying one).
    a = b = np.zeros((5, 0), np.float32)
    c = np.zeros((5, 0), np.float32)
    with no_allocation(device, monkeypatch):
        report = cv.stream(kernel(device, "add"), [a, b], [c], device=device,
                           zero_copy=zero_copy)
    assert report.blocks == 0 and report.outputs == [c]


def test_zero_length_npy_file_gives_an_empty_npy_file(device, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((0, 3), np.float32))
    report = cv.stream(kernel(device, "sten"), [str(tmp_path / "x.npy")],
                       [str(tmp_path / "y.npy")], device=device, args=(3, 0))
    assert report.blocks == 0
    y = np.load(tmp_path / "y.npy")
    assert y.shape == (0, 3) and y.dtype == np.float32


# -- halo against the block --------
def test_halo_more_than_a_2d_block_is_refused(device, monkeypatch):
    x = data((N, 3), np.float32, 6)
    refuses(device, monkeypatch, r"halo=5 rows is more than a block \(4 rows\): use a larger "
            r"block_bytes", kernel(device, "sten"), [x], [np.zeros_like(x)], args=(3, 5),
            halo=5, block_bytes=3 * 4 * 4)


def test_halo_equal_to_a_block_works(device):
    # Halo rows are read from the source, not from the neighbouring slots, so a halo as long
    # as the block is fine; only a longer one is refused.
    x = data((N, 3), np.float32, 7)
    y = np.zeros_like(x)
    cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(3, 3), halo=3,
              block_bytes=3 * 4 * 3)
    np.testing.assert_array_equal(y, stencil_reference(x, 3))


@pytest.mark.parametrize("pinned", [False, True], ids=["staged", "pinned"])
def test_halo_longer_than_the_array_copies_each_end_once(device, monkeypatch, pinned):
    # Issue 13 item 5: pad rows were copied one at a time, 2 * halo copies per stream (227 s
    # for a large halo). Now one copy per end, and the answer is unchanged.
    from conveyor.pipeline import halo as engine

    x = data((10, 3), np.float32, 9)
    y = np.zeros_like(x)
    copies: list[int] = []  # host copies of rows on the engine's side
    real = engine.copy_rows
    monkeypatch.setattr(engine, "copy_rows", lambda d, s: copies.append(1) or real(d, s))
    copy_ins: list[int] = []  # device copies
    probe = device.create_queue()
    queue_type = type(probe)
    probe.close()
    real_copy_in = queue_type.copy_in
    monkeypatch.setattr(queue_type, "copy_in", lambda q, *a, **k: copy_ins.append(1)
                        or real_copy_in(q, *a, **k))
    source = cv.pinned.asarray(x, device=device) if pinned else x
    cv.stream(kernel(device, "sten"), [source], [y], device=device, args=(3, 40), halo=40,
              zero_copy=False)
    np.testing.assert_array_equal(y, stencil_reference(x, 40))
    if pinned:
        assert (len(copy_ins), len(copies)) == (3, 2)  # pads made once per end; 3 copies
    else:
        assert (len(copy_ins), len(copies)) == (1, 2)  # one edge row each end, repeated


def test_negative_halo_is_refused(device, monkeypatch):
    x = data((N,), np.float32, 8)
    refuses(device, monkeypatch, "halo must be 0 or more rows", kernel(device, "sten"), [x],
            [np.zeros_like(x)], args=(1, 0), halo=-1)


# -- NaN and Inf pass through untouched --------
SPECIAL_BITS = {
    np.float32: [0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7FFFFFFF, 0x7FA00000, 0x7F800001,
                 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x807FFFFF, 0x3F800000],
    np.float64: [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000001,
                 0x7FF4000000000000, 0x7FF0000000000001, 0x7FF0000000000000,
                 0xFFF0000000000000, 0x8000000000000000, 0x0000000000000001],
}  # quiet and signalling NaNs with payloads, both signs; +-Inf; -0.0; subnormals; 1.0


@ZERO_COPY
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_nan_and_inf_pass_through_an_identity_kernel_bit_exact(device, zero_copy, dtype):
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    special = np.array(SPECIAL_BITS[dtype], bits)
    x = np.resize(special, 3 * N).view(dtype)
    y = np.zeros_like(x)
    cv.stream(kernel(device, "ident", dtype), [x], [y], device=device,
              block_bytes=x.itemsize * 257, zero_copy=zero_copy)
    np.testing.assert_array_equal(y.view(bits), x.view(bits), strict=True)


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_nan_payloads_survive_staging_and_a_halo(device, pinned):
    special = np.array(SPECIAL_BITS[np.float32], np.uint32)
    x = np.resize(special, (N, 3)).view(np.float32)
    if pinned:
        x = cv.pinned.asarray(x, device=device)
    y = np.zeros((N, 3), np.float32)
    # sten with args (cols, 0) and halo=2 copies buffer element i, which is row i - 2 of the
    # block (halo rows first): the output is the input moved down two rows, edge repeated.
    cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(3, 0), halo=2,
              block_bytes=3 * 4 * 64)
    moved = np.pad(np.asarray(x).view(np.uint32), ((2, 0), (0, 0)), mode="edge")[:N]
    np.testing.assert_array_equal(y.view(np.uint32), moved, strict=True)


# -- object and 0-d arrays --------------------------------------------------------------------
def test_object_array_output_is_refused(device, monkeypatch):
    x = data((N,), np.float32, 9)
    refuses(device, monkeypatch, "use a numeric dtype", lambda *a, **k: None, [x],
            [np.empty(N, object)])


def test_object_dtype_output_is_refused(device, monkeypatch):
    x = data((N,), np.float32, 9)
    refuses(device, monkeypatch, "numeric dtype", lambda *a, **k: None, [x], [object])


def test_object_array_input_to_a_kernel_is_refused(device, monkeypatch):
    x = np.array([1.0, None] * 10, dtype=object)
    refuses(device, monkeypatch, "convert it to a numeric dtype", kernel(device, "ident"),
            [x], [np.zeros(20, np.float32)])


def test_0d_input_is_refused(device, monkeypatch):
    refuses(device, monkeypatch, "is a scalar: pass scalars in args=", kernel(device, "ident"),
            [np.array(1.0, np.float32)], [np.zeros(1, np.float32)])


def test_python_scalar_input_is_refused(device, monkeypatch):
    refuses(device, monkeypatch, "is a scalar: pass scalars in args=", lambda *a, **k: None,
            [3.5])


def test_0d_output_is_refused(device, monkeypatch):
    x = data((1,), np.float32, 10)
    refuses(device, monkeypatch, "is a scalar: outputs must be arrays", kernel(device, "ident"),
            [x], [np.array(0.0, np.float32)])


# -- wrong-typed parameters (issue 13, item 11) ---------------------------------------------
# Each was a raw TypeError/AttributeError/ValueError (block_bytes=4096.0: "'float' object has no
# attribute 'bit_length'"), or worse: a bare array as inputs= streamed each row as an input.
WRONG_TYPES = {
    "depth-str": ({"depth": "3"}, r"depth='3' \(a str\) is not a whole number: depth takes "
                                  r"an int of 1 or more"),
    "depth-fraction": ({"depth": 2.5}, r"depth=2\.5 is not a whole number"),
    "depth-bool": ({"depth": True}, r"depth=True is not a whole number"),
    "depth-zero-float": ({"depth": 0.0}, r"depth must be at least 1, got 0\.0"),
    "block-bytes-fraction": ({"block_bytes": 4096.5},
                             r"block_bytes=4096\.5 is not a whole number of bytes: "
                             r"block_bytes takes None, bytes as an int, or a string like"),
    "block-bytes-word": ({"block_bytes": "lots"}, r"block_bytes='lots' is not a size"),
    "halo-fraction": ({"halo": 2.5}, r"halo=2\.5 is not a whole number: halo takes an int"),
    "workers-negative": ({"workers": -1}, r"workers must be at least 1, got -1: workers takes "
                                          r"None"),
    "workers-zero": ({"workers": 0}, r"workers must be at least 1, got 0"),
    "workers-str": ({"workers": "2"}, r"workers='2' \(a str\) is not a whole number"),
    "memory-limit-bare-g": ({"memory_limit": "1G"},
                            r"memory_limit='1G' is not a size: use bytes as an int, or a "
                            r"string like '512MiB'"),
    "memory-limit-list": ({"memory_limit": [2**30]},
                          r"memory_limit=\[1073741824\] \(a list\) is not a whole number"),
    "memory-limit-nan": ({"memory_limit": float("nan")}, r"memory_limit=nan is not a whole"),
    "args-object": ({"args": object()}, r"args=<object.*\(a object\): args takes a tuple"),
}


@pytest.mark.parametrize(("options", "phrase"), WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_wrong_typed_parameters_are_input_errors_naming_them(device, monkeypatch, options,
                                                             phrase):
    a, b = data((N,), np.float32, 1), data((N,), np.float32, 2)
    refuses(device, monkeypatch, phrase, kernel(device, "add"), [a, b],
            [np.zeros(N, np.float32)], **options)


def test_inputs_none_is_an_input_error(device, monkeypatch):
    refuses(device, monkeypatch, r"inputs=None: inputs takes a list of arrays",
            kernel(device, "ident"), None, [np.zeros(N, np.float32)])


UNAMBIGUOUS = {
    "integral-floats": {"depth": 3.0, "block_bytes": 4096.0, "halo": 0.0, "workers": 2.0},
    "numpy-ints": {"depth": np.int64(2), "block_bytes": np.uint32(4096), "workers": np.int8(1)},
    "exponent-float": {"block_bytes": 1e5},
    "size-strings": {"block_bytes": "4KiB", "memory_limit": "1GiB"},
    "size-string-decimal": {"block_bytes": "4.096 kB"},
}


@pytest.mark.parametrize("options", UNAMBIGUOUS.values(), ids=UNAMBIGUOUS.keys())
def test_unambiguous_forms_are_accepted(device, options):
    a, b = data((N * 30,), np.float32, 1), data((N * 30,), np.float32, 2)
    c = np.zeros_like(a)
    report = cv.stream(kernel(device, "add"), [a, b], [c], device=device, **options)
    np.testing.assert_array_equal(c, add_reference(a, b))
    block_bytes = options.get("block_bytes")
    if block_bytes is not None:
        expected = {"4KiB": 4096, "4.096 kB": 4096}.get(block_bytes, block_bytes)
        assert report.block_rows == int(expected) // 4


def test_a_bare_input_array_and_output_dtype_are_one_element_lists(device):
    x = data((N,), np.float32, 3)
    report = cv.stream(kernel(device, "ident"), x, np.float32, device=device)
    assert len(report.outputs) == 1
    np.testing.assert_array_equal(report.outputs[0], x)


def test_a_bare_output_array_and_path_input_are_one_element_lists(device, tmp_path):
    x = data((N, 3), np.float32, 4)
    np.save(tmp_path / "x.npy", x)
    y = np.zeros_like(x)
    cv.stream(kernel(device, "ident"), str(tmp_path / "x.npy"), y, device=device)
    np.testing.assert_array_equal(y, x)


def test_a_bare_scalar_args_is_one_argument(device):
    x = data((N,), np.float32, 5)
    y = np.zeros_like(x)
    cv.stream(kernel(device, "scale"), [x], [y], device=device, args=2.0)
    np.testing.assert_array_equal(y, x * np.float32(2.0))


# -- more than 2^31 elements (GPU) --------
@pytest.mark.gpu
@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_more_than_2_to_the_31_elements(gpu_device, pinned):
    n = 2**31 + 1000
    pattern = np.arange(251, dtype=np.uint8)  # never 255: the output's fill value
    if pinned:
        x = cv.pinned.empty((n,), np.uint8, device=gpu_device)
        y = cv.pinned.empty((n,), np.uint8, device=gpu_device)
        x[:] = np.resize(pattern, n)
        y[:] = 255
    else:
        x = np.resize(pattern, n)
        y = np.full(n, 255, np.uint8)
    report = cv.stream(kernel(gpu_device, "ident", np.uint8), [x], [y], device=gpu_device,
                       block_bytes=64 * 2**20)
    assert report.blocks == -(-n // report.block_rows)
    rng = np.random.default_rng(31)
    sample = np.concatenate([rng.integers(0, n, 100_000), np.arange(n - 2000, n),
                             np.arange(2**31 - 1000, 2**31 + 1000), np.arange(1000)])
    np.testing.assert_array_equal(y[sample], x[sample])
    np.testing.assert_array_equal(y[sample], sample % 251)


# -- found in review (issue 12/13 follow-up) ---------------------------------------------------
def test_a_big_endian_input_to_a_kernel_says_how_to_swap_it(device, monkeypatch):
    a = data((N,), np.float32, 1)
    refuses(device, monkeypatch, r"byte order.*newbyteorder\('='\)", kernel(device, "add"),
            [a.astype(">f4"), a], [np.zeros(N, np.float32)])


def test_a_generator_of_inputs_is_refused_with_what_to_pass(device, monkeypatch):
    a = data((N,), np.float32, 1)
    refuses(device, monkeypatch, r"not a generator: pass list", kernel(device, "add"),
            (x for x in [a, a]), [np.zeros(N, np.float32)])


def test_an_output_that_is_none_is_refused(device, monkeypatch):
    a = data((N,), np.float32, 1)
    refuses(device, monkeypatch, r"output 0 is None", kernel(device, "add"), [a, a], [None])


def test_a_vector_typedef_pointer_names_its_element_type(device, monkeypatch):
    source = ("typedef float4 V;\n__kernel void v(__global const float *a, "
                      "__global V *y, ulong offset, ulong n) {}")
    if device.backend == "cuda":
        pytest.skip("OpenCL vector types")
    refuses(device, monkeypatch, r"declare it as float\* and load 4 lanes",
            device.compile(source, "v"), [data((N,), np.float32, 1)], [np.zeros(N, np.float32)])
