"""Halo boundaries (issue 14 item 4): ``boundary=`` as Dask's map_overlap names them, each
exactly np.pad's rows ("nearest" = "edge", "reflect" = "symmetric", "periodic" = "wrap", a
number = "constant"), 1-D and N-D on axis 0, staged and pinned, short and long halos."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import kernel

import conveyor as cv
from conveyor.errors import InputError
from conveyor.memory import hostmem
from conveyor.pipeline.halo import PAD_MODES

BOUNDARIES = ["nearest", "reflect", "periodic", 7.0]


def _reference(x, halo, boundary):
    """The sten kernel (sum of rows i-h..i+h) over np.pad's rows."""
    mode = PAD_MODES.get(boundary, "constant") if isinstance(boundary, str) else "constant"
    kw = {"constant_values": boundary} if mode == "constant" else {}
    width = [(halo, halo)] + [(0, 0)] * (x.ndim - 1)
    padded = np.pad(x, width, mode=mode, **kw)
    return sum(padded[k : k + len(x)] for k in range(2 * halo + 1)).astype(x.dtype)


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("pinned", [False, True], ids=["staged", "pinned"])
@pytest.mark.parametrize(("shape", "halo"), [((1000,), 3), ((300, 3), 2), ((10, 2), 25)])
def test_boundary_rows_are_np_pads(device, boundary, pinned, shape, halo):
    x = (np.arange(np.prod(shape), dtype=np.float32) % 97).reshape(shape)
    y = np.zeros_like(x)
    cols = int(np.prod(shape[1:]))
    source = cv.pinned.asarray(x, device=device) if pinned else x
    row_bytes = cols * 4
    cv.stream(kernel(device, "sten"), [source], [y], device=device, args=(cols, halo),
              halo=halo, boundary=boundary, block_bytes=max(row_bytes * 64, row_bytes * halo),
              zero_copy=False)
    np.testing.assert_array_equal(y, _reference(x, halo, boundary))
    del source


def test_reflect_from_an_iterable_and_a_file(device, tmp_path):
    x = (np.arange(2000, dtype=np.float32) % 13).reshape(-1, 2)
    np.save(tmp_path / "x.npy", x)
    for source in (cv.iterate(np.array_split(x, 7), length=len(x)), str(tmp_path / "x.npy")):
        y = np.zeros_like(x)
        cv.stream(kernel(device, "sten"), [source], [y], device=device, args=(2, 4), halo=4,
                  boundary="reflect", block_bytes=8 * 100)
        np.testing.assert_array_equal(y, _reference(x, 4, "reflect"))


@pytest.mark.parametrize(("boundary", "message"), [
    ("mirror", r"boundary='mirror'.*'nearest'.*'reflect'.*'periodic'.*number"),
    (True, r"boundary=True"),
    (0.5, r"boundary=0.5 is not a int32 value"),
])
def test_bad_boundaries_are_input_errors(device, boundary, message):
    x = np.arange(100, dtype=np.int32)
    y = np.full_like(x, 5)
    with pytest.raises(InputError, match=message):
        cv.stream(kernel(device, "sten", np.int32), [x], [y], device=device, args=(1, 2),
                  halo=2, boundary=boundary)
    assert (y == 5).all()


def test_periodic_from_an_iterable_is_refused(device):
    x = np.arange(100, dtype=np.float32)
    with pytest.raises(InputError, match=r"periodic.*read once, in order"):
        cv.stream(kernel(device, "sten"), [cv.iterate([x], length=100)], [np.zeros_like(x)],
                  device=device, args=(1, 2), halo=2, boundary="periodic")


