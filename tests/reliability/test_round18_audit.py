"""Round eighteen, helper C: an audit of the source for the patterns behind round seventeen's
bugs (flags taken with ``bool()``, NumPy parsing user values unguarded, ``float()`` and
``Path.is_file()`` on user values, an ``except`` tuple that misses one reader's error, a
wrapper that hides what a check looks for, a relative path kept past ``os.chdir``), and of
twin paths (one device against several, the 1.0/2.0 ``.npy`` reader against the 3.0 one,
``cv.iterate`` against ``cv.resident``), each confirmed by running the real code.

Found (strict xfails, each asserting the right behaviour):

- **Wrong answer**: a bool file input (``cv.npy``) streamed in place (its memory map as the
  output) with a halo over two devices is not refused, as the same float file and a bool
  array are: ``multi._several`` wraps the bool file in ``io.BoolChecked`` before
  ``multi.run`` looks for in-place pairs, and ``overlap._region`` sees no file behind the
  wrapper. The devices then read halo rows the other one already overwrote.
- **Wrong file read**: ``report.outputs`` of a ``cv.npy_out("y.npy")`` made before an
  ``os.chdir`` names ``"y.npy"``, relative, while the file was written in the first folder:
  ``np.load(report.outputs[0])`` reads the other folder's older ``y.npy``.
- **Stale kernel**: a header with a non-UTF-8 name (``"\\xe9.h"``, Latin-1) included from a
  header is left out of the cache key (``kernels/includes.py`` decodes the name with
  ``errors="replace"`` and looks for ``"\\ufffd.h"``): after an edit to it ``dev.compile``
  returns the kernel of its old text, from the memo and the disk cache.
- **Stale kernel**: ``#include <k.h>`` inside a header is looked up beside that header
  first (as only a quoted include is): with ``-Iconfig -Idefaults`` and a ``k.h`` in both,
  the compiler reads ``config/k.h`` and the key hashes ``defaults/k.h``, so an edit to
  ``config/k.h`` returns the old kernel.
- ``cv.pinned.empty(..., svm="no")`` (and ``svm=0``) allocates shared virtual memory:
  ``if svm`` (on a device without fine-grained SVM, "no" is a BackendError).
- A ``.npy`` 3.0 header whose ``descr`` is no dtype (``5``) is a raw TypeError (the 1.0/2.0
  readers give NumPy's ValueError, turned into "is not a .npy file"); the command prints a
  traceback.
- ``#include "<300 characters>.h"`` (or a ``-I`` folder with such a name) in a kernel source:
  ``dev.compile`` raises a raw ``OSError: [Errno 36] File name too long`` from
  ``Path.is_file()`` while it computes the cache key.
- Dtypes parsed with NumPy and only some of its errors caught: ``cv.rows``/``cv.per_block``
  (SyntaxError for ``"f4,("``, ValueError for ``("f4", -1)``), a chain temp ``"f4,("``
  (SyntaxError), ``outputs=["f4,("]`` (SyntaxError) and ``outputs=[("f4", -1)]``
  (ValueError), ``cv.pinned.empty(10, "nonsense")`` (TypeError).
- ``depth=``, ``block_bytes=``, ``halo=`` given a Fraction past float64 (``Fraction(10**400)``)
  are a raw OverflowError from ``float()``.
- ``cv.resident([[1], [1, 2]])`` (a ragged list) is NumPy's raw ValueError, where
  ``cv.iterate`` names the chunk.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import os
import struct
import sys
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,  # noqa: E402
)

import conveyor as cv  # noqa: E402
from conveyor.errors import BackendError, InputError  # noqa: E402

BXOR = """__kernel void bxor(__global const bool *x, __global bool *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] != x[i + 2];
}
"""


def _edge_halo_reference(x: np.ndarray, op) -> np.ndarray:
    padded = np.pad(x, 1, mode="edge")
    return op(padded[:-2], padded[2:])


# -- one device against several: a wrapper that hides the file behind it --------------------
def test_bool_file_in_place_with_a_halo_over_two_devices_is_refused(pair, tmp_path):
    """A bool ``.npy`` input whose memory map is the output, halo=1, on two devices: refused
    as the float file is (next test) and as a bool array is. It ran, and one run left an
    element wrong (which one depends on the devices' timing): the bool file was wrapped in
    ``io.BoolChecked`` (validate.guard_bools, multi._several) before multi.run looked for
    in-place pairs, and ``overlap._region`` returns None for the wrapper."""
    first, second = pair
    k = first.compile(BXOR, "bxor")
    base = np.random.default_rng(3).integers(0, 2, 4096).astype(bool)
    path = tmp_path / "b.npy"
    np.save(path, base)
    mapped = np.load(path, mmap_mode="r+")
    with pytest.raises(InputError, match="several devices"):
        cv.stream(k, [cv.npy(path)], [mapped], halo=1, device=[first, second],
                  block_bytes=256)
    del mapped
    np.testing.assert_array_equal(np.load(path), base)  # refused before any row was written


def test_bool_array_and_float_file_in_place_with_a_halo_over_two_devices_are_refused(
        pair, tmp_path):
    """guard: the twins of the case above (an array; a float file, which no wrapper hides)
    are refused before any work."""
    first, second = pair
    x = np.random.default_rng(4).integers(0, 2, 4096).astype(bool)
    with pytest.raises(InputError, match="several devices"):
        cv.stream(first.compile(BXOR, "bxor"), [x], [x], halo=1, device=[first, second],
                  block_bytes=256)
    path = tmp_path / "f.npy"
    values = np.arange(4096, dtype=np.float32)
    np.save(path, values)
    mapped = np.load(path, mmap_mode="r+")
    with pytest.raises(InputError, match="several devices"):
        cv.stream(kernel(first, "sten"), [cv.npy(path)], [mapped], args=(1, 1), halo=1,
                  device=[first, second], block_bytes=256)
    del mapped
    np.testing.assert_array_equal(np.load(path), values)


def test_bool_file_in_place_with_a_halo_on_one_device_is_numpys_answer(device, tmp_path):
    """guard: on one device the same bool file in place (its pairs found before the
    wrapper) gives NumPy's answer."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    base = np.random.default_rng(5).integers(0, 2, 4096).astype(bool)
    path = tmp_path / "b.npy"
    np.save(path, base)
    mapped = np.load(path, mmap_mode="r+")
    cv.stream(device.compile(BXOR, "bxor"), [cv.npy(path)], [mapped], halo=1, device=device,
              block_bytes=256)
    mapped.flush()
    del mapped
    np.testing.assert_array_equal(np.load(path), _edge_halo_reference(base, np.not_equal))


# -- a relative path kept past os.chdir ------------------------------------------------------
def test_report_outputs_name_the_file_written_after_chdir(device, tmp_path, monkeypatch):
    """``cv.npy_out("y.npy")`` made in folder A, streamed after ``os.chdir(B)``: the file is
    written in A (FileSink.target is absolute), but ``report.outputs[0]`` is ``"y.npy"``
    (FileSink.result returns ``self.name``), so ``np.load`` of it in B read B's older file."""
    first, other = tmp_path / "A", tmp_path / "B"
    first.mkdir()
    other.mkdir()
    monkeypatch.chdir(first)
    out = cv.npy_out("y.npy")
    monkeypatch.chdir(other)
    np.save("y.npy", np.zeros(3, np.float32))  # an older file of that name here
    x = np.arange(100, dtype=np.float32)
    report = cv.stream(kernel(device, "scale"), [x], [out], args=(2.0,), device=device)
    assert (first / "y.npy").exists()
    np.testing.assert_array_equal(np.load(report.outputs[0]), x * 2)


# -- a memo keyed by less than what is compiled ---------------------------------------------
def test_an_edited_header_with_a_latin1_name_is_built_again(device, tmp_path):
    """``outer.h`` (in an ``-I`` folder) includes ``"\xe9.h"`` (a Latin-1 file name, as old
    projects have): ``kernels/includes.py`` decodes the name with ``errors="replace"``, looks
    for ``"\ufffd.h"``, finds nothing and keys the build by that. Editing ``\xe9.h`` (K from 2
    to 3) then gave the same key: ``dev.compile`` returned the kernel of the old header from
    the memo (and the disk cache) and the stream multiplied by 2, with no error."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    folder = os.fsencode(tmp_path)
    with open(os.path.join(folder, b"outer.h"), "wb") as f:
        f.write(b'#include "\xe9.h"\n')
    latin = os.path.join(folder, b"\xe9.h")
    with open(latin, "wb") as f:
        f.write(b"#define K 2.0f\n")
    source = ('#include "outer.h"\n'
              "__kernel void times_k(__global const float *x, __global float *y, ulong offset,\n"
              "                      ulong n) {\n"
              "    ulong i = get_global_id(0);\n"
              "    if (i < n) y[i] = x[i] * K;\n"
              "}\n")
    options = [f"-I{tmp_path}"]
    x = np.arange(16, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pcpp cannot read the Latin-1 header (it warns)
        before = cv.stream(device.compile(source, "times_k", options), [x], [np.float32],
                           device=device).outputs[0]
        np.testing.assert_array_equal(before, x * 2)
        with open(latin, "wb") as f:
            f.write(b"#define K 3.0f\n")
        after = cv.stream(device.compile(source, "times_k", options), [x], [np.float32],
                          device=device).outputs[0]
    np.testing.assert_array_equal(after, x * 3)


def test_an_edited_override_header_reached_by_an_angle_include_is_built_again(device,
                                                                             tmp_path):
    """``-Iconfig -Idefaults``, where ``defaults/outer.h`` says ``#include <k.h>`` and both
    folders hold a ``k.h`` (an override folder first, a common layout): the compiler reads
    ``config/k.h`` (angle includes search the ``-I`` folders only), but
    ``kernels/includes.py`` looks beside the including header first for either quote kind,
    so the key hashed ``defaults/k.h``. Editing ``config/k.h`` (K from 2 to 3) kept the key:
    the stream still multiplied by 2, with no error."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    config, defaults = tmp_path / "config", tmp_path / "defaults"
    config.mkdir()
    defaults.mkdir()
    (defaults / "outer.h").write_text("#include <k.h>\n")
    (defaults / "k.h").write_text("#define K 5.0f\n")
    (config / "k.h").write_text("#define K 2.0f\n")
    source = ("#include <outer.h>\n"
              "__kernel void times_k(__global const float *x, __global float *y, ulong offset,\n"
              "                      ulong n) {\n"
              "    ulong i = get_global_id(0);\n"
              "    if (i < n) y[i] = x[i] * K;\n"
              "}\n")
    options = [f"-I{config}", f"-I{defaults}"]
    x = np.arange(16, dtype=np.float32)
    before = cv.stream(device.compile(source, "times_k", options), [x], [np.float32],
                       device=device).outputs[0]
    np.testing.assert_array_equal(before, x * 2)  # the compiler's k.h: config's
    (config / "k.h").write_text("#define K 3.0f\n")
    after = cv.stream(device.compile(source, "times_k", options), [x], [np.float32],
                      device=device).outputs[0]
    np.testing.assert_array_equal(after, x * 3)


# -- flags -----------------------------------------------------------------------------------
def test_pinned_svm_takes_true_or_false_only(device):
    """``svm="no"`` allocated fine-grained SVM (``if svm``: memory/pinned.py empty), or
    failed with "the device has none"; round seventeen made ``writable=``, ``warm_up=`` and
    ``wait=`` take True or False only (config.flag)."""
    try:
        with pytest.raises(InputError, match="svm"):
            cv.pinned.empty(1000, np.float32, device=device, svm="no")
    except BackendError:  # no fine-grained SVM here: "no" was taken for True all the same
        pytest.fail("svm='no' asked for shared virtual memory")


# -- readers and parsers that catch only some of the errors ----------------------------------
def _npy_v3(path: Path, header: str, payload: bytes) -> None:
    """A format 3.0 .npy (UTF-8 header) holding ``header`` as its dict text."""
    header += " " * ((64 - (12 + len(header) + 1) % 64) % 64) + "\n"
    data = header.encode()
    path.write_bytes(b"\x93NUMPY\x03\x00" + struct.pack("<I", len(data)) + data + payload)


def _npy_v1(path: Path, header: str, payload: bytes) -> None:
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    data = header.encode("latin1")
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(data)) + data + payload)


