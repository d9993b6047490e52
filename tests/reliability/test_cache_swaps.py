"""The kernel cache loads only what this user built (issue 12, items 7 and 8): an entry moved
under another kernel's name is rebuilt, not run; a cache under a folder another user could
rename is refused; a cache directory swapped or given away after its first use in the process
is not read again.

"Another user" is uid 65534 given folders with os.chown (the suite runs as root here; the tests
that need it skip elsewhere); the swaps are real renames of real directories between two
compiles in one process. Planted binaries are real kernels that compute something else.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.kernels import build
from conveyor.kernels.cache import KernelCache
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
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="only root can chown to another uid")
OTHER_UID = 65534


pytestmark = pytest.mark.usefixtures("fresh_memo")  # tests/conftest.py


def factor_of(device: cv.Device, options: tuple[str, ...] = ()) -> float:
    """Compile SOURCE through the configured cache; the factor the kernel applies."""
    a = np.arange(1, 65, dtype=np.float32)
    out = np.zeros_like(a)
    cv.stream(device.compile(SOURCE, "scale", options), [a], [out], device=device)
    values = out / a
    assert np.all(values == values[0])
    return float(values[0])


def compiled_with_warnings(device: cv.Device, options: tuple[str, ...] = ()
                           ) -> tuple[float, list[str]]:
    build.clear_memo()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        factor = factor_of(device, options)
    return factor, [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


def cache_at(monkeypatch: pytest.MonkeyPatch, path: Path) -> KernelCache:
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(path))
    cache = build.default_cache()
    assert cache is not None
    return cache


# -- item 7: an entry knows its key ------------------------------------------------------------
def test_entries_of_two_kernels_swapped_are_rebuilt_not_run(device, tmp_path, monkeypatch):
    cache = cache_at(monkeypatch, tmp_path / "cache")
    two, five = ("-DFACTOR=2.0f",), ("-DFACTOR=5.0f",)
    assert factor_of(device, two) == 2.0 and factor_of(device, five) == 5.0
    entry_two = cache.entry_path(cache.key(device, SOURCE, two))
    entry_five = cache.entry_path(cache.key(device, SOURCE, five))
    bytes_two, bytes_five = entry_two.read_bytes(), entry_five.read_bytes()
    entry_two.write_bytes(bytes_five)
    entry_five.write_bytes(bytes_two)
    for options, factor in ((two, 2.0), (five, 5.0)):
        got, messages = compiled_with_warnings(device, options)
        assert got == factor
        assert len(messages) == 1 and "holds the binary of another kernel" in messages[0]
    assert cache.hits == 0 and cache.discarded == 2
    got, messages = compiled_with_warnings(device, two)  # rebuilt entries are good again
    assert got == 2.0 and messages == [] and cache.hits == 1


# -- item 8: folders above the cache -------------------------------------------------------
@AS_ROOT
def test_cache_under_a_folder_of_another_user_is_refused(device, tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    cache = cache_at(monkeypatch, theirs / "cache")
    factor, messages = compiled_with_warnings(device)
    assert factor == 3.0 and not cache.enabled and cache.stores == 0
    assert len(messages) == 1
    assert f"is inside {theirs}, which is owned by uid {OTHER_UID}" in messages[0]


def test_cache_under_a_group_writable_folder_is_refused(device, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    cache = cache_at(monkeypatch, shared / "a" / "cache")
    factor, messages = compiled_with_warnings(device)
    assert factor == 3.0 and not cache.enabled and cache.stores == 0
    assert len(messages) == 1
    assert f"is inside {shared}, which is writable by group or others without the sticky " \
           f"bit (mode 0775)" in messages[0]


def test_cache_under_a_sticky_world_writable_folder_is_used(device, tmp_path, monkeypatch):
    # /tmp's case: in a sticky folder only an entry's owner may rename it, so the private
    # folder of ours inside it cannot be swapped.
    like_tmp = tmp_path / "like-tmp"
    like_tmp.mkdir()
    like_tmp.chmod(0o1777)
    cache = cache_at(monkeypatch, like_tmp / "cache")
    factor, messages = compiled_with_warnings(device)
    assert factor == 3.0 and messages == [] and cache.enabled and cache.stores == 1


# -- item 8: swaps after the first use -------------------------------------------------------
def _plant(device: cv.Device, folder: Path, key: str) -> None:
    """A cache of someone else's at ``folder`` whose entry ``key`` multiplies by 9."""
    planted = KernelCache(folder)  # conveyor's own format, as an attacker would write it
    assert planted.store(key, device.build_binary(SOURCE, ("-DFACTOR=9.0f",)))


@pytest.mark.parametrize("moved", ["cache", "parent"])
def test_swapped_cache_folder_is_never_read(device, tmp_path, monkeypatch, moved):
    path = tmp_path / "home" / "cache"
    cache = cache_at(monkeypatch, path)
    assert factor_of(device) == 3.0 and cache.stores == 1  # the first use checks the folder
    key = cache.key(device, SOURCE, ())
    swapped = path if moved == "cache" else path.parent
    swapped.rename(swapped.with_name(swapped.name + "-old"))
    _plant(device, path, key)
    factor, messages = compiled_with_warnings(device)
    assert factor == 3.0 and cache.hits == 0
    assert len(messages) == 1 and "was moved or replaced after conveyor checked it" in messages[0]


@AS_ROOT
@pytest.mark.parametrize("change", ["chown", "chmod"])
def test_cache_folder_given_away_after_first_use_is_not_read(device, tmp_path, monkeypatch,
                                                             change):
    path = tmp_path / "cache"
    cache = cache_at(monkeypatch, path)
    assert factor_of(device) == 3.0 and cache.stores == 1
    if change == "chown":
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        path.chmod(0o777)
    factor, messages = compiled_with_warnings(device)
    assert factor == 3.0 and cache.hits == 0 and not cache.enabled
    assert len(messages) == 1
    assert ("owned by uid 65534" if change == "chown" else "mode 0777") in messages[0]