def test_a_halo_beyond_host_memory_is_an_input_error_not_a_kill(device):
    """halo=10**9 on 1000 rows had the process killed for memory (staging ring, device
    buffers in host memory, pad rows): now an InputError before anything is allocated."""
    host = hostmem.total()
    if host is None:
        pytest.skip("no MemTotal in /proc/meminfo")
    x = np.arange(1000, dtype=np.float32)
    k = kernel(device, "ident")
    # Pads alone ~ 2 * halo * 12 bytes = host; a slot's buffer 8 * halo = host / 3. The
    # planner may refuse first (the device's memory limit leaves no room for a block: PoCL's
    # limit is a share of the host's memory); either way nothing is allocated.
    with pytest.raises(InputError, match="host memory|memory limit|a block"):
        cv.stream(k, [x], [np.float32], device=device, halo=host // 24)


def test_a_stream_needing_more_than_the_host_has_is_refused_before_any_work(device,
                                                                           monkeypatch):
    """The host-memory check itself, on every device: a host of 1 MiB (hostmem.total wrapped)
    and a stream whose staging ring alone holds more."""
    real_total = hostmem.total
    monkeypatch.setattr(hostmem, "total", lambda: 1 << 20 if real_total() else None)
    x = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    before = device.pinned_pool.stats().held_bytes, device.memory_pool.stats().held_bytes
    with pytest.raises(InputError, match=r"bytes of host memory .* more than the host.s 1048576"):
        cv.stream(kernel(device, "ident"), [x], [np.float32], device=device,
                  block_bytes=1 << 20, zero_copy=False)
    after = device.pinned_pool.stats().held_bytes, device.memory_pool.stats().held_bytes
    assert after == before


# -- a window's halo given beside it (halo.rows_around, Source.beside: conveyor.dask) --------
WINDOWS = [(0, 40), (3, 50), (37, 100), (48, 51), (98, 100), (0, 100)]


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("pinned", [False, True], ids=["staged", "pinned"])
def test_a_window_streamed_with_its_neighbours_given_equals_the_whole_streams_rows(
        device, boundary, pinned):
    """Rows lo:hi of x streamed alone, the halo rows around them given beside them: exactly
    the rows lo:hi of the stream of all of x, for windows at either end, inside, shorter
    than the halo and the whole array."""
    from conveyor.pipeline.halo import rows_around
    from conveyor.pipeline.io import ArraySource

    halo = 5
    x = (np.arange(100, dtype=np.float32) * 7) % 31
    whole = ArraySource(x, "x")
    source_x = cv.pinned.asarray(x, device=device) if pinned else x
    expected = _reference(x, halo, boundary)
    for lo, hi in WINDOWS:
        window = ArraySource(source_x[lo:hi], "input 0")
        window.beside = rows_around(whole, lo, hi, halo, boundary)
        y = np.zeros(hi - lo, np.float32)
        cv.stream(kernel(device, "sten"), [window], [y], device=device, args=(1, halo),
                  halo=halo, boundary=boundary, block_bytes=64, zero_copy=False)
        np.testing.assert_array_equal(y, expected[lo:hi], err_msg=f"rows {lo}:{hi}")


def test_rows_around_reads_each_run_of_rows_once_and_pads_past_both_ends():
    from conveyor.pipeline.halo import rows_around
    from conveyor.pipeline.io import ArraySource

    x = np.arange(12, dtype=np.int64).reshape(6, 2)
    for boundary in BOUNDARIES[:3]:
        padded = np.pad(x, [(4, 4), (0, 0)], mode=PAD_MODES[boundary])
        for lo, hi in [(1, 3), (2, 5), (3, 6), (0, 6), (5, 6)]:
            front, back = rows_around(ArraySource(x), lo, hi, 4, boundary)
            np.testing.assert_array_equal(front, padded[lo : lo + 4])
            np.testing.assert_array_equal(back, padded[hi + 4 : hi + 8])
    front, _ = rows_around(ArraySource(x), 2, 4, 3, -1)
    np.testing.assert_array_equal(front, [[-1, -1], [0, 1], [2, 3]])


def test_rows_given_beside_that_do_not_fit_the_halo_are_input_errors(device):
    from conveyor.pipeline.io import ArraySource

    x = np.arange(10, dtype=np.float32)
    for front in (np.zeros(2, np.float32), np.zeros(3, np.float64)):
        window = ArraySource(x, "input 0")
        window.beside = (front, None)
        with pytest.raises(InputError, match="the rows given before it"):
            cv.stream(kernel(device, "sten"), [window], [np.zeros_like(x)], device=device,
                      args=(1, 3), halo=3)
