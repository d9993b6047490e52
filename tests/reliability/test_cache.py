"""Reliability of the kernel cache across processes, crashes, changed inputs and hostile
directories (tests/kernels/test_cache.py covers the key recipe, entry format and the basic
directory checks; this extends it).

Kernels are built by the real device compiler; other processes are real (spawn); a killed
writer is a real process killed with SIGKILL in the middle of its write.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.kernels import build
from conveyor.kernels.cache import (
    STALE_TMP_SECONDS,
    KernelCache,
    cache_key,
    decode_entry,
    encode_entry,
)
from conveyor.kernels.portable import portable

SOURCE = portable("""
#ifndef FACTOR
#define FACTOR 3.0f
#endif
__kernel void scale(__global const float *a, __global float *out, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a[i] * FACTOR;
}
""")
HEADER_SOURCE = portable("""
#include "conveyor_factor.h"
__kernel void scale(__global const float *a, __global float *out, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a[i] * FACTOR;
}
""")
WORKERS = 8


pytestmark = pytest.mark.usefixtures("fresh_memo")  # tests/conftest.py


def use_dir(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(path))


def scaled(device: cv.Device, kernel: cv.Kernel) -> np.ndarray:
    """What ``kernel`` makes of 0, 1, 2, ... (256 floats)."""
    a = np.arange(256, dtype=np.float32)
    out = np.zeros_like(a)
    cv.stream(kernel, [a], [out], device=device)
    return out / np.maximum(a, 1)  # the factor, element by element (element 0 gives 0)


def factor_of(device: cv.Device, source: str = SOURCE, options: tuple[str, ...] = ()) -> float:
    """Compile ``source`` through the configured cache and return the factor it applies."""
    values = scaled(device, device.compile(source, "scale", options))
    assert np.all(values[1:] == values[1])
    return float(values[1])


def entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.endswith(".bin")
                  and not p.name.startswith("."))


def temp_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith(".tmp-"))


def runtime_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


# -- many processes ---------------------------------------------------------------------------
def _compile_in_child(spec: str, source: str, barrier, results) -> None:  # a spawned process
    dev = cv.device(spec)
    barrier.wait(timeout=60)
    kernel = dev.compile(source, "scale")
    a = np.arange(64, dtype=np.float32)
    out = np.zeros_like(a)
    cv.stream(kernel, [a], [out], device=dev)
    results.put((os.getpid(), bool(np.array_equal(out, a * np.float32(3)))))


def _race(spec: str, source: str) -> list[int | None]:
    """WORKERS spawned processes build ``source`` at one moment; their exit codes."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    children = [ctx.Process(target=_compile_in_child, args=(spec, source, barrier, results))
                for _ in range(WORKERS)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
    codes = [child.exitcode for child in children]
    outcomes = [results.get(timeout=5) for _ in range(codes.count(0))]
    assert sorted(ok for _, ok in outcomes) == [True] * codes.count(0)
    return codes


RACE_ROUNDS = 3


@pytest.mark.parametrize("disk_cache", [True, False], ids=["cache", "no-cache"])
def test_eight_processes_compile_one_kernel_at_once(device, tmp_path, monkeypatch, disk_cache):
    # A source no process has built before, and (on PoCL) a cold PoCL cache of its own: the
    # race of issue 13 (PoCL aborting in its binary cache) needs both, and a warm PoCL cache
    # hid it. Several rounds, because one round can pass by luck.
    for round_ in range(RACE_ROUNDS):
        path = tmp_path / f"cache-{round_}"
        use_dir(monkeypatch, path)  # inherited by the children
        if not disk_cache:
            monkeypatch.setenv("CONVEYOR_NO_CACHE", "1")
        monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / f"pocl-{round_}"))
        source = SOURCE + f"\n// round {round_} of {tmp_path.name} {os.getpid()}\n"
        assert _race(device.spec, source) == [0] * WORKERS, f"round {round_}"
        if disk_cache:
            assert len(entries(path)) == 1 and temp_files(path) == []
            # The binary, its kernel's signature (written by each process, replaced whole) and
            # the locks folder: nothing else.
            sigs = [p.name for p in path.iterdir() if p.name.endswith(".sig")]
            assert len(sigs) == 1 and sigs[0].startswith(entries(path)[0][:-4] + "-")
            assert sorted(p.name for p in path.iterdir()) == sorted(entries(path) + sigs
                                                                     + ["locks"])
        else:
            assert not path.exists()