def test_npy_3_header_with_a_descr_that_is_no_dtype_is_an_input_error(tmp_path):
    """``{'descr': 5, ...}`` in a 3.0 header: ``io._read_header_3_0`` calls
    ``descr_to_dtype`` itself (TypeError: 'int' object is not iterable), which
    ``io.npy``'s ``except`` does not list; NumPy's 1.0/2.0 readers turn it into a
    ValueError ("descr is not a valid dtype descriptor")."""
    _npy_v3(tmp_path / "bad.npy", "{'descr': 5, 'fortran_order': False, 'shape': (4,), }",
            bytes(16))
    with pytest.raises(InputError, match="is not a .npy file"):
        cv.npy(tmp_path / "bad.npy")


def test_npy_1_header_with_a_descr_that_is_no_dtype_is_an_input_error(tmp_path):
    """guard: the same header in format 1.0 is an InputError naming the file."""
    _npy_v1(tmp_path / "bad.npy", "{'descr': 5, 'fortran_order': False, 'shape': (4,), }",
            bytes(16))
    with pytest.raises(InputError, match="is not a .npy file"):
        cv.npy(tmp_path / "bad.npy")


LONG_NAME = "a" * 300 + ".h"
PLAIN = """__kernel void plain(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}
"""


@pytest.mark.parametrize("source, options", [
    (f'#include "{LONG_NAME}"\n{PLAIN}', ()),
    (f'#include "x.h"\n{PLAIN}', ("-I" + "b" * 300,)),
], ids=["include", "include-dir"])
def test_an_include_name_too_long_is_a_conveyor_error(device, tmp_path, monkeypatch, source,
                                                      options):
    """``kernels/includes.py`` looks for each header with ``Path.is_file()``, which raises
    ENAMETOOLONG (Python ignores only ENOENT, ENOTDIR, EBADF, ELOOP); the command says "check
    the path and its permissions" and exits 1. The compiler would have said the header is
    not found (a CompileError); ``os.path.isfile`` answers False."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    monkeypatch.chdir(tmp_path)
    with pytest.raises((cv.CompileError, InputError)):
        device.compile(source, "plain", list(options))


def _identity(x, y, *, queue, offset, n):
    """A callable that returns its input (no kernel build)."""
    return x


@pytest.mark.parametrize("make", [
    lambda: cv.rows("f4,("),
    lambda: cv.rows(("f4", -1)),
    lambda: cv.per_block((3,), "f4,("),
    lambda: cv.per_block(1, [("a", "f4"), ("a", "f4")]),
    lambda: cv.chain([_identity, _identity], temps=["f4,("]),
    lambda: cv.pinned.empty(10, "nonsense"),
], ids=["rows-syntax", "rows-shape", "per_block-syntax", "per_block-duplicate", "temps-syntax",
        "pinned-unknown"])
def test_unparsable_dtypes_are_input_errors(device, make):
    """Each parses its dtype with ``np.dtype`` and catches less than NumPy raises:
    shaped._dtype only TypeError, chain._temp TypeError and ValueError (not the SyntaxError
    of ``"f4,("``), pinned.empty nothing. ``cv.raw``, ``cv.npy_out`` and map_blocks'
    ``dtype=`` catch all three (sinks._out_dtype)."""
    with pytest.raises(InputError):
        make()


@pytest.mark.parametrize("output", ["f4,(", ("f4", -1), [("a", "f4"), ("a", "f4")]],
                         ids=["str-syntax", "tuple-shape", "list-duplicate"])
def test_unparsable_output_dtypes_are_input_errors(device, output):
    """``outputs=["f4,("]``: a str that is no .npy path is told to use cv.raw_out, with a
    hint from ``sinks._dtype_hint``, whose ``np.dtype`` catches only TypeError
    (SyntaxError); ``outputs=[("f4", -1)]``: ``validate.as_output`` catches only TypeError
    (ValueError: invalid shape in fixed-type tuple)."""
    x = np.arange(8, dtype=np.float32)
    with pytest.raises(InputError):
        cv.stream(_identity, [x], [output], device=device)


@pytest.mark.parametrize("option", ["depth", "block_bytes", "halo"])
def test_counts_past_float64_as_fractions_are_input_errors(device, option):
    """``options._whole`` calls ``float(value)`` on any Real that is not Integral (a
    Fraction): ``Fraction(10**400)`` overflows there; ``Fraction(6)`` is taken as 6."""
    x = np.arange(8, dtype=np.float32)
    with pytest.raises(InputError, match=option):
        cv.stream(_identity, [x], [np.float32], device=device,
                  **{option: Fraction(10**400, 3)})


def test_resident_of_a_ragged_list_is_an_input_error(device):
    """``resident._table`` calls ``np.asarray(value)`` unguarded; ``cv.iterate`` turns the
    same ValueError into an InputError naming the chunk."""
    with pytest.raises(InputError):
        cv.resident([[1.0], [1.0, 2.0]], device=device)


# -- the lead's, from the helper's notes ------------------------------------------------------
def test_image_options_of_the_wrong_type_are_input_errors():
    x = np.zeros((4, 4), np.float32)
    for options in ({"filter": np.array(["nearest"])}, {"address": np.array(["clamp"])},
                    {"filter": 1}):
        with pytest.raises(cv.InputError, match="filter=|address="):
            cv.image(x, **options)


@pytest.mark.parametrize("flag", [["--schedule", "static"], ["--progress"]])
def test_the_cluster_command_refuses_what_it_would_ignore(tmp_path, monkeypatch, capsys, flag):
    from conveyor.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cl").write_text("__kernel void k(__global const float *x, __global float "
                                   "*y, ulong offset, ulong n) { }")
    np.save(tmp_path / "x.npy", np.zeros(4, np.float32))
    try:
        code = main(["map", "k.cl", "--kernel", "k", "-i", "x.npy", "-o", "y.npy",
                     "--scheduler", "tcp://127.0.0.1:1", *flag])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and flag[0] in err and "drop it" in err, err
    assert not (tmp_path / "y.npy").exists()
