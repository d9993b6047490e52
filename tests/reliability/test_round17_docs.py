"""Round seventeen, the documentation's promises checked by running them: README.md's
snippets and statements of behaviour, the docstrings of every public name of ``conveyor``
(``cv.*``, ``cv.pinned``, ``conveyor.dask``) and ``conveyor --help``, each tried at its stated
default, its limit and one past it, and for its documented error.

Found (strict xfails, each asserting the right behaviour):

- ``conveyor.dask.kernel(source, name, options="-DSHIFT=1")`` splits the string into its
  characters (``options=('-', 'D', 'S', ...)``): every worker then fails its build with
  "Invalid build option: -", where ``device.compile`` refuses a bare string at once with an
  InputError that says to pass a list.
- ``conveyor.dask.kernel`` promises "InputError now when ``source`` has no kernel
  ``name``", but a kernel that exists only inside ``#if 0`` (or an ``#ifdef`` the options
  leave undefined) is accepted: the client falls back to reading the unexpanded source, and
  every chunk fails later on its worker.
- ``cv.iterate(5, length=5)`` (anything not iterable) is a raw ``TypeError: 'int' object is
  not iterable`` from ``iter()``, not an InputError naming ``cv.iterate``.
- ``cv.portable(None)`` and ``cv.portable(source.encode())`` are raw TypeErrors ("can only
  concatenate str (not "bytes") to str"), where ``device.compile`` says "decode it first".
- ``cv.per_block(2**62, np.float32)`` (a record of more bytes than any array holds) is a raw
  NumPy ``ValueError: array is too big`` from the stream, where ``cv.rows``, ``cv.npy_out``
  and chain temps of such sizes are InputErrors naming the output.
- ``cv.resident(table, writable="no")`` is a *writable* table (``bool("no")``): uploaded at
  every stream and copied back, and refused on several devices as "a writable cv.resident";
  ``cv.device(spec, warm_up="no")`` starts the warm-up and ``device.compile(...,
  wait="False")`` waits, where every flag of ``cv.stream`` (``zero_copy="no"``,
  ``progress="yes"``...) is refused with "takes True or False".

Guards kept: the README's size strings and integral floats at their limits, the documented
refusals of ``workers=1025``/``depth=0``/``halo=2.5``, the README's files snippet with
``report.outputs == ["c.npy"]``, reductions of no elements and their types, and the
command's documented exit codes for ``bench``/``demo`` limits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

MACRO_KERNEL = """#define K(T) __kernel void add_##T(__global const T *x, __global T *y, \\
    ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i] + (T)SHIFT; }
K(float)
"""


# == conveyor.dask.kernel ========================================================================
def test_dask_kernel_refuses_options_given_as_one_string():
    """``conveyor.dask.kernel(source, name, options=...)`` takes a list of options, as
    ``device.compile`` does. ``device.compile`` refuses a bare string (which would be split
    into its characters) with an InputError that says to pass a list; ``cvd.kernel`` keeps
    ``('-', 'D', 'S', 'H', ...)`` and every worker's build fails with "Invalid build option:
    -". The right answer: the same InputError, on the client, now."""
    cvd = pytest.importorskip("conveyor.dask")
    with pytest.raises(InputError, match="list"):
        spec = cvd.kernel(MACRO_KERNEL, "add_float", options="-DSHIFT=1")
        pytest.fail(f"accepted: options={spec.options!r}")  # pragma: no cover


