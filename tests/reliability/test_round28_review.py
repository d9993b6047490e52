"""Round twenty-eight: a review of rounds twenty-six and twenty-seven's fixes (9f3cb5f..9915c22):
``FileSource.begin(stream)``/``finish``/``writes_in_place``, ``open_regular``, ``.npy`` headers
to 1 MiB, ``stream.begun``/``_mapped_outputs``, ``commit_all``'s Ctrl-C deferral, FileSink
sub-array dtypes, ``ChunkedSource``'s load lock, the command's ``-o`` check against headers,
the wrappers that copy ``Source.beside``, ``typedefs._vector_width``, CR line breaks in
``collapse_tables``.

Method (scripts under /tmp/r28rev, not kept): a real SIGINT at each of the 149 (one output)
and 273 (two outputs) points where CPython runs handlers inside ``commit_all`` (a profile
hook at each C call's return); /proc/self/fd counted around streams that fail before begin
(bad args, a bad output folder, a second input changed since made), after it (a callable
raising at the first and a middle block, into arrays and .npy outputs), one source given
twice, 8 threads sharing one ``cv.npy`` (half of them failing); in-place streams through
``np.load(mmap_mode="r+")``, a path input, a hard link, a symlink (output and input), a
``/proc/self/fd/N`` map, a raw ``np.memmap`` at the header's offset, ``np.frombuffer`` of an
``mmap.mmap``, views and reshapes of the map, ``cv.raw`` at an offset, two devices, and file
names with spaces and a newline; sub-array dtypes (one level and nested) into arrays,
``npy_out``, ``raw_out``, with and without ``shape=``, over one and two devices;
``cv.parquet``/``cv.arrow`` sources of two columns shared by six threads, on one device, on
both PoCL devices at once, and given twice to one stream (6 rounds each); ``conveyor map
-o`` through a link to a header found by ``PYOPENCL_BUILD_OPTIONS``' ``-I``;
``ext_vector_type`` widths spelled with tabs and line breaks, 9f3cb5f against today.

Each finding below was a strict xfail asserting the right behaviour, seen failing for its
reason with ``--runxfail``, and is a plain test since its fix (two accept the refusal the fix
chose: another stream writing the input in place, or the file replaced under a running
stream of the same input).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, kernel  # noqa: E402, F401 (autouse: first device only)

import conveyor as cv  # noqa: E402


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder of this test's own under /tmp, not pytest's ``tmp_path``: pytest sessions of
    other processes beside this one remove older numbered folders of pytest-of-USER (one run
    in about 25 saw the guards below fail so, once, while other suites ran)."""
    with tempfile.TemporaryDirectory(prefix="r28-review-", dir="/tmp") as folder:
        yield Path(folder)


def _age(path: Path) -> None:
    """Set ``path``'s modification time a second back: a write made next changes it (past
    any timestamp tick)."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))


def _rewrite_in_place(path: Path, values: np.ndarray) -> None:
    """Write ``values`` over the data of the .npy at ``path`` (same size, same header), as
    another program would, and move its modification time a second on."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - values.nbytes)
        f.write(values.tobytes())
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _in_place(device: cv.Device, path: Path, x: np.ndarray) -> None:
    """Stream ``path`` (an aged .npy of ``x``) in place through a memmap of its own file."""
    _age(path)
    out = np.load(path, mmap_mode="r+")
    cv.stream(kernel(device, "scale"), [cv.npy(path)], [out], device=device, args=(2.0,),
              block_bytes=400)
    del out
    np.testing.assert_array_equal(np.load(path), x * 2)


def test_an_in_place_stream_of_a_file_named_with_a_newline_is_allowed(device, scratch):
    """README: "a memmap of the input written by its own in-place stream is not such a
    change". ``_mapped_outputs`` matches the output's map to the input by the path
    /proc/self/maps shows, where Linux writes a newline in a name as ``\\012``:
    ``files.same_file`` finds no such file and compares the text, so the stream's own writes
    are refused mid-stream. 9f3cb5f matched maps by inode and streamed it."""
    path = scratch / "x\ny.npy"
    x = np.arange(1000, dtype=np.float32)
    np.save(path, x)
    _in_place(device, path, x)