def test_unchanged_second_run_in_a_new_process_hits(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(1), ctx.Queue()
    child = ctx.Process(target=_compile_in_child, args=(device.spec, SOURCE, barrier, results))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0 and results.get(timeout=5)[1]
    assert factor_of(device) == 3.0
    cache = build.default_cache()
    assert cache is not None
    assert (cache.hits, cache.misses, cache.stores) == (1, 0, 0)


# -- a killed writer --------------------------------------------------------------------------
def _write_and_hang(spec: str) -> None:  # runs in a spawned process, killed mid-write
    def hang(fd: int) -> None:
        time.sleep(600)

    os.fsync = hang  # the entry is written to its temporary file, never renamed into place
    cv.device(spec).compile(SOURCE, "scale")


def test_temp_file_of_a_killed_writer_is_ignored(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    child = multiprocessing.get_context("spawn").Process(target=_write_and_hang,
                                                         args=(device.spec,))
    child.start()
    deadline = time.monotonic() + 120
    while not (path.is_dir() and temp_files(path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=30)
    assert child.exitcode == -signal.SIGKILL
    (left,) = temp_files(path)
    assert entries(path) == []
    assert factor_of(device) == 3.0  # a miss: built, stored beside the leftover
    cache = build.default_cache()
    assert cache is not None and (cache.hits, cache.stores) == (0, 1)
    assert len(entries(path)) == 1 and cache.info().entries == 1
    build.clear_memo()
    assert factor_of(device) == 3.0 and cache.hits == 1
    old = time.time() - 2 * STALE_TMP_SECONDS
    os.utime(path / left, (old, old))
    cache.clear()
    assert [p.name for p in path.iterdir()] == ["locks"]  # lock files stay (buildlock.py)


@pytest.mark.parametrize("length", ["empty", "header-only"])
def test_entry_cut_short_by_a_crash_is_rebuilt(device, tmp_path, monkeypatch, length):
    # tests/kernels covers half an entry and a flipped byte; a writer without rename could
    # also leave a file with no bytes, or only the header.
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    factor_of(device)
    (entry,) = path.glob("*.bin")
    entry.write_bytes(b"" if length == "empty" else entry.read_bytes()[:48])
    build.clear_memo()
    assert factor_of(device) == 3.0
    cache = build.default_cache()
    assert cache is not None and (cache.hits, cache.discarded) == (0, 1)
    assert decode_entry(entry.read_bytes(), entry.stem) is not None


# -- what the key covers ----------------------------------------------------------------------
def test_changed_option_misses(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    assert factor_of(device, options=("-DFACTOR=2.0f",)) == 2.0
    build.clear_memo()
    assert factor_of(device, options=("-DFACTOR=5.0f",)) == 5.0
    cache = build.default_cache()
    assert cache is not None and (cache.hits, cache.misses) == (0, 2)
    assert len(entries(path)) == 2


def test_changed_included_header_misses(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    headers = tmp_path / "include"
    headers.mkdir()
    header = headers / "conveyor_factor.h"
    header.write_text("#define FACTOR 2.0f\n")
    options = ("-I", str(headers))
    assert factor_of(device, HEADER_SOURCE, options) == 2.0
    first = cache_key(device.compiler_identity(), options, HEADER_SOURCE)
    header.write_text("#define FACTOR 7.0f\n")
    assert cache_key(device.compiler_identity(), options, HEADER_SOURCE) != first
    build.clear_memo()
    assert factor_of(device, HEADER_SOURCE, options) == 7.0  # not the stale binary
    cache = build.default_cache()
    assert cache is not None and (cache.hits, cache.misses) == (0, 2)


@pytest.mark.parametrize(
    "spelling",
    [lambda d: ("-I", d), lambda d: (f"-I{d}",), lambda d: (f"-I {d}",),
     lambda d: (f"--include-path={d}",)],
    ids=["-I dir", "-Idir", "'-I dir'", "--include-path"],
)
def test_key_follows_headers_under_every_include_spelling(tmp_path, spelling):
    headers = tmp_path / "include"
    (headers / "sub").mkdir(parents=True)
    (headers / "conveyor_factor.h").write_text('#include "sub/inner.h"\n')
    inner = headers / "sub" / "inner.h"
    inner.write_text("#define FACTOR 2.0f\n")
    options = spelling(str(headers))
    before = cache_key("id", options, HEADER_SOURCE)
    inner.write_text("#define FACTOR 3.0f\n")  # a header included by the included header
    assert cache_key("id", options, HEADER_SOURCE) != before


def test_header_appearing_in_an_include_dir_changes_the_key(tmp_path):
    headers = tmp_path / "include"
    headers.mkdir()
    before = cache_key("id", ("-I", str(headers)), HEADER_SOURCE)
    (headers / "conveyor_factor.h").write_text("#define FACTOR 2.0f\n")
    assert cache_key("id", ("-I", str(headers)), HEADER_SOURCE) != before


def test_changed_driver_string_misses(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    assert factor_of(device) == 3.0
    real = device.compiler_identity
    monkeypatch.setattr(device, "compiler_identity", lambda: real() + "|driver 999.1")
    build.clear_memo()
    assert factor_of(device) == 3.0
    cache = build.default_cache()
    assert cache is not None and (cache.hits, cache.misses) == (0, 2)
    assert len(entries(path)) == 2


# -- directories and entries that are not ours ------------------------------------------------
def _refused_and_uncached(device, path: Path, phrase: str) -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert factor_of(device) == 3.0
    messages = runtime_warnings(record)
    assert len(messages) == 1 and phrase in messages[0]
    cache = build.default_cache()
    assert cache is not None and not cache.enabled and cache.stores == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a directory to another uid")
def test_directory_of_another_user_runs_uncached(device, tmp_path, monkeypatch):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    use_dir(monkeypatch, path)
    _refused_and_uncached(device, path, "owned by uid 65534")
    assert list(path.iterdir()) == []


def test_world_writable_sticky_directory_runs_uncached(device, tmp_path, monkeypatch):
    path = tmp_path / "like-tmp"
    path.mkdir()
    path.chmod(0o1777)  # /tmp's mode: the sticky bit does not make it private
    use_dir(monkeypatch, path)
    _refused_and_uncached(device, path, "writable by group or others")
    assert list(path.iterdir()) == []


def test_other_writable_directory_runs_uncached(device, tmp_path, monkeypatch):
    path = tmp_path / "open"
    path.mkdir()
    path.chmod(0o702)
    use_dir(monkeypatch, path)
    _refused_and_uncached(device, path, "writable by group or others")


def test_symlink_to_a_private_directory_of_ours_runs_uncached(device, tmp_path, monkeypatch):
    target = tmp_path / "mine"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    use_dir(monkeypatch, link)
    _refused_and_uncached(device, link, "symbolic link")
    assert list(target.iterdir()) == []


def test_planted_symlink_entry_is_not_followed(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    cache = KernelCache(path)
    assert cache.enabled
    elsewhere = tmp_path / "planted.bin"
    key = cache.key(device, SOURCE, ())
    elsewhere.write_bytes(encode_entry(b"not a kernel binary", key))  # valid, elsewhere
    entry = cache.entry_path(key)
    entry.symlink_to(elsewhere)
    assert factor_of(device) == 3.0
    assert not entry.is_symlink() and stat.S_ISREG(entry.lstat().st_mode)
    assert elsewhere.read_bytes() == encode_entry(b"not a kernel binary", key)
    assert decode_entry(entry.read_bytes(), key) != b"not a kernel binary"
