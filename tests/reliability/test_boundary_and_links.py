"""A constant ``boundary=`` the input's dtype cannot hold, and output symlinks another user may
have planted.

- A constant is judged on the number, not by casting and comparing back: 1e40 for float32
  overflowed to inf with a RuntimeWarning and was taken; NaN (a float32 value) was refused
  because NaN equals nothing; 2**64 for an integer input was an OverflowError. Accepted
  constants give np.pad's "constant" rows exactly, for every dtype.
- An output or trace path whose symlink lies in a sticky folder anyone may write (/tmp) is
  followed only if the link is ours or the folder owner's (Linux's fs.protected_symlinks):
  ``os.path.realpath`` followed any link, so a link planted by ``nobody`` made a stream run
  by root replace root's file. The rule's tests make such a link with ``os.chown`` and so
  need root (CI runs as root); they skip elsewhere.
"""

from __future__ import annotations

import os
import stat
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # reliakit (and, through it, streamkit)
from reliakit import kernel  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor import files  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.pipeline.halo import Pads  # noqa: E402
from conveyor.pipeline.io import ArraySource  # noqa: E402

# --- constant boundaries ------------------------------------------------------------------

#: y[i] = x[i - 1] + x[i + 1]: the row before and the row after, with halo=1.
NEIGHBOURS = """__kernel void st(__global const float *x, __global float *y, ulong offset,
                                 ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + x[i + 2];
}"""

F16, F32, F64 = (float(np.finfo(t).max) for t in (np.float16, np.float32, np.float64))
NAN, INF = float("nan"), float("inf")

#: Constants each dtype holds (extremes, NaN and ±inf for floats, a float that rounds).
HELD = {
    "float16": [NAN, INF, -INF, F16, -F16, 65519.0, 0.1, 3],
    "float32": [NAN, INF, -INF, F32, -F32, 3.4028235e38, 0.1, 2**64],
    "float64": [NAN, INF, -INF, F64, -F64, 1e300, 0.1, 2**64],
    "int8": [-128, 127, -128.0, 127.0, 0],
    "uint8": [0, 255, 255.0],
    "int64": [-(2**63), 2**63 - 1, -9.223372036854775808e18, 7.0],
    "uint64": [0, 2**64 - 1, 1e19, 2.0**63],
    "bool": [0, 1, 0.0, 1.0],
}

#: (dtype, constant, the range the message must give).
REFUSED = [
    ("float16", 65520.0, r"within ±65504\.0"),  # rounds to inf: past the largest float16
    ("float16", 1e40, r"within ±65504\.0"),
    ("float32", 1e40, r"within ±3\.40282346\d*e\+38"),
    ("float32", -1e39, r"within ±3\.40282346\d*e\+38"),
    ("float32", 3.4028236e38, r"within ±3\.40282346\d*e\+38"),
    ("float32", 2**128, r"within ±3\.40282346\d*e\+38"),
    ("float64", 10**400, r"within ±1\.797\d*e\+308"),
    ("int8", 128, r"whole numbers from -128 to 127"),
    ("int8", -129, r"whole numbers from -128 to 127"),
    ("int8", 2**64, r"whole numbers from -128 to 127"),  # was an OverflowError
    ("int8", 0.5, r"whole numbers from -128 to 127"),
    ("int8", NAN, r"whole numbers from -128 to 127"),
    ("int8", INF, r"whole numbers from -128 to 127"),
    ("uint8", -1, r"whole numbers from 0 to 255"),
    ("uint8", 256, r"whole numbers from 0 to 255"),
    ("uint8", 1e40, r"whole numbers from 0 to 255"),
    ("int64", 2**63, r"from -9223372036854775808 to 9223372036854775807"),
    ("int64", -(2**63) - 1, r"from -9223372036854775808 to 9223372036854775807"),
    ("int64", 9.3e18, r"from -9223372036854775808 to 9223372036854775807"),
    ("uint64", -1, r"from 0 to 18446744073709551615"),
    ("uint64", 2**64, r"from 0 to 18446744073709551615"),
    ("uint64", 1.5, r"from 0 to 18446744073709551615"),
    ("bool", 2, r": 0 or 1\)"),
    ("bool", -1, r": 0 or 1\)"),
    ("bool", 0.5, r": 0 or 1\)"),
]


