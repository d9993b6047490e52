"""Kernel cache entries that are not regular files: a FIFO, a folder (empty or not), a symlink
to a folder, under a ``.bin`` or ``.sig`` name. Each is a miss with a warning, never read (a
FIFO used to block ``compile()`` forever in ``open``; a folder crashed it with
``IsADirectoryError``), removed where that is safe, and the descriptor is closed; ``info``
counts them apart and ``clear`` removes them without following or recursing into anything.

Every load that a FIFO could block runs in a child process with a timeout, so a regression
fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.kernels import build
from conveyor.kernels.cache import KernelCache, decode_entry
from conveyor.kernels.portable import PRELUDE

SRC = str(Path(__file__).resolve().parents[2] / "src")
KEY = "c" * 64
SIG_NAME = "scale|reader"
#: A guard only: a child finishes in about a second; a blocked open never does.
CHILD_TIMEOUT = 120

SOURCE = PRELUDE + """
__kernel void scale(__global const float* a, __global float* out, ulong offset, ulong n)
{
    size_t i = get_global_id(0);
    if (i < n) out[i] = a[i] * 3.0f;
}
"""


pytestmark = pytest.mark.usefixtures("fresh_memo")  # tests/conftest.py


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(os.environ, PYTHONPATH=path, **extra)


def _child(script: str, **env: str) -> dict:
    """Run ``script`` in a new Python; it prints one JSON object last, which comes back."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=_env(**env),
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail("the child hung: opening a cache entry blocked (a FIFO opened without "
                    "O_NONBLOCK?)")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


# What the child runs: load the entry (binary or signature), with the warnings it gives and
# the descriptors open before and after; then store again and load back.
LOAD_SCRIPT = """
    import json, os, warnings
    from pathlib import Path
    from conveyor.kernels.cache import KernelCache

    path, key = os.environ["T_PATH"], os.environ["T_KEY"]
    suffix, name = os.environ["T_SUFFIX"], os.environ["T_NAME"]
    cache = KernelCache(Path(path))
    assert cache.enabled
    fds = len(os.listdir("/proc/self/fd"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        if suffix == ".bin":
            got = cache.load(key)
        else:
            got = cache.load_signature(key, name)
    leaked = len(os.listdir("/proc/self/fd")) - fds
    if suffix == ".bin":
        stored = cache.store(key, b"rebuilt")
        again = cache.load(key)
    else:
        stored = cache.store_signature(key, name, b"rebuilt")
        again = cache.load_signature(key, name)
    print(json.dumps({"got": None if got is None else got.hex(), "leaked": leaked,
                      "warnings": [str(w.message) for w in record], "stored": stored,
                      "again": None if again is None else again.decode(),
                      "enabled": cache.enabled, "discarded": cache.discarded}))
"""


def _entry_name(cache: KernelCache, suffix: str) -> str:
    """Store an entry of ``suffix`` and return its file name."""
    if suffix == ".bin":
        assert cache.store(KEY, b"a kernel binary")
    else:
        assert cache.store_signature(KEY, SIG_NAME, b"[]")
    (name,) = [p.name for p in cache.path.iterdir() if p.name.endswith(suffix)]
    return name


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("suffix", [".bin", ".sig"])
@pytest.mark.parametrize("kind", ["fifo", "empty folder"])
def test_an_entry_that_is_not_a_file_is_a_miss_removed_and_rebuilt(tmp_path, suffix, kind):
    cache = KernelCache(tmp_path / "cache")
    name = _entry_name(cache, suffix)
    entry = cache.path / name
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry, 0o600)
    else:
        entry.mkdir(mode=0o700)
    result = _child(LOAD_SCRIPT, T_PATH=str(cache.path), T_KEY=KEY, T_SUFFIX=suffix,
                    T_NAME=SIG_NAME)
    assert result["got"] is None and result["leaked"] == 0
    (message,) = result["warnings"]
    what = "a FIFO" if kind == "fifo" else "a folder"
    assert f"{name} is {what}, not a file conveyor wrote" in message
    assert "it was removed" in message
    # Rebuilt over it: stored, read back, and the cache stays on.
    assert result["stored"] and result["again"] == "rebuilt" and result["enabled"]
    assert result["discarded"] == (1 if suffix == ".bin" else 0)
    assert entry.is_file() and not entry.is_symlink()