def test_guard_in_place_streams_through_links_and_views_of_the_input(device, scratch):
    """Held: an in-place stream through a hard link's map, a symlink's, and a raw memmap at
    the header's offset, of an input whose time is aged (so each write changes it)."""
    x = np.arange(1000, dtype=np.float32)
    path = scratch / "x.npy"
    for kind in ("hard", "symlink", "raw"):
        np.save(path, x)
        _age(path)
        other = scratch / f"{kind}.npy"
        if kind == "hard":
            os.link(path, other)
            out = np.load(other, mmap_mode="r+")
        elif kind == "symlink":
            other.symlink_to(path)
            out = np.load(other, mmap_mode="r+")
        else:
            out = np.memmap(path, np.float32, "r+", os.path.getsize(path) - x.nbytes, (1000,))
        cv.stream(kernel(device, "scale"), [cv.npy(path)], [out], device=device,
                  args=(2.0,), block_bytes=400)
        del out
        np.testing.assert_array_equal(np.load(path), x * 2, err_msg=kind)
        if kind != "raw":
            other.unlink()


def _held_stream(source: Any, device: cv.Device, output: Any, entered: threading.Event,
                 go_on: threading.Event, failures: list[BaseException],
                 expect: np.ndarray | None = None) -> threading.Thread:
    """A thread streaming ``source`` into ``output`` whose callable waits at its first block
    (``entered`` set, until ``go_on``); what it raises goes to ``failures``."""

    def holding(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> Any:
        if offset == 0:
            entered.set()
            assert go_on.wait(60)
        return a

    def run() -> None:
        try:
            got = cv.stream(holding, [source], [output], device=device, block_bytes=400,
                            warmup=False).outputs[0]
            if expect is not None:
                np.testing.assert_array_equal(got, expect)
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)
        finally:
            entered.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
