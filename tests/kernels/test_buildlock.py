"""The cross-process build lock (kernels/buildlock.py): who waits, where the files go, and
what happens when the folder is hostile or the holder hangs. The race it exists for is
tests/reliability/test_cache.py::test_eight_processes_compile_one_kernel_at_once."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest

from conveyor.kernels import buildlock
from conveyor.kernels.cache import KernelCache


def _hold(folder: str, key: str, held, release) -> None:  # runs in a spawned process
    cache = KernelCache(Path(folder))
    with buildlock.build_lock(key, cache):
        held.set()
        release.wait(timeout=60)


def test_a_second_process_waits_for_the_holder(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold, args=(str(cache.path), "k1", held, release))
    child.start()
    try:
        assert held.wait(timeout=60)
        order: list[str] = []
        def take() -> None:
            with buildlock.build_lock("k1", cache):
                order.append("parent")

        thread = threading.Thread(target=take)
        thread.start()
        time.sleep(0.3)
        assert order == []  # still waiting for the child
        order.append("child releases")
        release.set()
        thread.join(timeout=60)
        assert order == ["child releases", "parent"]
    finally:
        release.set()
        child.join(timeout=60)
    assert (cache.path / "locks" / "k1.lock").is_file()


def test_other_keys_do_not_wait(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    with buildlock.build_lock("a", cache), buildlock.build_lock("b", cache):
        pass  # two keys, one thread: no deadlock


def test_a_killed_holder_leaves_no_lock(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold, args=(str(cache.path), "k", held, release))
    child.start()
    assert held.wait(timeout=60)
    child.kill()
    child.join(timeout=60)
    with buildlock.build_lock("k", cache):
        pass


def test_without_a_cache_locks_go_to_a_private_temp_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with buildlock.build_lock("k", None):
        folder = buildlock.lock_dir(None)
        assert folder.parent == tmp_path
        assert (folder / "k.lock").is_file()
        assert os.stat(folder).st_mode & 0o777 == 0o700


def test_a_folder_others_may_write_is_not_used(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    assert cache.enabled
    folder = cache.path / "locks"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o777)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with buildlock.build_lock("k", cache):
            pass
    assert not (folder / "k.lock").exists()
    assert any("writable by group or others" in str(w.message) for w in record)


def test_a_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    assert cache.enabled
    folder = cache.path / "locks"
    folder.mkdir(mode=0o700)
    target = tmp_path / "victim"
    target.write_text("keep")
    (folder / "k.lock").symlink_to(target)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with buildlock.build_lock("k", cache):
            pass
    assert target.read_text() == "keep"
    assert any("cannot open the build lock" in str(w.message) for w in record)


def test_a_hung_holder_is_given_up_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = KernelCache(tmp_path / "cache")
    monkeypatch.setattr(buildlock, "WAIT_SECONDS", 0.2)
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold, args=(str(cache.path), "hung", held, release))
    child.start()
    try:
        assert held.wait(timeout=60)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with buildlock.build_lock("hung", cache):
                pass
        assert any("waited" in str(w.message) for w in record)
    finally:
        release.set()
        child.join(timeout=60)