def _pads(x: np.ndarray, h: int, boundary) -> tuple[np.ndarray, np.ndarray]:
    pads = Pads(ArraySource(x, "input 0"), len(x), h, boundary)
    return pads.front(), pads.back()


def _case_id(value) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:6]}...({len(text)} digits)"


@pytest.mark.parametrize(("dtype", "value"),
                         [(d, v) for d, values in HELD.items() for v in values],
                         ids=[f"{d}-{_case_id(v)}" for d, values in HELD.items()
                              for v in values])
def test_held_constants_give_np_pads_rows(dtype, value):
    x = np.arange(12, dtype=np.int64).reshape(6, 2).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from a cast, ever
        front, back = _pads(x, 3, value)
        padded = np.pad(x, ((3, 3), (0, 0)), mode="constant", constant_values=value)
    assert front.dtype == back.dtype == x.dtype
    np.testing.assert_array_equal(front, padded[:3], strict=True)
    np.testing.assert_array_equal(back, padded[-3:], strict=True)


@pytest.mark.parametrize(("dtype", "value", "held"), REFUSED,
                         ids=[f"{d}-{_case_id(v)}" for d, v, _ in REFUSED])
def test_constants_the_dtype_cannot_hold_are_refused(dtype, value, held):
    x = np.zeros((6, 2), dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=rf"boundary=.* is not a {dtype} value \(input 0 "
                                             rf"holds {dtype}.*{held}"):
            _pads(x, 2, value)


@pytest.mark.parametrize("pinned", [False, True], ids=["staged", "pinned"])
def test_a_stream_pads_with_nan_and_inf_and_refuses_overflow(device, pinned):
    k = device.compile(cv.portable(NEIGHBOURS), "st")
    x = np.arange(1, 301, dtype=np.float32)
    source = cv.pinned.asarray(x, device=device) if pinned else x
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for value in (NAN, INF, -INF, F32, -F32):
                y = np.zeros_like(x)
                cv.stream(k, [source], [y], halo=1, boundary=value, device=device,
                          block_bytes=4 * 64, zero_copy=False)
                p = np.pad(x, 1, mode="constant", constant_values=value)
                np.testing.assert_array_equal(y, p[:-2] + p[2:], strict=True)
            for value in (1e40, -1e39):
                y = np.full_like(x, 5)
                with pytest.raises(InputError, match=r"is not a float32 value .*within "
                                                     r"±3\.4028234\d*e\+38; NaN and ±inf"):
                    cv.stream(k, [source], [y], halo=1, boundary=value, device=device,
                              block_bytes=4 * 64, zero_copy=False)
                assert (y == 5).all()
    finally:
        del source


def test_an_integer_stream_takes_its_extremes_and_refuses_past_them(device):
    x = np.arange(1000, dtype=np.int64) % 251
    y = np.zeros_like(x)
    low = -(2**63)  # with x >= 0, the sums below never overflow (signed overflow is UB in C)
    cv.stream(kernel(device, "sten", np.int64), [x], [y], device=device, args=(1, 1), halo=1,
              boundary=low, block_bytes=8 * 64)
    p = np.pad(x, 1, mode="constant", constant_values=low)
    np.testing.assert_array_equal(y, p[:-2] + p[1:-1] + p[2:], strict=True)
    y = np.full_like(x, 5)
    with pytest.raises(InputError, match=r"boundary=-9223372036854775809 is not a int64 value"):
        cv.stream(kernel(device, "sten", np.int64), [x], [y], device=device, args=(1, 1),
                  halo=1, boundary=low - 1)
    assert (y == 5).all()


