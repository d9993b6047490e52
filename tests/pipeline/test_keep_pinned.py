"""Issue 17, iterative use: pageable inputs and outputs kept page-locked between streams
(cv.keep_pinned / keep_pinned=True), within a budget, released on request, on device close,
and when the array is freed."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pytest
from streamkit import add_reference, data, kernel, record_paths, stencil_reference

import conveyor as cv
from conveyor.memory import keep
from conveyor.pipeline import paths as paths_module

ROWS = 64 * 1024
BLOCK = 16 * 1024


@pytest.fixture(autouse=True)
def nothing_kept_before_or_after():
    keep.release_pinned()
    old = keep._budget
    yield
    keep.release_pinned()
    keep._budget = old
    assert keep.kept_bytes() == 0


def _paths(device, monkeypatch, run):
    """Run ``run()`` (one stream); return the classes of its input and output paths."""
    real = paths_module.choose
    chosen = record_paths(monkeypatch)
    try:
        run()
    finally:
        monkeypatch.setattr(paths_module, "choose", real)
    return chosen[0]


def _stream(device, monkeypatch, a, b, c, **kw):
    """Stream an add; return the input path classes chosen."""
    return _both(device, monkeypatch, a, b, c, **kw)[0]


def _both(device, monkeypatch, a, b, c, **kw):
    """Stream an add; return the input and the output path classes chosen."""
    return _paths(device, monkeypatch, lambda: cv.stream(
        kernel(device, "add"), [a, b], [c], device=device, block_bytes=BLOCK, zero_copy=False,
        **kw))


def test_kept_inputs_go_direct_and_stay_exact_when_the_host_changes_them(device, monkeypatch):
    a, b = data((ROWS,), np.float32, 1), data((ROWS,), np.float32, 2)
    c = np.empty_like(a)
    assert _stream(device, monkeypatch, a, b, c) == ["StagedIn"]  # not kept: staged
    assert _stream(device, monkeypatch, a, b, c, keep_pinned=True) == ["DirectIn", "_Owner"]
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert keep.kept_bytes() == a.nbytes + b.nbytes + c.nbytes  # the output too
    for step in range(3):  # later passes need no option, and see the host's changes
        a += np.float32(1)
        assert _stream(device, monkeypatch, a, b, c) == ["DirectIn", "_Owner"]
        np.testing.assert_array_equal(c, add_reference(a, b), err_msg=f"pass {step}")


def test_kept_outputs_are_written_directly_and_exactly(device, monkeypatch):
    a, b = data((ROWS,), np.float32, 4), data((ROWS,), np.float32, 5)
    c = np.full_like(a, -1)
    assert _both(device, monkeypatch, a, b, c) == (["StagedIn"], ["StagedOut"])
    assert cv.keep_pinned(c, device=device)  # only the output
    for step in range(3):
        c[:] = -1  # the host writes it between streams: the stream's rows still win
        b += np.float32(step)
        assert _both(device, monkeypatch, a, b, c) == (["StagedIn", "_Owner"], ["DirectOut"])
        np.testing.assert_array_equal(c, add_reference(a, b), err_msg=f"pass {step}")


def test_an_output_kept_read_only_is_staged(device, monkeypatch):
    a, b = data((ROWS,), np.float32, 6), data((ROWS,), np.float32, 7)
    c = np.zeros_like(a)
    c.flags.writeable = False
    assert cv.keep_pinned(c, device=device)  # registered for reading only
    c.flags.writeable = True
    assert keep.find(device, c) is not None and keep.find(device, c, written=True) is None
    assert _both(device, monkeypatch, a, b, c)[1] == ["StagedOut"]
    np.testing.assert_array_equal(c, add_reference(a, b))


def test_outputs_conveyor_allocates_are_not_kept(device):
    a, b = data((ROWS,), np.float32, 8), data((ROWS,), np.float32, 9)
    report = cv.stream(kernel(device, "add"), [a, b], [np.float32], device=device,
                       block_bytes=BLOCK, zero_copy=False, keep_pinned=True)
    np.testing.assert_array_equal(report.outputs[0], add_reference(a, b))
    assert keep.kept_bytes() == a.nbytes + b.nbytes


def test_a_kept_array_streamed_in_place_and_with_a_halo_stays_exact(device, monkeypatch):
    x = data((ROWS,), np.float32, 11)
    expected = x.copy()
    step = kernel(device, "sten")
    for rep in range(3):
        expected = stencil_reference(expected, 2)
        got = _paths(device, monkeypatch, lambda: cv.stream(
            step, [x], [x], device=device, block_bytes=BLOCK, halo=2,
            args=(np.uint64(1), np.uint64(2)), zero_copy=False, keep_pinned=True))
        assert got == (["DirectIn", "_Owner", "_Owner"], ["DirectOut"]), got
        np.testing.assert_array_equal(x, expected, err_msg=f"pass {rep}")
    assert keep.kept_bytes() == x.nbytes


def test_a_halo_stream_reads_kept_inputs_exactly(device):
    x = data((ROWS,), np.float32, 3)
    assert cv.keep_pinned(x, device=device)
    y = np.empty_like(x)
    cv.stream(kernel(device, "sten"), [x], [y], device=device, block_bytes=BLOCK, halo=2,
              args=(np.uint64(1), np.uint64(2)), zero_copy=False)
    np.testing.assert_array_equal(y, stencil_reference(x, 2))


def test_the_budget_releases_the_least_recently_used(device):
    arrays = [data((ROWS,), np.float32, 10 + i) for i in range(3)]
    cv.configure(pinned_budget=2 * arrays[0].nbytes)
    assert cv.keep_pinned(arrays[0], device=device)
    assert cv.keep_pinned(arrays[1], device=device)
    assert cv.keep_pinned(arrays[0], device=device)  # used again: now the most recent
    assert cv.keep_pinned(arrays[2], device=device)  # releases arrays[1], the oldest
    assert keep.find(device, arrays[0]) is not None
    assert keep.find(device, arrays[1]) is None
    assert keep.find(device, arrays[2]) is not None
    assert keep.kept_bytes() == 2 * arrays[0].nbytes
    big = np.zeros(3 * ROWS, np.float32)
    assert not cv.keep_pinned(big, device=device)  # larger than the budget: not kept
    cv.configure(pinned_budget=arrays[0].nbytes)  # lowering it releases at once
    assert keep.kept_bytes() == arrays[0].nbytes
    assert cv.configure()["pinned_budget"] == arrays[0].nbytes


def test_a_freed_array_does_not_keep_its_registration(device):
    a = data((ROWS,), np.float32, 20)
    assert cv.keep_pinned(a, device=device)
    assert keep.kept_bytes() == a.nbytes
    del a
    gc.collect()
    assert keep.kept_bytes() == 0


def test_a_view_keeps_the_registration_until_its_base_is_freed(device):
    base = data((2 * ROWS,), np.float32, 21)
    view = base[:ROWS]
    assert cv.keep_pinned(view, device=device)
    del view
    gc.collect()
    assert keep.kept_bytes() == ROWS * 4  # the memory is still there: so is the lock
    del base
    gc.collect()
    assert keep.kept_bytes() == 0


def test_release_by_array_and_all(device):
    a, b = data((ROWS,), np.float32, 22), data((ROWS,), np.float32, 23)
    assert cv.keep_pinned(a, device=device) and cv.keep_pinned(b, device=device)
    assert cv.release_pinned(a) == a.nbytes
    assert keep.find(device, a) is None and keep.find(device, b) is not None
    assert cv.release_pinned() == b.nbytes
    assert keep.kept_bytes() == 0


def test_a_release_during_a_stream_waits_for_the_stream(device):
    a = data((ROWS,), np.float32, 24)
    assert cv.keep_pinned(a, device=device)
    found, holds = keep.hold(device, [a])
    assert found == [True]
    cv.release_pinned(a)
    assert keep.kept_bytes() == a.nbytes  # held: released when the stream lets go
    holds.close()
    assert keep.kept_bytes() == 0


def test_wrong_arguments_say_what_to_pass(device):
    with pytest.raises(cv.InputError, match="NumPy array"):
        cv.keep_pinned([1, 2, 3], device=device)  # type: ignore[arg-type]
    with pytest.raises(cv.InputError, match="C-contiguous"):
        cv.keep_pinned(np.zeros((8, 8), np.float32)[:, ::2], device=device)
    with pytest.raises(cv.InputError, match="pinned_budget"):
        cv.configure(pinned_budget=-1)
    assert cv.configure(pinned_budget="1MiB")["pinned_budget"] == 2**20


def test_closing_a_device_releases_what_is_kept_on_it():
    code = (
        "import numpy as np, conveyor as cv\n"
        "from conveyor.memory import keep\n"
        "dev = cv.device('opencl')\n"
        "a = np.ones(1 << 16, np.float32)\n"
        "assert cv.keep_pinned(a, device=dev)\n"
        "dev.close()\n"
        "print(keep.kept_bytes())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "0"


def test_keep_and_release_take_a_device_spec_string(device):
    # A spec string was looked up as a Device inside a try: keep_pinned returned False
    # ("could not be kept") and release_pinned released nothing.
    a = np.ones(100_000, np.float32)
    assert cv.keep_pinned(a, device=device.spec)
    assert keep.find(device, a) is not None
    assert cv.release_pinned(a, device=device.spec) == a.nbytes
    with pytest.raises(cv.InputError, match="pass a Device or a spec string"):
        cv.keep_pinned(a, device=3)


def test_an_array_pinned_for_another_context_is_copied_directly_by_this_one(device):
    if device.backend != "opencl":
        pytest.skip("a second context of one device is an OpenCL notion")
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    other = opencl.Device(device.cl_device, platform, index)
    try:
        p = cv.pinned.empty(100_000, np.float32, device=other)
        p[:] = np.arange(100_000, dtype=np.float32)
        # Another context of the same platform copies it directly (blocking copies): it is
        # kept already, and nothing is registered for it.
        assert cv.keep_pinned(p, device=device)
        assert keep.find(device, p) is None
        out = np.zeros_like(p)
        report = cv.stream(kernel(device, "ident"), [p], [out], device=device,
                           block_bytes=40_000, zero_copy=False)
        np.testing.assert_array_equal(out, p)
        assert "stage-in" not in {span.lane for span in report.timeline.spans}
        del p
        gc.collect()
    finally:
        other.close()


def test_only_the_arrays_a_stream_reads_are_synced_to_the_driver(device, monkeypatch):
    # host_changed (OpenCL: map for writing and unmap, an upload of the whole array where the
    # driver keeps a copy) was called for kept outputs too, whose every byte the stream writes.
    a, b = data((ROWS,), np.float32, 12), data((ROWS,), np.float32, 13)
    c = np.zeros_like(a)
    for array in (a, b, c):
        assert cv.keep_pinned(array, device=device)
    synced: list[int] = []
    for array in (a, b, c):
        registration = keep.find(device, array).registration
        monkeypatch.setattr(registration, "host_changed",
                            lambda n=array.nbytes: synced.append(n), raising=False)
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=BLOCK,
              zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert synced == [a.nbytes, b.nbytes]


def test_closing_the_device_waits_for_the_streams_that_hold_a_registration(device):
    # device.close() released a registration a running stream still copied from (found by
    # trying it: the rest of the stream fell back to pageable copies; on CUDA the memory
    # would have been unregistered under copies in flight).
    a, b = data((ROWS,), np.float32, 30), data((ROWS,), np.float32, 31)
    assert cv.keep_pinned(a, device=device) and cv.keep_pinned(b, device=device)
    found, holds = keep.hold(device, [a])
    assert found == [True]
    keep.release_device(device)
    assert keep.kept_bytes() == a.nbytes  # b went at once; a when the stream lets go
    assert keep.hold(device, [a])[0] == [False]  # no new stream takes it
    holds.close()
    assert keep.kept_bytes() == 0


@pytest.mark.parametrize("wrong", [5, [1.0, 2.0], "x"], ids=["int", "list", "str"])
def test_release_pinned_of_something_that_is_no_array_says_what_to_pass(wrong):
    """release_pinned(5) matched nothing and returned 0, as if the release had worked."""
    with pytest.raises(cv.InputError, match="takes the NumPy array given to keep_pinned"):
        cv.release_pinned(wrong)
