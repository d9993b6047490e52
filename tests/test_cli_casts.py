"""``--cast`` refuses a value the type it names cannot hold: NumPy's cast wrapped it silently
(300 to int8 was 44, -129 to uint32 4294967167), made NaN and inf INT_MIN with a raw
RuntimeWarning, and a float64 past float32's range inf, all with exit 0. Now an InputError
(exit 2, one line) names the input, the cast, the value and its row; the check runs block by
block, so it may fail mid-stream, but no output (nor its ``.part``) is left and an existing
one is untouched. A float's fraction is truncated toward zero, as documented (and as ``--arg``
does). The rules are checked on :class:`CastSource` directly (no device), the command end to
end on each device."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from conveyor.cli import main
from conveyor.cli.inputs import CastSource
from conveyor.errors import InputError
from conveyor.kernels.portable import PRELUDE
from conveyor.pipeline.io import ArraySource

NAN, INF = float("nan"), float("inf")

# --- the rules, on a CastSource over an array ---------------------------------------------

#: (source values and dtype, --cast dtype, the first value refused and its row).
REFUSED = [
    ([1, 127, 128, 300, -129, 70000], "int32", "int8", "128", 2),
    ([1, 2, -129], "int32", "uint32", "-129", 2),
    ([0.5, NAN, 1.0], "float64", "int32", "nan", 1),
    ([1.0, -INF], "float64", "int32", "-inf", 1),
    ([1.0, 1e10], "float64", "int32", "10000000000.0", 1),
    ([1.0, -128.5, -129.0], "float64", "int8", "-129.0", 2),  # -128.5 truncates to -128
    ([0, 1, 2], "int32", "bool", "2", 2),
    ([1.0, 1e300], "float64", "float32", "1e+300", 1),
    ([1.0, 3.5e38], "float64", "float32", "3.5e+38", 1),
    ([1, 70000], "int32", "float16", "70000", 1),
    ([0, -1], "int64", "uint64", "-1", 1),
    ([0, 2**63], "uint64", "int64", "9223372036854775808", 1),
    ([0.0, 2.0**63], "float64", "int64", "9.223372036854776e+18", 1),
]


@pytest.mark.filterwarnings("error")  # NumPy's "invalid value encountered in cast" included
@pytest.mark.parametrize(("values", "source", "cast", "shown", "row"), REFUSED,
                         ids=[f"{r[1]}-{r[2]}-{r[3]}" for r in REFUSED])
def test_a_value_the_type_cannot_hold_is_refused(values, source, cast, shown, row):
    cast_source = CastSource(ArraySource(np.array(values, source)), np.dtype(cast),
                             f"-i v.npy: --cast {cast}")
    with pytest.raises(InputError) as caught:
        cast_source.rows(0, len(values))
    message = str(caught.value)
    assert message.startswith(f"-i v.npy: --cast {cast} cannot hold {shown} (row {row}): "), \
        message
    if np.dtype(source).kind == "f" and np.dtype(cast).kind in "iu" and shown[-1].isdigit():
        assert "a fraction is truncated toward zero" in message


@pytest.mark.filterwarnings("error")
def test_values_the_type_holds_pass_and_fractions_truncate():
    cases = [
        (np.array([NAN, INF, -INF, 3.4028234e38, 1e-300]), "float32"),  # NaN and inf held
        (np.array([1.7, -2.9, -0.5, 127.9, -128.9]), "int8"),
        (np.array([-(2.0**63), 2.0**63 - 1024]), "int64"),  # the exact int64 bounds
        (np.array([-0.9, 255.5]), "uint8"),
        (np.array([-128, 127], np.int64), "int8"),
        (np.array([0.0, 1.0, 0.0]), "bool"),
        (np.array([2**64 - 1], np.uint64), "float32"),
    ]
    for values, cast in cases:
        got = CastSource(ArraySource(values), np.dtype(cast)).rows(0, len(values))
        assert got.dtype == np.dtype(cast)
        with np.errstate(all="ignore"):
            assert np.array_equal(got, np.trunc(values).astype(cast), equal_nan=True), cast


def test_the_row_counts_from_the_block_and_across_rows_of_several_values():
    # Rows of 3 values; the block starts at row 10 of the input; the bad value is the third
    # of the input's row 66_010, past the first of the slices the check walks (65_536 values).
    values = np.zeros((70_000, 3), np.int32)
    values[66_010, 2] = 1000
    cast_source = CastSource(ArraySource(values), np.dtype("int8"), "-i m.npy: --cast int8")
    with pytest.raises(InputError, match=r"^-i m.npy: --cast int8 cannot hold 1000 "
                                         r"\(row 66010\): int8 holds -128 to 127"):
        cast_source.rows(10, 70_000)


# --- the command, end to end --------------------------------------------------------------

KERNELS = PRELUDE + """
__kernel void addc(__global const char *x, __global char *y, char a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + a;
}
__kernel void copyi(__global const int *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}
__kernel void copyf(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}
"""


def _conveyor(device, tmp: Path, kernel: str, data: np.ndarray, cast: str, *extra: str
              ) -> int:
    source = tmp / ("k.cu" if device.backend == "cuda" else "k.cl")
    source.write_text(KERNELS)
    np.save(tmp / "in.npy", data)
    argv = ["map", str(source), "--kernel", kernel, "-i", str(tmp / "in.npy"), "--cast", cast,
            "-o", str(tmp / "out.npy"), "--device", device.spec, "--no-progress", *extra]
    with warnings.catch_warnings():
        # NumPy's raw RuntimeWarning is a failure too; a driver's compiler notes are not
        # (NVIDIA's OpenCL warns that a kernel overrides noinline: PyOpenCL's CompilerWarning).
        warnings.simplefilter("error", RuntimeWarning)
        return main(argv)


def test_the_testers_int8_case_exits_2_naming_input_cast_value_and_row(device, tmp_path,
                                                                        capsys):
    data = np.array([1, 127, 128, 300, -129, 70000], np.int32)
    code = _conveyor(device, tmp_path, "addc", data, "int8", "--arg", "0")
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"conveyor map: -i {tmp_path / 'in.npy'}: --cast int8 cannot hold 128 (row 2): int8 "
        f"holds -128 to 127: cast to a type that holds it, or fix the data"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npy", "k.cl" if
                                                          device.backend != "cuda" else "k.cu"]


@pytest.mark.parametrize(("kernel", "data", "cast", "shown"), [
    ("copyi", np.array([1.5, NAN, 1e10]), "x:int32", "nan"),
    ("copyi", np.array([1.5, INF]), "int32", "inf"),
    ("copyf", np.array([1.0, -1e300]), "float32", "-1e+300"),
], ids=["nan-int32", "inf-int32", "big-float32"])
def test_bad_values_fail_mid_stream_and_leave_the_old_output(device, tmp_path, capsys, kernel,
                                                             data, cast, shown):
    # The bad value is in the last block, so the blocks before it were written to the part.
    full = np.concatenate([np.ones(20_000), data])
    np.save(tmp_path / "out.npy", np.arange(3))  # replaced only by a run that succeeds
    code = _conveyor(device, tmp_path, kernel, full, cast, "--block-bytes", "16KiB", "--force")
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--cast {cast} cannot hold {shown} (row 20001): " in err, err
    assert "RuntimeWarning" not in err and len(err.strip().splitlines()) == 1, err
    assert np.array_equal(np.load(tmp_path / "out.npy"), np.arange(3))
    assert not list(tmp_path.glob(".out.npy.*")), list(tmp_path.iterdir())


def test_a_cast_that_fits_streams_and_truncates_fractions(device, tmp_path, capsys):
    data = np.array([1.7, -2.9, -0.5, 2147483647.9, -2147483648.9] * 5000)
    code = _conveyor(device, tmp_path, "copyi", data, "int32", "--block-bytes", "16KiB", "-q")
    assert code == 0, capsys.readouterr().err
    assert np.array_equal(np.load(tmp_path / "out.npy"), np.trunc(data).astype(np.int32))


@pytest.mark.parametrize("cast", ["int32", "float32", "bool"])
def test_complex_inputs_have_no_real_cast(cast):
    with pytest.raises(InputError, match=f"-i v.npy: --cast {cast}: the input holds complex "
                                         f"complex64 values, which have no {cast} value"):
        CastSource(ArraySource(np.array([1 + 2j], np.complex64)), np.dtype(cast),
                   f"-i v.npy: --cast {cast}")