def test_a_folder_with_files_is_left_alone_and_the_cache_stays_on(tmp_path):
    cache = KernelCache(tmp_path / "cache")
    name = _entry_name(cache, ".bin")
    entry = cache.path / name
    entry.unlink()
    entry.mkdir()
    (entry / "someones.txt").write_text("keep me")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.load(KEY) is None
        assert not cache.store(KEY, b"rebuilt")  # the rename over a folder fails: not stored
    (message,) = [str(w.message) for w in record]
    assert "is a folder" in message and "could not be removed" in message
    assert "remove it yourself" in message
    assert (entry / "someones.txt").read_text() == "keep me"  # never recursed into
    # Only that entry is off: the cache is on, others store and load, no temporary file.
    assert cache.enabled and cache.store("d" * 64, b"other") and cache.load("d" * 64) == b"other"
    assert not [p for p in cache.path.iterdir() if p.name.startswith(".tmp-")]


def test_info_counts_bad_entries_apart_and_clear_removes_them_safely(tmp_path):
    cache = KernelCache(tmp_path / "cache")
    assert cache.store("a" * 64, b"x" * 100)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("not the cache's")
    folder = cache.path / ("b" * 64 + ".bin")
    folder.mkdir()
    link = cache.path / ("e" * 64 + ".bin")
    link.symlink_to(outside, target_is_directory=True)
    full = cache.path / ("f" * 64 + ".bin")
    full.mkdir()
    (full / "inside").write_text("x")
    sig_folder = cache.path / ("a" * 64 + "-" + "1" * 32 + ".sig")
    sig_folder.mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(cache.path / ("9" * 64 + ".bin"))
    bad = 4 if hasattr(os, "mkfifo") else 3
    info = cache.info()
    assert (info.entries, info.bad) == (1, bad)
    cleared = cache.clear_entries()
    assert cleared.refused is None
    assert cleared.removed == 1 + bad - 1  # all but the folder with a file in it
    (failed,) = cleared.failed
    assert failed.startswith(full.name) and "not empty" in failed
    assert [p.name for p in cache.path.iterdir()] == [full.name]
    assert (full / "inside").exists() and (outside / "precious").exists()  # nothing followed
    assert cache.info().bad == 1


def test_clear_of_a_refused_directory_says_why(tmp_path):
    path = tmp_path / "cache"
    path.mkdir(mode=0o700)
    os.chmod(path, 0o770)
    cache = KernelCache(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cleared = cache.clear_entries()
        assert cache.clear() == 0
    assert cleared.removed == 0 and cleared.refused is not None
    assert "writable by group or others" in cleared.refused
    assert cache.refused == cleared.refused


# -- with a real kernel: the tester's reproduction ------------------------------------------
COMPILE_SCRIPT = """
    import json, os, warnings
    import numpy as np
    import conveyor as cv

    dev = cv.device(os.environ["T_SPEC"])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        kernel = dev.compile(os.environ["T_SOURCE"], "scale")
    a = np.arange(256, dtype=np.float32)
    out = np.zeros_like(a)
    cv.stream(kernel, [a], [out], device=dev)
    print(json.dumps({"right": bool(np.array_equal(out, a * np.float32(3))),
                      "warnings": [str(w.message) for w in record
                                   if issubclass(w.category, RuntimeWarning)]}))
"""


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_compile_in_a_new_process_with_entries_replaced(device, tmp_path, monkeypatch, kind):
    if kind == "fifo" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "cache"
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(path))
    device.compile(SOURCE, "scale")
    entries = sorted(p for p in path.iterdir() if p.suffix in (".bin", ".sig"))
    assert sorted(p.suffix for p in entries) == [".bin", ".sig"]
    for entry in entries:  # for e in $CONVEYOR_CACHE_DIR/*.bin *.sig; do rm; mkfifo; done
        entry.unlink()
        os.mkfifo(entry) if kind == "fifo" else entry.mkdir()
    result = _child(COMPILE_SCRIPT, CONVEYOR_CACHE_DIR=str(path), T_SPEC=device.spec,
                    T_SOURCE=SOURCE)
    assert result["right"]
    assert len(result["warnings"]) == 2, result["warnings"]
    assert all("not a file conveyor wrote" in w for w in result["warnings"])
    for entry in entries:  # rebuilt as whole, regular files
        assert entry.is_file() and not entry.is_symlink()
    (binary,) = [p for p in entries if p.suffix == ".bin"]
    assert decode_entry(binary.read_bytes(), binary.stem) is not None


def test_a_folder_entry_in_process_builds_and_runs(device, tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(path))
    device.compile(SOURCE, "scale")
    (binary,) = path.glob("*.bin")
    binary.unlink()
    binary.mkdir()
    (binary / "x").write_text("someone's")
    build.clear_memo()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        kernel = device.compile(SOURCE, "scale")
    messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "could not be removed" in messages[0], messages
    a = np.arange(128, dtype=np.float32)
    out = np.zeros_like(a)
    cv.stream(kernel, [a], [out], device=device)
    np.testing.assert_array_equal(out, a * np.float32(3))
    cache = build.default_cache()
    assert cache is not None and cache.enabled  # one entry off, not the whole cache