# --- output symlinks ------------------------------------------------------------------------

NOBODY = 65534  # another user (who need not exist: the rule compares numbers)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A sticky folder anyone may write (mode 1777, like /tmp), owned by root."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("making a symlink owned by another user needs root (CI runs as root)")
    folder = tmp_path / "share"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def _plant(link: Path, target: Path, uid: int = NOBODY) -> Path:
    """``link`` -> ``target``, owned by ``uid`` (the link itself, not its target)."""
    link.symlink_to(target)
    os.chown(link, uid, uid, follow_symlinks=False)
    assert os.lstat(link).st_uid == uid
    return link


def _precious(tmp_path: Path) -> tuple[Path, bytes]:
    """A file of ours (mode 0600) that a planted link points at, and its bytes."""
    mine = tmp_path / "mine.npy"
    np.save(mine, np.arange(7, dtype=np.float64))
    mine.chmod(0o600)
    return mine, mine.read_bytes()


def _parts(*folders: Path) -> list[str]:
    return sorted(p.name for f in folders for p in f.iterdir() if p.name.endswith(".part"))


REFUSAL = r"is a symlink in .*share.*its owner \(.*uid 65534\) is neither you.*protected_symlinks"


def test_a_link_planted_in_a_sticky_folder_is_not_followed(device, tmp_path, shared):
    mine, before = _precious(tmp_path)
    link = _plant(shared / "out.npy", mine)
    with pytest.raises(InputError, match=REFUSAL + r".*Write to another path"):
        cv.stream(kernel(device, "ident"), [np.arange(4, dtype=np.float32)], [str(link)],
                  device=device)
    assert mine.read_bytes() == before and stat.S_IMODE(mine.stat().st_mode) == 0o600
    assert link.is_symlink() and _parts(tmp_path, shared) == []


@pytest.mark.parametrize("layout", ["ours to planted", "ours in the folder to planted",
                                    "planted folder link", "planted relative link"])
def test_every_link_of_a_chain_is_checked(tmp_path, shared, layout):
    mine, before = _precious(tmp_path)
    if layout == "ours to planted":  # our link, outside, to a planted one
        _plant(shared / "out.npy", mine)
        path = tmp_path / "ours.npy"
        path.symlink_to(shared / "out.npy")
    elif layout == "ours in the folder to planted":  # ours is allowed, the next is not
        _plant(shared / "theirs.npy", mine)
        path = _plant(shared / "out.npy", shared / "theirs.npy", uid=0)
    elif layout == "planted folder link":  # a link in the middle of the path
        _plant(shared / "dir", tmp_path)
        path = shared / "dir" / "mine.npy"
    else:
        _plant(shared / "up", Path(".."))
        path = shared / "up" / "mine.npy"
    with pytest.raises(InputError, match=REFUSAL):
        cv.npy_out(path)
    with pytest.raises(InputError, match=REFUSAL):
        files.output_target(path, "output 0")
    assert mine.read_bytes() == before and _parts(tmp_path, shared) == []


@pytest.mark.parametrize("case", ["ours", "the folder owner's", "not sticky", "not writable"])
def test_links_the_rule_allows_are_written_through(device, tmp_path, shared, case):
    mine, _ = _precious(tmp_path)
    folder, uid = shared, NOBODY
    if case == "ours":
        uid = 0
    elif case == "the folder owner's":
        os.chown(folder, NOBODY, NOBODY)
    elif case == "not sticky":
        folder.chmod(0o777)
    else:  # sticky, but only its owner and group write it
        folder.chmod(0o1770)
    link = _plant(folder / "out.npy", mine, uid)
    x = np.arange(4, dtype=np.float32)
    report = cv.stream(kernel(device, "ident"), [x], [str(link)], device=device)
    assert report.outputs == [str(link)] and link.is_symlink()
    np.testing.assert_array_equal(np.load(mine), x, strict=True)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o600 and _parts(tmp_path, folder) == []