def test_device_compile_refuses_options_given_as_one_string(device):
    """guard: ``device.compile`` refuses a bare string of options (the check that
    ``conveyor.dask.kernel`` lacks), and a list of them builds the macro-made kernel."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    with pytest.raises(InputError, match="pass a list of options"):
        device.compile(MACRO_KERNEL, "add_float", options="-DSHIFT=1")
    k = device.compile(MACRO_KERNEL, "add_float", options=["-DSHIFT=1"])
    x = np.arange(10, dtype=np.float32)
    out = cv.stream(k, [x], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, x + 1)


def test_dask_kernel_inside_if_0_is_refused_now():
    """The docstring: "InputError now when ``source`` has no kernel ``name``". A kernel the
    preprocessor removes (``#if 0``) is no kernel of the program the compiler builds
    (``conveyor map --kernel`` says so, README: "one inside ``#if 0`` is not [found]"), but
    ``KernelSpec.params`` falls back to the unexpanded source when the expanded one lacks
    it, so the client accepts it and each chunk fails later on its worker."""
    cvd = pytest.importorskip("conveyor.dask")
    source = ("#if 0\n__kernel void gone(__global const float *x, __global float *y, "
              "ulong offset, ulong n) {}\n#endif\n"
              "__kernel void kept(__global const float *x, __global float *y, ulong offset, "
              "ulong n) {}\n")
    with pytest.raises(InputError, match="gone"):
        cvd.kernel(source, "gone")


def test_dask_kernel_of_a_macro_made_kernel_is_found():
    """guard: the client reads the source as the compiler does: a kernel that a macro makes
    (``add_##T``) is found, with its ``-D`` options kept as given."""
    cvd = pytest.importorskip("conveyor.dask")
    spec = cvd.kernel(MACRO_KERNEL, "add_float", options=["-DSHIFT=2"])
    assert spec.options == ("-DSHIFT=2",)
    with pytest.raises(InputError, match="no kernel named 'add_int'"):
        cvd.kernel(MACRO_KERNEL, "add_int")


# == cv.iterate, cv.portable, cv.resident: what is not of the documented type ====================
@pytest.mark.parametrize("chunks", [5, None, 2.5], ids=["int", "None", "float"])
def test_iterate_of_a_non_iterable_is_an_input_error(chunks):
    """``cv.iterate(chunks, length)`` takes "any iterable of arrays"; what is not iterable
    reaches ``iter(chunks)`` (pipeline/chunks.py, ``IterSource.__init__``) and escapes as
    ``TypeError: 'int' object is not iterable``, where every other wrong argument of
    ``cv.iterate`` (``length=-1``, an array) is an InputError naming it."""
    with pytest.raises(InputError, match="iterate"):
        cv.iterate(chunks, length=5)


@pytest.mark.parametrize("source", [b"__kernel void f() {}", None], ids=["bytes", "None"])
def test_portable_refuses_what_is_not_a_str(source):
    """``cv.portable(source)`` prefixes the prelude with ``+``: bytes or None escape as
    ``TypeError: can only concatenate str (not "bytes") to str``; ``device.compile`` says
    "takes the source as a str: decode it first (source.decode('utf-8'))"."""
    with pytest.raises(InputError, match="str"):
        cv.portable(source)


@pytest.mark.parametrize("call", ["resident-writable", "device-warm_up", "compile-wait"])
@pytest.mark.parametrize("flag", ["no", "False"])
def test_flags_outside_stream_take_only_bools(device, call, flag):
    """``cv.resident(table, writable=...)``, ``cv.device(spec, warm_up=...)`` and
    ``device.compile(..., wait=...)`` keep ``bool(flag)``: ``writable="no"`` is a writable
    table (uploaded at every stream, copied back, refused on several devices as "a writable
    cv.resident"), ``warm_up="no"`` starts the warm-up (pinned blocks on a GPU) and
    ``wait="False"`` waits. Every flag of ``cv.stream`` is refused when it is not a bool
    (``zero_copy="no"``: "zero_copy takes True or False"); these should be too."""
    name = call.split("-")[1]
    with pytest.raises(InputError, match=name):
        if call == "resident-writable":
            cv.resident(np.arange(4, dtype=np.float32), writable=flag).close()
        elif call == "device-warm_up":
            cv.device(device.spec, warm_up=flag)
        else:
            device.compile(MACRO_KERNEL, "add_float", ["-DSHIFT=1"], wait=flag)


def test_stream_flags_take_only_bools(device):
    """guard: ``cv.stream``'s flags refuse what is not a bool, before any work."""
    scale = kernel(device, "scale")
    x = np.arange(10, dtype=np.float32)
    for name in ("zero_copy", "progress", "strict", "warmup", "keep_pinned"):
        with pytest.raises(InputError, match=f"{name} takes True or False"):
            cv.stream(scale, [x], [np.float32], args=(2.0,), device=device, **{name: "no"})
    assert_clean(device)


@pytest.mark.parametrize("shape", [2**62, (2**31, 2**31)], ids=["2**62", "2**31x2**31"])
def test_per_block_record_larger_than_any_array_is_an_input_error(device, shape):
    """``cv.per_block(shape, dtype)`` with a record of more bytes than an array can hold:
    ``ShapedSink``'s ``np.empty((0, *shape), dtype)`` (pipeline/shaped.py, ``PerBlock.sink``)
    raises NumPy's ``ValueError: array is too big``. Every other output of such a size is
    an InputError naming it (``cv.rows(shape=(2**62,))``: "more than this host can
    allocate"; ``cv.npy_out(shape=...)``: "more than any file holds"; a record of 2**40
    elements: "one ring ... needs ... device bytes"); this one should be too."""
    scale = kernel(device, "scale")
    x = np.arange(1000, dtype=np.float32)
    with pytest.raises(InputError, match="output 0|per_block"):
        cv.stream(scale, [x], [cv.per_block(shape, np.float32)], args=(2.0,), device=device,
                  block_bytes=400)
    assert_clean(device)


def test_outputs_larger_than_any_array_are_input_errors(device):
    """guard: the other outputs of more bytes than any array or file holds are InputErrors
    before any work (README: bad input fails before any work, with an InputError)."""
    scale = kernel(device, "scale")
    x = np.arange(1000, dtype=np.float32)
    big = 2**62
    for output in (cv.rows(np.float32, shape=(big,)), cv.rows(np.float32, ratio=(big, 1)),
                   cv.per_block(2**40, np.float32)):
        with pytest.raises(InputError):
            cv.stream(scale, [x], [output], args=(2.0,), device=device, block_bytes=400)
    assert_clean(device)


# == the README's sizes, counts and limits =======================================================
def test_documented_sizes_counts_and_limits(device):
    """guard: README, "What is unambiguous is taken as meant": ``depth=3.0``,
    ``block_bytes=1e5`` and size strings (KiB = 1024, KB = 1000); a bare ``G``,
    ``depth="3"``, ``halo=2.5``, ``workers=-1`` and ``workers=2000`` refused (1 to 1024:
    1024 runs, 1025 is refused), each an InputError naming the parameter."""
    scale = kernel(device, "scale")
    x = np.arange(1000, dtype=np.float32)

    def run(**options):
        report = cv.stream(scale, [x], [np.float32], args=(2.0,), device=device,
                           zero_copy=False, **options)
        np.testing.assert_array_equal(report.outputs[0], x * 2)
        return report

    assert run(depth=3.0, block_bytes=400).depth == 3
    assert run(block_bytes=1e3).block_rows == 250
    assert run(block_bytes="1KB").block_rows == 250
    assert run(block_bytes="1KiB").block_rows == 256
    assert run(block_bytes="0.5KiB").block_rows == 128
    assert run(workers=1024, block_bytes=400).blocks == 10
    for options, name in [({"block_bytes": "1G"}, "block_bytes"), ({"depth": "3"}, "depth"),
                          ({"halo": 2.5}, "halo"), ({"workers": -1}, "workers"),
                          ({"workers": 2000}, "workers"), ({"workers": 1025}, "workers"),
                          ({"depth": 0}, "depth"), ({"block_bytes": "1.7"}, "block_bytes"),
                          ({"memory_limit": 0}, "memory_limit")]:
        with pytest.raises(InputError, match=name):
            run(**options)
    assert_clean(device)


def test_readme_files_snippet_reports_the_paths_as_given(device, tmp_path, monkeypatch):
    """guard: the README's files snippet, relative paths and all: ``cv.raw(path, dtype,
    (-1,))`` beside a ``.npy`` path, ``cv.npy_out("c.npy")``, and ``report.outputs ==
    ["c.npy"]`` (the path as given), the file holding the sum."""
    monkeypatch.chdir(tmp_path)
    a = np.arange(1000, dtype=np.float32)
    b = np.linspace(0, 1, 1000, dtype=np.float32)
    np.save("a.npy", a)
    b.tofile("b.bin")
    add = kernel(device, "add")
    report = cv.stream(add, inputs=["a.npy", cv.raw("b.bin", np.float32, (-1,))],
                       outputs=[cv.npy_out("c.npy")], device=device)
    assert report.outputs == ["c.npy"]
    want = a + b + (np.arange(1000) % 7).astype(np.float32)
    np.testing.assert_array_equal(np.load("c.npy"), want)
    assert sorted(os.listdir(".")) == ["a.npy", "b.bin", "c.npy"]  # no part file left
    assert_clean(device)


@pytest.mark.parametrize("dtype", ["uint8", "int32", "float32"])
def test_reductions_of_no_elements_are_as_documented(device, dtype):
    """guard: README, "a sum of no elements is 0 (float64 for a float kernel, 64-bit for an
    integer one ...); min/max of no elements is an InputError before any work"; and a sum
    of uint8 values past 255 does not wrap."""
    ident = kernel(device, "ident", dtype)
    empty = np.zeros(0, dtype)
    total = cv.stream(ident, [empty], reduce="sum", device=device).result
    want = {"uint8": np.uint64, "int32": np.int64, "float32": np.float64}[dtype]
    assert total == 0 and type(total) is want
    for op in ("min", "max"):
        with pytest.raises(InputError, match="empty input"):
            cv.stream(ident, [empty], reduce=op, device=device)
    if dtype == "uint8":
        full = np.full(1000, 255, np.uint8)
        total = cv.stream(ident, [full], reduce="sum", device=device, block_bytes=256).result
        assert total == 255_000
    assert_clean(device)


# == the command =================================================================================
@pytest.mark.parametrize("argv,says", [
    (["bench", "--runs", "0"], "at least 1"),
    (["bench", "--max-spread", "nan"], "finite number >= 0"),
    (["bench", "--max-spread", "-1"], "finite number >= 0"),
    (["demo", "--mib", "0"], "at least 1 MiB"),
    (["cache", "bogus"], "invalid choice"),
])
def test_command_limits_exit_2_saying_what_to_change(argv, says):
    """guard: ``conveyor bench``/``demo``/``cache`` limits from their ``--help``: one past
    each exits 2 with a line saying what to give, before any device is opened."""
    run = subprocess.run([sys.executable, "-m", "conveyor.cli", *argv], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2, run
    assert says in run.stderr
    assert "Traceback" not in run.stderr