def test_another_streams_in_place_output_does_not_hide_a_rewrite(device, scratch):
    """README: "a memmap of the input written by its own in-place stream is not such a
    change (a writable memmap held elsewhere in the program hides nothing)". Stream A (a
    thread) writes ``x.npy`` in place through its own memmap and waits at its first block;
    stream B, a plain read of the same ``cv.npy`` object, sees another program rewrite the
    file mid-stream. B must raise "changed while it was read", as it does when A is not
    there; it returned the old rows and the new ones mixed. Since the fix B is refused at
    its start while A writes the input in place."""
    path = scratch / "x.npy"
    x = np.arange(1000, dtype=np.float32)
    np.save(path, x)
    source = cv.npy(path)
    entered, go_on = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    thread = _held_stream(source, device, np.load(path, mmap_mode="r+"), entered, go_on,
                          failures)

    def rewriting(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> Any:
        if offset == 100:
            _rewrite_in_place(path, -x)
        return a

    try:
        assert entered.wait(60)
        # Refused mixed rows either way: "changed while it was read", or (since the fix)
        # refused at its start, while another stream writes the input in place.
        with pytest.raises(cv.InputError, match="changed while it was read|written in place "
                                                "by another stream"):
            cv.stream(rewriting, [source], [np.float32], device=device, block_bytes=400,
                      warmup=False)
    finally:
        go_on.set()
        thread.join()


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
def test_a_stream_begun_after_the_file_was_replaced_reads_the_new_file(device, scratch):
    """README: one cv.npy input may feed many streams; "each opens the file again", and "new
    values under the same header are read as they are now". Stream A (a thread) reads
    ``x.npy`` and waits at its first block; the file is then replaced (a new .npy of the
    same header renamed over it, as any careful writer does); stream B then runs whole. B
    began after the replacement and must give the new values (or refuse); it read A's open
    descriptor, the old file, with no error. (A, begun before, rightly reads the old file to
    its end.) Since the fix B is refused while A reads the old file, naming what to do."""
    path = scratch / "x.npy"
    x = np.arange(1000, dtype=np.float32)
    np.save(path, x)
    source = cv.npy(path)
    entered, go_on = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    thread = _held_stream(source, device, np.float32, entered, go_on, failures, expect=x)
    try:
        assert entered.wait(60)
        np.save(scratch / "new.npy", -x)
        os.replace(scratch / "new.npy", path)
        try:
            got = cv.stream(kernel(device, "scale"), [source], [np.float32], device=device,
                            args=(1.0,)).outputs[0]
        except cv.InputError as exc:  # refused (since the fix), saying what to do
            assert "was replaced by another file" in str(exc), exc
        else:
            np.testing.assert_array_equal(got, -x)
    finally:
        go_on.set()
        thread.join()
    assert not failures


def test_guard_threads_sharing_one_source_leave_no_descriptor(device, scratch):
    """Held: 6 threads stream one cv.npy object at once, half of them failing mid-stream;
    after them, no descriptor is left open and the source holds nothing."""
    path = scratch / "x.npy"
    x = np.arange(1000, dtype=np.float32)
    np.save(path, x)
    source = cv.npy(path)
    scale = kernel(device, "scale")

    class Boom(Exception):
        pass

    def failing(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> Any:
        if offset == 300:
            raise Boom
        return a

    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            if i % 2:
                with pytest.raises(Boom):
                    cv.stream(failing, [source], [np.float32], device=device,
                              block_bytes=400, warmup=False)
            else:
                got = cv.stream(scale, [source], [np.float32], device=device, args=(1.0,),
                                block_bytes=400).outputs[0]
                np.testing.assert_array_equal(got, x)
        except BaseException as exc:
            failures.append(exc)

    before = len(os.listdir("/proc/self/fd"))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures
    assert len(os.listdir("/proc/self/fd")) == before
    assert source._fd is None and not source._streams and not source._readers


def test_a_ctrl_c_as_commit_defers_it_leaves_the_programs_other_handlers(device, scratch,
                                                                           monkeypatch):
    """``commit_all`` holds a Ctrl-C while it renames (``deferred_sigint``), which swaps the
    handler of each signal the program handles in Python, SIGINT last. A real SIGINT raised
    right after the first swap (where CPython runs handlers: a C call's return) raises
    KeyboardInterrupt out of ``__enter__``, which never puts the swapped handlers back: the
    program's SIGUSR1 handler (a SIGTERM or SIGALRM handler alike) is the deferral's
    ``hold`` from then on, and every later such signal is swallowed. The sweep of every
    point of commit found only this one (outputs all old or all new, said rightly)."""
    import _signal
    import signal

    import conveyor.pipeline.stream as stream_module
    from conveyor.pipeline import sinks

    real = sinks.commit_all
    got: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        got.append(signum)

    def shot(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and arg is _signal.signal:
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)

    def commit_all(sinks_: Any) -> None:
        sys.setprofile(shot)
        try:
            real(sinks_)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(stream_module, "commit_all", commit_all)
    previous = signal.signal(signal.SIGUSR1, mine)
    try:
        with pytest.raises(KeyboardInterrupt):
            cv.stream(kernel(device, "scale"), [np.arange(10, dtype=np.float32)],
                      [str(scratch / "y.npy")], device=device, args=(2.0,))
        assert not (scratch / "y.npy").exists()
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.mark.parametrize("option", ["-o", "--trace"])
def test_the_command_never_writes_a_header_found_through_pyopencl_build_options(
        device, scratch, monkeypatch, capsys, option):
    """README: a file the command reads is never written, even with --force and through a
    link; round twenty-six added the headers the kernel includes to what ``-o`` may not
    name (round twenty-one, to ``--trace`` and ``--plot``). A header found through
    ``PYOPENCL_BUILD_OPTIONS="-I inc"`` (which the build uses, and the kernel cache keys on)
    is not among them: ``-o y.npy --force`` (or ``--trace t.json --force``), a link to
    ``inc/defs.h``, exits 0 and the header holds the .npy (the trace)."""
    from conveyor.cli import main

    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel file")
    monkeypatch.chdir(scratch)
    (scratch / "inc").mkdir()
    header = scratch / "inc" / "defs.h"
    header.write_text("#define K 2.0f\n")
    monkeypatch.setenv("PYOPENCL_BUILD_OPTIONS", f"-I {scratch / 'inc'}")
    (scratch / "k.cl").write_text(
        "#include <defs.h>\n__kernel void sc(__global const float *x, __global float *y,"
        " ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i] * K; }\n")
    np.save(scratch / "x.npy", np.arange(8, dtype=np.float32))
    (scratch / "link").symlink_to("inc/defs.h")
    os.rename(scratch / "link", scratch / ("y.npy" if option == "-o" else "t.json"))
    written = ["-o", "y.npy"] if option == "-o" else ["-o", "out.npy", "--trace", "t.json"]
    code = main(["map", "k.cl", "--kernel", "sc", "-i", "x.npy", *written, "--force", "-q",
                 "--device", device.spec])
    err = capsys.readouterr().err
    assert header.read_bytes() == b"#define K 2.0f\n", "the header was replaced"
    assert code == 2 and "defs.h" in err


@pytest.mark.filterwarnings("ignore:Stored array in format 2.0:UserWarning")
def test_an_npy_header_past_the_limit_is_refused_saying_so(scratch):
    """Round twenty-six read headers up to 1 MiB; past it the refusal is NumPy's, wrapped
    as "is not a .npy file (... adjust `max_header_size` or ... `allow_pickle=True` ...):
    write it with np.save", for a file np.save wrote, naming options cv.npy has not. It
    should say the header is longer than conveyor reads and what to do (fewer fields)."""
    fields = np.dtype([(f"f{i}", "<f4") for i in range(60000)])
    np.save(scratch / "r.npy", np.zeros(2, fields))
    with pytest.raises(cv.InputError) as info:
        cv.npy(scratch / "r.npy")
    message = str(info.value)
    assert "max_header_size" not in message and "write it with np.save" not in message


@pytest.mark.parametrize("make", ["npy_out", "raw_out"])
def test_a_file_output_of_a_nested_sub_array_dtype_is_rows_of_its_elements(device, scratch,
                                                                           make):
    """README: "a sub-array dtype (``np.dtype((np.float32, (2,)))``) makes rows of its
    elements, as ``np.empty`` does". ``np.dtype((np.dtype((np.float32, (2,))), (3,)))`` is
    one NumPy keeps nested (``.subdtype`` is ``(('<f4', (2,)), (3,))``): ``np.empty(4,
    it).shape == (4, 3, 2)`` of float32, and an array output of it streams so. A file output
    of it must be (4, 3, 2) float32 too, or be refused with an InputError before any work;
    today round twenty-six's ValueError comes back ("Changing the dtype to a subarray type
    is only supported if the total itemsize is unchanged", staged.py ``_view``)."""
    nested = np.dtype((np.dtype((np.float32, (2,))), (3,)))
    x = np.arange(4, dtype=np.float32)

    def nothing(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> None:
        return None  # the output's values are left as they are: only its shape is checked

    array = cv.stream(nothing, [x], [nested], device=device, warmup=False).outputs[0]
    assert array.shape == (4, 3, 2) and array.dtype == np.float32
    path = scratch / "y.bin"
    try:
        cv.stream(nothing, [x], [getattr(cv, make)(path, dtype=nested)], device=device,
                  warmup=False)
    except cv.InputError:
        return
    got = np.load(path) if make == "npy_out" else np.fromfile(path, np.float32)
    assert got.dtype == np.float32 and got.size == 24
    if make == "npy_out":
        assert got.shape == (4, 3, 2)


@pytest.mark.parametrize("space", ["\t", "\n"])
def test_a_vector_width_beside_a_tab_or_line_break_is_read(device, space):
    """``_vector_width`` drops spaces only before ``isdigit()`` (9f3cb5f's pattern took any
    ``\\s``): ``ext_vector_type(<tab>4)`` is read as an unknown type, and a kernel with a
    ``v4*`` parameter is refused as "a type conveyor cannot resolve" rather than as the
    float4 vector it is (the message that says to declare ``float*`` and load 4 lanes)."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C")
    source = ("typedef float v4 __attribute__((ext_vector_type(" + space + "4)));\n"
              "__kernel void k(__global const v4 *x, __global v4 *y, ulong offset, ulong n)"
              " { ulong i = get_global_id(0); if (i < n / 4) y[i] = x[i]; }")
    with pytest.raises(cv.InputError, match="a vector type"):
        k = device.compile(source, "k")
        cv.stream(k, [np.zeros(16, np.float32)], [np.float32], device=device)
