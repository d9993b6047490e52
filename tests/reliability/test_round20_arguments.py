"""Round twenty, helper C: a sweep of the public API's arguments, one parameter (and some
pairs) at a time, with hostile values: None, bools and NumPy scalars where ints are meant,
0-d arrays, integral and fractional floats, negatives, 0, 2**63, 10**400, NaN/inf, strings
that look like numbers, bytes, paths where strings are meant and back, lists, sets, dicts and
generators where one value is meant, objects whose ``__index__``/``__len__``/``__array__``/
``__fspath__`` raise or lie, subclasses of ndarray and str, and ``CONVEYOR_*`` variables set
to garbage (read by a child process). The sweep itself lives outside the repository; each
finding's minimal case is here.

Found (strict xfails, each asserting the right behaviour):

- **Silent misreading**: a shape given as a set is taken in the set's iteration order
  (``cv.raw(path, f4, shape={2, 8})`` reads 8 rows of 2; ``cv.pinned.empty({2, 8})`` is
  (8, 2)); a dict's keys are taken as one (``cv.npy_out(..., shape={16: None})`` writes 16
  rows). NumPy refuses both (``np.empty({2, 8})``); ``cv.rows``/``per_block`` (shaped._dims)
  already do. (Bytes and "" are iterated too, as NumPy itself does: ``np.empty(b"\\x10")``.)
- **"no" taken as True**: ``Device.warm_up(nbytes, pinned="no")`` pins memory (round 17 made
  ``writable=``/``warm_up=``/``wait=`` strict, not this one); ``block_bytes=-1``, ``4.5`` or
  ``"1MiB"`` start a warm-up that silently does nothing; ``nbytes="64MiB"`` is a raw
  TypeError.
- **Raw errors**: ``conveyor.dask.stream``/``warm`` with ``client="tcp://host:8786"`` (the
  address, as the command line's ``--scheduler`` takes it): AttributeError ``'str' object has
  no attribute 'scheduler_info'``/``'run'``; ``pool.limit``/``pool.keep`` set to a 0-d float
  or 1-element array: NumPy's "only integer scalar arrays can be converted to a scalar index";
  an ``os.PathLike`` whose ``__fspath__`` gives bytes, as a bare input or output path:
  pathlib's TypeError (``cv.npy`` of it is an InputError); ``cv.rows(ratio=(1, inf))``:
  OverflowError; ``reduce=np.prod`` / ``np.mean`` for a callable (round 19 mapped
  ``np.sum``/``np.max``..., not these): NumPy's TypeError from reading the partial as an axis.
- **Unclear message**: ``dev.compile(src, name, b"-DX=1")`` says ``options=[45, 68, 88, ...]:
  every option is a str (45 is not)``.
- **Silently ignored**: ``device.wait_for_warm_up(timeout="soon")`` (or -1, NaN, any object)
  returns at once on a device with no warm-up thread; where one runs, ``Thread.join("soon")``
  raises a raw TypeError.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import first_device_only  # noqa: E402, F401

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SRC = """__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2.0f; }"""


def _copy(x, y, *, queue, offset, n):
    """A callable map: y = x (no kernel to build)."""
    y[:] = x


class _BytesPath:
    """An os.PathLike whose path is bytes (os.fspath allows it)."""

    def __init__(self, path: str) -> None:
        self.path = os.fsencode(path)

    def __fspath__(self) -> bytes:
        return self.path


# -- shapes given as sets, bytes, dicts, "" --------------------------------------------------
def test_a_raw_shape_given_as_a_set_is_refused_not_reordered(tmp_path):
    path = tmp_path / "x.bin"
    np.arange(16, dtype=np.float32).tofile(path)
    assert cv.raw(str(path), np.float32, (2, 8)).shape == (2, 8)  # a tuple: as written
    with pytest.raises(InputError, match="shape"):
        cv.raw(str(path), np.float32, {2, 8})  # today: shape (8, 2), no error


@pytest.mark.parametrize("shape", [{2, 8}, {2: None, 8: None}], ids=["set", "dict"])
def test_pinned_empty_refuses_a_shape_numpy_refuses(device, shape):
    with pytest.raises(TypeError):
        np.empty(shape)  # NumPy's own rule
    with pytest.raises(InputError, match="shape"):
        cv.pinned.empty(shape, np.float32, device=device)


@pytest.mark.parametrize("shape", [{2, 8}, {16: None}], ids=["set", "dict"])
def test_npy_out_refuses_a_set_or_a_dict_as_its_shape(tmp_path, shape):
    with pytest.raises(TypeError):
        np.empty(shape)  # NumPy's own rule
    with pytest.raises(InputError, match="shape"):
        cv.npy_out(str(tmp_path / "y.npy"), np.float32, shape)


# -- Device.warm_up: "no" taken as True ------------------------------------------------------
_WARM_CHILD = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import conveyor as cv
    from conveyor.errors import ConveyorError
    out = {}
    for name, kw in [("pinned_no", dict(nbytes=1, pinned="no")),
                     ("block_negative", dict(nbytes=1, block_bytes=-1, pinned=True)),
                     ("nbytes_text", dict(nbytes="64MiB", pinned=True))]:
        dev = cv.device(sys.argv[1], warm_up=False)
        try:
            dev.warm_up(**kw)
            out[name] = "accepted"
        except ConveyorError:
            out[name] = "InputError"
        except Exception as exc:
            out[name] = type(exc).__name__
        dev.close()
        dev._warmup = None  # the next case starts from no warm-up (a child: nothing shared)
    print(json.dumps(out))
""")


