"""Arguments of the wrong kind are InputErrors that say what to pass, raised before any work,
not a raw Python error from deep inside (found by trying the API as a careless user would)."""

from __future__ import annotations

import numpy as np
import pytest

import conveyor as cv

IDENT = cv.portable("""
__kernel void ident(__global const float *x, __global float *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) r[i] = x[i];
}
""")


def _noop(x, y, *, queue, offset, n):
    return None


@pytest.mark.parametrize("device_arg, match", [
    ([], r"device=\[\] names no device"),
    ((), r"device=\(\) names no device"),
    (0, r"device=0: pass a Device, a spec string"),
    ([None], r"device=None: pass a Device"),
])
def test_a_device_argument_that_names_nothing(device_arg, match):
    with pytest.raises(cv.InputError, match=match):
        cv.stream(_noop, [np.zeros(4, np.float32)], [np.float32], device=device_arg)


@pytest.mark.parametrize("source, name, options, match", [
    (IDENT.encode(), "ident", (), r"source as a str: decode it"),
    (None, "ident", (), "source as a str, got NoneType"),
    (IDENT, None, (), "name as a non-empty str"),
    (IDENT, "ident", "-DX=1 -DY=2", r"pass a list of options, e\.g\. \['-DX=1', '-DY=2'\]"),
    (IDENT, "ident", ["-DX=1", 3], r"every option is a str \(3 is not\)"),
    (IDENT, "ident", 5, "pass a list of strings"),
])
def test_compile_arguments_of_the_wrong_type(device, source, name, options, match):
    with pytest.raises(cv.InputError, match=match):
        device.compile(source, name, options)
    with pytest.raises(cv.InputError, match=match):
        device.compile(source, name, options, wait=False)


def test_a_dtype_name_as_an_output_says_to_pass_the_dtype(device):
    with pytest.raises(cv.InputError, match=r"pass the dtype itself \(np\.float32\)"):
        cv.stream(_noop, [np.zeros(4, np.float32)], ["float32"], device=device)


def test_a_ratio_too_large_to_allocate(device):
    with pytest.raises(cv.InputError, match=r"ratio=\(10+, 1\) would hold .* check the ratio"):
        cv.stream(_noop, [np.zeros(4, np.float32)], [cv.rows(np.float32, ratio=(10**30, 1))],
                  device=device)


def test_a_dtype_the_device_cannot_fold_says_what_to_do(device):
    half = cv.portable("""
    __kernel void h(__global const float *x, __global half *r, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) vstore_half(x[i], i, r);
    }""") if device.backend == "opencl" else None
    if half is None:
        pytest.skip("an OpenCL kernel")
    k = device.compile(half, "h")
    with pytest.raises(cv.InputError, match="float16 on the device .*reduce with a Python "
                                            "callable"):
        cv.stream(k, [np.ones(8, np.float32)], reduce="sum", device=device)


def test_a_datetime_input_is_not_told_to_declare_a_c_type(device):
    k = device.compile(IDENT, "ident")
    x = np.zeros(8, "datetime64[s]")
    with pytest.raises(cv.InputError) as caught:
        cv.stream(k, [x], [np.float32], device=device)
    assert "declare the parameter" not in str(caught.value)
    assert "astype(np.float32)" in str(caught.value)


@pytest.mark.parametrize("name", ["progress", "zero_copy", "strict", "warmup"])
@pytest.mark.parametrize("value", ["off", "no", 1, print])
def test_a_switch_takes_true_or_false_only(device, name, value):
    # bool() took "off" and a callback for True: a progress bar appeared, zero-copy went on.
    with pytest.raises(cv.InputError, match=f"{name}=.*: {name} takes True or False"):
        cv.stream(_noop, [np.zeros(4, np.float32)], [np.float32], device=device,
                  **{name: value})


@pytest.mark.parametrize("dtype", ["f4,(", ("f4", -1), "U4", "M8[s]", "V8"])
def test_raw_refuses_what_is_no_numeric_dtype(tmp_path, dtype):
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(64))
    with pytest.raises(cv.InputError, match="numeric dtype"):
        cv.raw(path, dtype)


def test_a_plot_path_without_a_suffix_gets_png(device, tmp_path):
    pytest.importorskip("matplotlib")
    report = cv.stream(_noop, [np.zeros(4096, np.float32)], [np.float32], device=device,
                       block_bytes=4096)
    report.timeline.plot(tmp_path / "chart")
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("value", ["99999999999999999999999999999GiB", 10**40, "1e31",
                                   "1000000000000000000000TiB"])
def test_a_size_past_any_memory_is_refused_in_every_form(value, monkeypatch):
    # "1e31" was refused but the same magnitude as an int or with a unit was taken.
    with pytest.raises(cv.InputError, match="larger than any memory"):
        cv.configure(pinned_budget=value)
    if isinstance(value, str):
        from conveyor.memory import keep

        monkeypatch.setenv("CONVEYOR_PINNED_BUDGET", value)
        monkeypatch.setattr(keep, "_budget", None)  # read the environment, not configure()'s
        with pytest.raises(cv.InputError, match="larger than any memory"):
            keep.budget()