def test_a_planted_trace_link_is_refused_before_any_work(device, tmp_path, shared):
    mine, before = _precious(tmp_path)
    link = _plant(shared / "run.json", mine)
    x, y = np.arange(4, dtype=np.float32), np.full(4, 5, np.float32)
    with pytest.raises(InputError, match=r"trace=.*" + REFUSAL):
        cv.stream(kernel(device, "ident"), [x], [y], device=device, trace=str(link))
    assert (y == 5).all() and mine.read_bytes() == before


def test_atomic_write_refuses_a_planted_link_with_an_os_error(tmp_path, shared):
    # The trace is written after the work, where only an OSError is caught (and warned about):
    # a link planted during the stream must not turn into an InputError that loses the report.
    mine, before = _precious(tmp_path)
    link = _plant(shared / "run.json", mine)
    with pytest.raises(PermissionError, match=REFUSAL):
        files.atomic_write(link, lambda handle: handle.write("{}"))
    assert mine.read_bytes() == before and _parts(tmp_path, shared) == []


def test_a_plot_is_written_atomically_and_refuses_a_planted_link(device, tmp_path, shared):
    pytest.importorskip("matplotlib")
    x, y = np.arange(4096, dtype=np.float32), np.zeros(4096, np.float32)
    report = cv.stream(kernel(device, "ident"), [x], [y], device=device, block_bytes=4096)
    mine, before = _precious(tmp_path)
    link = _plant(shared / "run.png", mine)
    # An InputError, as for trace=: timeline.plot checks its path (output_target) first.
    with pytest.raises(InputError, match=REFUSAL):
        report.timeline.plot(link)
    assert mine.read_bytes() == before and _parts(tmp_path, shared) == []
    ours = shared / "ours.png"  # an ordinary path: a whole PNG, no part left
    report.timeline.plot(ours)
    assert ours.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and _parts(shared) == []


def test_the_command_refuses_a_planted_output_link(device, tmp_path, shared, capsys):
    from conveyor.cli import main
    from conveyor.kernels.portable import PRELUDE

    mine, before = _precious(tmp_path)
    link = _plant(shared / "out.npy", mine)
    source = tmp_path / ("k.cu" if device.backend == "cuda" else "k.cl")
    source.write_text(PRELUDE + """
__kernel void ident(__global const float *x, __global float *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) r[i] = x[i];
}""")
    np.save(tmp_path / "x.npy", np.arange(4, dtype=np.float32))
    code = main(["map", str(source), "--kernel", "ident", "-i", str(tmp_path / "x.npy"),
                 "-o", str(link), "--force", "--device", device.spec, "--quiet"])
    assert code == 2 and "fs.protected_symlinks" in capsys.readouterr().err
    assert mine.read_bytes() == before and link.is_symlink()


def test_resolve_is_realpath_for_ordinary_links(tmp_path):
    # No root needed: away from sticky folders, every link is followed as realpath follows it.
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").touch()
    (tmp_path / "lb").symlink_to("a/b")
    (tmp_path / "a" / "b" / "up").symlink_to("../../c")
    (tmp_path / "abs").symlink_to(tmp_path / "lb")
    (tmp_path / "dangling").symlink_to("missing/x")
    (tmp_path / "self").symlink_to(".")
    (tmp_path / "lb" / "lf").symlink_to("f")
    for name in ("lb/f", "lb/lf", "lb/up/new.npy", "abs/../a", "abs/lf", "dangling",
                 "dangling/y", "self/self/lb/../b/f", "lb/f/", "new.npy", "./a//b/./lf"):
        path = str(tmp_path / name) + ("/" if name.endswith("/") else "")
        assert files.resolve(path, "x") == Path(os.path.realpath(path)), name
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    with pytest.raises(InputError, match="more than 40 symlinks"):
        files.output_target(tmp_path / "loop1", "output 0")