def test_device_warm_up_refuses_arguments_it_cannot_mean(device):
    """``pinned="no"`` starts a warm-up that pins (with ``nbytes=1`` it pins nothing here,
    but it is taken as True: ``WarmUp.pinned == "no"``); ``block_bytes=-1`` is a warm-up that
    silently does nothing; ``nbytes="64MiB"`` is a raw TypeError (``"64MiB" <= 0``,
    base.py). Run in a child: a warm-up
    once started stays the device's."""
    done = subprocess.run([sys.executable, "-c", _WARM_CHILD, device.spec],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["pinned_no"] == "InputError", got
    assert got["block_negative"] == "InputError", got
    assert got["nbytes_text"] in ("InputError", "accepted"), got  # refused, or read as a size


def test_wait_for_warm_up_refuses_a_timeout_that_is_no_number(device):
    with pytest.raises(InputError, match="timeout"):
        device.wait_for_warm_up("soon")


# -- conveyor.dask: client= -------------------------------------------------------------------
@pytest.mark.parametrize("call", ["stream", "warm"])
def test_dask_client_given_as_an_address_is_an_input_error(tmp_path, call):
    """``client="tcp://127.0.0.1:8786"`` (the address, as ``--scheduler`` takes it): today
    AttributeError ``'str' object has no attribute 'scheduler_info'`` (``'run'`` for warm),
    from dask/files.py ``_client``, which returns any object that is not None."""
    pytest.importorskip("distributed")
    import conveyor.dask as cvd

    spec = cvd.kernel(SRC, "twice")
    np.save(tmp_path / "x.npy", np.arange(8, dtype=np.float32))
    with pytest.raises(InputError, match="client"):
        if call == "stream":
            cvd.stream(spec, [str(tmp_path / "x.npy")], [str(tmp_path / "y.npy")],
                       client="tcp://127.0.0.1:8786")
        else:
            cvd.warm(spec, client="tcp://127.0.0.1:8786")
    assert sorted(os.listdir(tmp_path)) == ["x.npy"]  # no output, no part file


# -- pools ------------------------------------------------------------------------------------
@pytest.mark.parametrize("attr", ["limit", "keep"])
def test_pool_limit_or_keep_given_a_float_array_is_an_input_error(device, attr):
    pool = device.memory_pool
    before = getattr(pool, attr)
    try:
        with pytest.raises(InputError, match=attr):
            setattr(pool, attr, np.array(2.5))  # TypeError: only integer scalar arrays ...
    finally:
        setattr(pool, attr, before)


# -- path-likes of bytes ----------------------------------------------------------------------
def test_a_bare_input_path_like_of_bytes_is_an_input_error(device, tmp_path):
    np.save(tmp_path / "x.npy", np.arange(8, dtype=np.float32))
    with pytest.raises(InputError, match="input 0"):
        cv.stream(_copy, [_BytesPath(str(tmp_path / "x.npy"))], [np.float32], device=device)


def test_a_bare_output_path_like_of_bytes_is_an_input_error(device, tmp_path):
    target = tmp_path / "y.npy"
    with pytest.raises(InputError, match="output 0"):
        cv.stream(_copy, [np.arange(8, dtype=np.float32)], [_BytesPath(str(target))],
                  device=device)
    assert os.listdir(tmp_path) == []


def test_cv_npy_of_a_path_like_of_bytes_is_an_input_error():
    """guard: the constructor names it (files.path_text), as the bare path should."""
    with pytest.raises(InputError, match="file path"):
        cv.npy(_BytesPath("/nonexistent/x.npy"))


# -- rows(ratio=) -----------------------------------------------------------------------------
def test_rows_ratio_with_an_infinite_part_is_an_input_error():
    with pytest.raises(InputError, match="ratio"):
        cv.rows(np.float32, ratio=(1, float("inf")))


# -- reduce= with a whole-array NumPy fold ----------------------------------------------------
@pytest.mark.parametrize("fold", [np.prod, np.mean], ids=["prod", "mean"])
def test_a_whole_array_numpy_fold_is_refused_with_advice(device, fold):
    """Round nineteen took ``reduce=np.sum``/``np.max``... as their names, since
    ``np.max(total, partial)`` reads the partial as an axis; ``np.prod`` and ``np.mean`` do
    the same, and fail after the blocks ran with NumPy's message."""
    calls = []

    def partial(x, *, queue, offset, n):
        calls.append(n)
        return 1.5

    with pytest.raises(InputError, match="reduce"):
        cv.stream(partial, [np.arange(64, dtype=np.float32)], reduce=fold, block_bytes=64,
                  device=device, warmup=False)
    assert calls == []  # before any work


# -- compile(options=bytes) -------------------------------------------------------------------
def test_compile_options_given_as_bytes_names_what_was_given(device):
    with pytest.raises(InputError) as caught:
        device.compile(SRC, "twice", b"-DX=1")
    assert "b'-DX=1'" in str(caught.value) or "bytes" in str(caught.value), caught.value


# -- guards -----------------------------------------------------------------------------------
def test_str_subclasses_are_taken_as_their_text_for_option_names(device):
    """guard: NumPy's str_ and a str subclass work where a name is asked (schedule, boundary,
    reduce): a later ``type(v) is str`` check would refuse them."""

    if device.backend != "opencl":
        pytest.skip("the callables slice and add PyOpenCL arrays")

    class Name(str):
        pass

    def middle(x, y, *, queue, offset, n):
        y[:] = x[1:1 + y.shape[0]]  # the block without its halo rows

    x = np.arange(64, dtype=np.float32)
    got = cv.stream(middle, [x], [np.float32], device=device, halo=1,
                    boundary=np.str_("reflect"), schedule=Name("static")).outputs[0]
    np.testing.assert_array_equal(got, x)

    def total(x, *, queue, offset, n):
        return float(np.asarray(x.get() if hasattr(x, "get") else x).sum())

    result = cv.stream(total, [x], reduce=Name("sum"), block_bytes=64, device=device).result
    assert result == float(x.sum())


def test_integral_floats_are_taken_for_raw_shape_and_offset(tmp_path):
    """guard: what is unambiguous is taken as meant (README): shape (-1, 4.0), offset 4.0."""
    path = tmp_path / "x.bin"
    np.arange(17, dtype=np.float32).tofile(path)
    assert cv.raw(str(path), np.float32, (-1, 4.0), offset=np.float64(4.0)).shape == (4, 4)
    with pytest.raises(InputError, match="offset"):
        cv.raw(str(path), np.float32, offset=4.5)


# -- beside the fixes (the lead) ---------------------------------------------------------------
def test_compile_options_given_as_a_dict_or_a_set_are_refused(device):
    """A dict's keys (or a set's order) were taken as the options, silently."""
    for options in ({"-DS=2": 1}, {"-DA=1", "-DB=2"}):
        with pytest.raises(InputError, match="options"):
            device.compile(SRC, "twice", options)


def test_pool_sizes_past_any_memory_are_refused(device):
    pool = device.memory_pool
    for attr in ("limit", "keep"):
        before = getattr(pool, attr)
        try:
            with pytest.raises(InputError, match="larger than any memory"):
                setattr(pool, attr, 10**400)
            setattr(pool, attr, np.int64(2**40))  # a NumPy integer: taken
            assert getattr(pool, attr) == 2**40
        finally:
            setattr(pool, attr, before)


@pytest.mark.parametrize("fold", [np.median, np.nanmax, all], ids=["median", "nanmax", "all"])
def test_other_whole_array_folds_are_refused_with_what_to_give(fold):
    from conveyor.pipeline.options import reduce_op

    with pytest.raises(InputError, match="reduce=.*give|cannot be folded"):
        reduce_op(fold)
    assert reduce_op(np.multiply) is np.multiply  # a pairwise ufunc: taken as it is
