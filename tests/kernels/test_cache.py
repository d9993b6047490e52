"""KernelCache: key recipe, entry format, directory safety, atomic writes, info/clear.

Faults are injected by corrupting real entry files, changing real directory permissions, and
wrapping ``os.replace``; kernels are built by the real device compiler.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.kernels import build
from conveyor.kernels.cache import (
    FORMAT_VERSION,
    HEADER_BYTES,
    MAGIC,
    KernelCache,
    cache_key,
    decode_entry,
    encode_entry,
)
from conveyor.kernels.portable import PRELUDE

SOURCE = PRELUDE + """
__kernel void scale(__global float* out, __global const float* a, ulong offset, ulong n)
{
    size_t i = get_global_id(0);
    if (i < n) out[i] = a[i] * 3.0f;
}
"""


pytestmark = pytest.mark.usefixtures("fresh_memo")  # tests/conftest.py


def use_dir(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(path))


def compile_and_check(device: cv.Device) -> None:
    """Compile through the configured cache and check the kernel computes a * 3."""
    kernel = device.compile(SOURCE, "scale")
    n = 512
    a = np.arange(n, dtype=np.float32)
    out = np.empty_like(a)
    queue = device.create_queue()
    a_buf = device.memory_pool.acquire(a.nbytes)
    out_buf = device.memory_pool.acquire(out.nbytes)
    try:
        copied = queue.copy_in(a_buf, a)
        ran = queue.launch(kernel, n, [out_buf, a_buf, 0, n], wait_for=[copied])
        queue.copy_out(out, out_buf, wait_for=[ran]).wait()
    finally:
        queue.finish()
        device.memory_pool.release(a_buf)
        device.memory_pool.release(out_buf)
        queue.close()
    np.testing.assert_array_equal(out, a * np.float32(3))


def files(path: Path) -> list[str]:
    """What ``path`` holds besides the build-lock folder (kernels/buildlock.py)."""
    return sorted(p.name for p in path.iterdir() if p.name != "locks")


def runtime_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


# -- key and entry format (no device) ----------------------------------------------------------
def test_key_covers_every_input(monkeypatch):
    base = cache_key("opencl|pocl|cpu|3.1", ("-DX=1",), "src")
    assert len(base) == 64 and base == cache_key("opencl|pocl|cpu|3.1", ("-DX=1",), "src")
    assert base != cache_key("opencl|pocl|cpu|3.2", ("-DX=1",), "src")
    assert base != cache_key("opencl|pocl|cpu|3.1", ("-DX=2",), "src")
    assert base != cache_key("opencl|pocl|cpu|3.1", ("-DX=1",), "src ")
    # Option boundaries matter: ("-DA", "B") is not ("-DA B",).
    assert cache_key("i", ("-DA", "B"), "s") != cache_key("i", ("-DA B",), "s")
    monkeypatch.setattr(cv, "__version__", "999.0")
    assert base != cache_key("opencl|pocl|cpu|3.1", ("-DX=1",), "src")


def test_entry_round_trip_and_header():
    data = encode_entry(b"payload", "k")
    assert data[:4] == MAGIC and len(data) == HEADER_BYTES + 7
    assert int.from_bytes(data[4:8], "little") == FORMAT_VERSION
    assert int.from_bytes(data[8:16], "little") == 7
    assert data[48:80] == hashlib.sha256(b"k").digest()  # the key it was written for
    assert decode_entry(data, "k") == b"payload"
    assert decode_entry(encode_entry(b"", "k"), "k") == b""
    assert decode_entry(data, "another key") is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:10],  # shorter than a header
        lambda d: d[:-1],  # truncated payload
        lambda d: d + b"x",  # trailing bytes
        lambda d: b"XXXX" + d[4:],  # wrong magic
        lambda d: d[:4] + (FORMAT_VERSION + 1).to_bytes(4, "little") + d[8:],  # version
        lambda d: d[:-1] + bytes([d[-1] ^ 0xFF]),  # payload does not match its hash
    ],
    ids=["short", "truncated", "long", "magic", "version", "hash"],
)
def test_bad_entries_decode_as_none(damage):
    assert decode_entry(damage(encode_entry(b"some kernel binary bytes", "k")), "k") is None


# -- directory ----------------------------------------------------------------------------------
def test_created_directories_are_private(tmp_path):
    path = tmp_path / "a" / "b" / "cache"
    old = os.umask(0o022)
    try:
        assert KernelCache(path).enabled
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", path):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700


def test_group_writable_directory_is_refused(device, tmp_path, monkeypatch):
    path = tmp_path / "shared-cache"
    path.mkdir()
    path.chmod(0o770)
    use_dir(monkeypatch, path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        compile_and_check(device)
    messages = runtime_warnings(record)
    assert len(messages) == 1 and "writable by group or others" in messages[0]
    assert list(path.iterdir()) == []


def test_symlinked_directory_is_refused(device, tmp_path, monkeypatch):
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    use_dir(monkeypatch, link)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        compile_and_check(device)
    messages = runtime_warnings(record)
    assert len(messages) == 1 and "symbolic link" in messages[0]
    assert list(target.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a directory to another uid")
def test_directory_of_another_user_is_refused(tmp_path):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.warns(RuntimeWarning, match="owned by uid 65534"):
        assert not KernelCache(path).enabled


def test_uncreatable_directory_warns_once_and_works(device, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    use_dir(monkeypatch, blocker / "cache")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        compile_and_check(device)
        build.clear_memo()
        compile_and_check(device)
    messages = runtime_warnings(record)
    assert len(messages) == 1 and "cannot be created" in messages[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a mode-0500 directory anyway")
def test_read_only_directory_warns_once_and_works(device, tmp_path, monkeypatch):
    path = tmp_path / "read-only"
    path.mkdir(mode=0o500)
    use_dir(monkeypatch, path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        compile_and_check(device)
        build.clear_memo()
        compile_and_check(device)
    assert len(runtime_warnings(record)) == 1


def test_failed_write_warns_once_and_leaves_no_temp_file(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    real_replace = os.replace

    def failing_replace(src, dst, **dir_fds):
        if str(dst).startswith(str(path)) or dir_fds.get("dst_dir_fd") is not None:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst, **dir_fds)

    monkeypatch.setattr(os, "replace", failing_replace)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        compile_and_check(device)
    messages = runtime_warnings(record)
    assert len(messages) == 1 and "not writable" in messages[0]
    assert files(path) == []


# -- entries on disk, with real kernels -----------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_bad_entry_is_rebuilt_and_kernel_runs(device, tmp_path, monkeypatch, damage):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    compile_and_check(device)
    (entry,) = path.glob("*.bin")
    data = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        entry.write_bytes(data[:middle] + bytes([data[middle] ^ 0x5A]) + data[middle + 1 :])
    build.clear_memo()
    compile_and_check(device)
    cache = build.default_cache()
    assert cache is not None
    assert (cache.hits, cache.misses, cache.discarded, cache.stores) == (0, 2, 1, 2)
    assert decode_entry(entry.read_bytes(), entry.stem) is not None  # rebuilt, whole
    build.clear_memo()
    compile_and_check(device)
    assert cache.hits == 1


def test_no_temp_files_left_behind(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    use_dir(monkeypatch, path)
    compile_and_check(device)
    names = files(path)
    # The binary and its kernel's signature; both private.
    assert len(names) == 2 and not any(name.startswith(".") for name in names)
    assert sorted(name.rsplit(".", 1)[1] for name in names) == ["bin", "sig"]
    for name in names:
        assert stat.S_IMODE((path / name).stat().st_mode) & 0o077 == 0


def test_concurrent_writers_of_one_key(tmp_path):
    path = tmp_path / "cache"
    caches = [KernelCache(path) for _ in range(4)]  # as if four processes
    payload = os.urandom(256 * 1024)
    barrier = threading.Barrier(8)

    def writer(cache: KernelCache) -> None:
        barrier.wait()
        for _ in range(5):
            assert cache.store("k" * 64, payload)

    threads = [threading.Thread(target=writer, args=(caches[i % 4],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.name for p in path.iterdir()] == ["k" * 64 + ".bin"]
    assert KernelCache(path).load("k" * 64) == payload


def test_clear_and_info_leave_files_conveyor_did_not_name_alone(tmp_path):
    """Round fourteen: ``conveyor cache clear`` removed every ``*.bin`` and ``*.sig`` in the
    folder (a user's ``measurements.bin`` given CONVEYOR_CACHE_DIR=$PWD), and ``info``
    counted them as entries. Only the names conveyor writes are its own."""
    cache = KernelCache(tmp_path / "cache")
    cache.store("c" * 64, b"z" * 10)
    cache.store_signature("c" * 64, "k", b'{"p": 1}')
    theirs = ["measurements.bin", "notes.sig", "C" * 64 + ".bin", "c" * 63 + ".bin",
              "c" * 64 + ".bin.bak", ".tmp-mine.bin", ".tmp-0123456789abcdef.npy"]
    old = time.time() - 3600
    for name in theirs:
        (cache.path / name).write_bytes(b"mine")
        os.utime(cache.path / name, (old, old))
    assert cache.info().entries == 1
    assert cache.clear() == 1
    assert sorted(p.name for p in cache.path.iterdir()) == sorted(theirs)


def test_info_and_clear(tmp_path):
    cache = KernelCache(tmp_path / "cache")
    cache.store("a" * 64, b"x" * 100)
    cache.store("b" * 64, b"y" * 50)
    info = cache.info()
    assert (info.entries, info.total_bytes) == (2, 150 + 2 * HEADER_BYTES)
    assert info.path == tmp_path / "cache" and info.enabled
    stale = cache.path / ".tmp-0123456789abcdef.bin"
    fresh = cache.path / ".tmp-fedcba9876543210.bin"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert cache.clear() == 3
    assert [p.name for p in cache.path.iterdir()] == [".tmp-fedcba9876543210.bin"]
    assert cache.info().entries == 0
    assert cache.load("a" * 64) is None and cache.misses == 1


def test_headers_found_in_the_current_folder_or_through_a_defined_name_are_in_the_key(
        tmp_path, monkeypatch):
    """Round fourteen: ``#include "h.h"`` with no -I (the compiler finds it in the current
    folder) and ``#define H "h.h"`` / ``#include H`` were not followed, so an edited header
    loaded the binary of its old text from the cache."""
    from conveyor.kernels.cache import cache_key

    monkeypatch.chdir(tmp_path)
    inc = tmp_path / "inc"
    inc.mkdir()
    sources = [('#include "h.h"\n', ()), ('#define H "h.h"\n#include H\n', (f"-I{inc}",)),
               ('#include /* why */ H\n#define H "h.h"\n', ())]
    for source, options in sources:
        keys = []
        for factor in ("2.0f", "3.0f"):
            (tmp_path / "h.h").write_text(f"#define FACTOR {factor}\n")
            (inc / "h.h").write_text(f"#define FACTOR {factor}\n")
            keys.append(cache_key("id", options, source))
        assert keys[0] != keys[1], source
        assert cache_key("id", options, source) == keys[1]  # the same header: the same key


def test_a_computed_include_conveyor_cannot_follow_is_never_cached(tmp_path, monkeypatch):
    from conveyor.kernels import includes
    from conveyor.kernels.cache import cache_key

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(includes, "_warned_unresolved", False)
    source = '#define A B\n#define B "h.h"\n#include A\n'
    with pytest.warns(RuntimeWarning, match="#include A.*built each time"):
        first = cache_key("id", (), source)
    assert cache_key("id", (), source) != first
    # guard: #include_next is no computed include
    assert cache_key("id", (), "#include_next <h.h>\n") == cache_key(
        "id", (), "#include_next <h.h>\n")
