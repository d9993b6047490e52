"""compile_kernel / compile_async on real devices: build, load, memo, disk cache across
processes, bad entries, compile errors. Faults are injected by corrupting real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.errors import CompileError, InputError
from conveyor.kernels import build
from conveyor.kernels.cache import encode_entry
from conveyor.kernels.portable import PRELUDE

SCALE_SOURCE = PRELUDE + """
__kernel void scale(__global float* out, __global const float* a, ulong offset, ulong n)
{
    size_t i = get_global_id(0);
    if (i < n) out[i] = a[i] * SCALE;
}
"""

BROKEN_SOURCE = PRELUDE + """__kernel void broken(__global float* out)
{
    size_t i = get_global_id(0);
    out[i] = undeclared_name * 2.0f;
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache directory and an empty in-process memo."""
    path = tmp_path / "kernel-cache"
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(path))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    build.clear_memo()
    yield path
    build.clear_memo()


def run_scale(device: cv.Device, kernel: cv.Kernel, n: int = 1000) -> np.ndarray:
    """Run ``scale`` over 0..n-1 and return the result (buffers go back to the pool)."""
    a = np.arange(n, dtype=np.float32)
    out = np.empty_like(a)
    queue = device.create_queue()
    a_buf = device.memory_pool.acquire(a.nbytes)
    out_buf = device.memory_pool.acquire(out.nbytes)
    try:
        copied = queue.copy_in(a_buf, a)
        ran = queue.launch(kernel, n, [out_buf, a_buf, 0, n], wait_for=[copied])
        done = queue.copy_out(out, out_buf, wait_for=[ran])
        done.wait()
    finally:
        queue.finish()
        device.memory_pool.release(a_buf)
        device.memory_pool.release(out_buf)
        queue.close()
    return out


def expected(scale: float, n: int = 1000) -> np.ndarray:
    return np.arange(n, dtype=np.float32) * np.float32(scale)


def test_compiled_kernel_runs(device):
    kernel = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    assert kernel.name == "scale" and [p.name for p in kernel.params][-1] == "n"
    np.testing.assert_array_equal(run_scale(device, kernel), expected(2))


def test_compile_error_carries_log_with_line_numbers(device):
    with pytest.raises(CompileError) as info:
        device.compile(BROKEN_SOURCE, "broken")
    assert "undeclared_name" in info.value.log
    # The error is on line 4 of the source: "file:4:col" (Clang/PoCL), "program(4)" (NVRTC).
    # NVIDIA's OpenCL compiler ignores the prelude's "#line 1" and counts the prelude's lines.
    shifted = 4 + PRELUDE.count("\n")
    log = info.value.log
    assert ":4:" in log or "(4)" in log or f":{shifted}:" in log
    assert info.value.source == BROKEN_SOURCE
    assert "undeclared_name" in str(info.value)


def test_missing_kernel_name_is_input_error(device):
    with pytest.raises(InputError, match="no kernel named 'nope'"):
        device.compile(SCALE_SOURCE, "nope", ["-DSCALE=2"])


def test_second_compile_in_process_is_memoized(device):
    cache = build.default_cache()
    assert cache is not None
    first = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    second = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    assert second is first
    assert (cache.hits, cache.misses, cache.stores) == (0, 1, 1)


def test_second_process_hits_the_disk_cache(device, private_cache):
    device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    script = (
        "import json, sys, conveyor as cv\n"
        "from conveyor.kernels import build\n"
        "dev = cv.device(sys.argv[1])\n"
        "dev.compile(sys.argv[2], 'scale', ['-DSCALE=2'])\n"
        "c = build.default_cache()\n"
        "print(json.dumps({'hits': c.hits, 'misses': c.misses, 'stores': c.stores}))\n"
    )
    env = dict(os.environ, CONVEYOR_CACHE_DIR=str(private_cache))
    result = subprocess.run(
        [sys.executable, "-c", script, device.spec, SCALE_SOURCE],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts == {"hits": 1, "misses": 0, "stores": 0}


def test_changed_option_misses(device):
    cache = build.default_cache()
    assert cache is not None
    two = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    three = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=3"])
    assert (cache.hits, cache.misses, cache.stores) == (0, 2, 2)
    assert cache.info().entries == 2
    np.testing.assert_array_equal(run_scale(device, two), expected(2))
    np.testing.assert_array_equal(run_scale(device, three), expected(3))


def test_entry_the_driver_rejects_is_rebuilt(device):
    # A well-formed entry (checksum fine) whose payload is not a binary the driver accepts.
    cache = build.default_cache()
    assert cache is not None
    key = cache.key(device, SCALE_SOURCE, ("-DSCALE=2",))
    assert cache.enabled
    cache.entry_path(key).write_bytes(encode_entry(b"not a kernel binary" * 10, key))
    kernel = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    assert (cache.hits, cache.discarded, cache.stores) == (1, 1, 1)
    np.testing.assert_array_equal(run_scale(device, kernel), expected(2))
    build.clear_memo()
    device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    assert cache.hits == 2 and cache.discarded == 1  # the rebuilt entry is good


def test_no_cache_setting_builds_without_a_directory(device, private_cache, monkeypatch):
    monkeypatch.setenv("CONVEYOR_NO_CACHE", "1")
    assert build.default_cache() is None
    kernel = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    np.testing.assert_array_equal(run_scale(device, kernel), expected(2))
    assert not private_cache.exists()


def test_compile_async_gives_a_kernel(device):
    future = build.compile_async(device, SCALE_SOURCE, "scale", ["-DSCALE=4"])
    kernel = future.result(timeout=120)
    np.testing.assert_array_equal(run_scale(device, kernel), expected(4))


def test_compile_async_raises_compile_error(device):
    future = build.compile_async(device, BROKEN_SOURCE, "broken")
    with pytest.raises(CompileError):
        future.result(timeout=120)


def test_concurrent_compiles_build_once(device):
    cache = build.default_cache()
    assert cache is not None
    kernels: list[cv.Kernel] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        barrier.wait()
        kernels.append(device.compile(SCALE_SOURCE, "scale", ["-DSCALE=5"]))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(kernels) == 4 and all(k is kernels[0] for k in kernels)
    assert cache.stores == 1


STREAM_SOURCE = PRELUDE + """
__kernel void times(__global const float* a, __global float* out, ulong offset, ulong n)
{
    size_t i = get_global_id(0);
    if (i < n) out[i] = a[i] * FACTOR;
}
"""


def test_compile_without_waiting_gives_a_future_that_a_stream_accepts(device):
    future = device.compile(STREAM_SOURCE, "times", ["-DFACTOR=6"], wait=False)
    a = np.arange(1000, dtype=np.float32)
    out = np.zeros_like(a)
    cv.stream(future, [a], [out], device=device)
    assert future.done()
    np.testing.assert_array_equal(a, np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(out, a * 6)
    assert future.result() is device.compile(STREAM_SOURCE, "times", ["-DFACTOR=6"])


def test_compile_without_waiting_reports_build_errors_at_result(device):
    future = device.compile(BROKEN_SOURCE, "broken", wait=False)
    with pytest.raises(CompileError, match="undeclared_name"):
        future.result()


# -- kernel parameters stored beside the binary ----------------------------------------------
def _sig_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.sig"))


def test_a_warm_build_reads_the_parameters_stored_beside_the_binary(device, monkeypatch,
                                                                     private_cache):
    cold = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    assert len(_sig_files(private_cache)) == 1
    build.clear_memo()

    def no_preprocessing(*args, **kw):
        raise AssertionError("a warm build preprocessed the source again")

    monkeypatch.setattr(build, "_read_params", no_preprocessing)
    warm = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    assert warm is not cold and warm.params == cold.params
    np.testing.assert_array_equal(run_scale(device, warm), expected(2))
    future = build.KernelFuture(device, SCALE_SOURCE, "scale", ("-DSCALE=2",))
    assert [p.name for p in future.params] == ["out", "a", "offset", "n"]
    assert future.result() is warm


@pytest.mark.parametrize("damage", ["garbage", "other kernel", "old version"])
def test_a_bad_signature_is_read_from_the_source_again_and_replaced(device, private_cache,
                                                                    damage):
    from conveyor.kernels.signature import _SIGNATURE_VERSION

    cold = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    (sig,) = _sig_files(private_cache)
    key = sig.name.rsplit("-", 1)[0]
    if damage == "garbage":
        sig.write_bytes(b"\0" * 100)
    elif damage == "other kernel":  # a whole entry, written for another key
        sig.write_bytes(encode_entry(b'[1, []]', key + "-0"))
    else:
        sig.write_bytes(encode_entry(json.dumps([_SIGNATURE_VERSION + 1, []]).encode(),
                                     sig.name[:-4]))
    build.clear_memo()
    warm = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    assert warm.params == cold.params
    np.testing.assert_array_equal(run_scale(device, warm), expected(2))
    assert len(_sig_files(private_cache)) == 1
    build.clear_memo()
    assert device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"]).params == cold.params


def test_parameters_read_back_as_they_were_written():
    from conveyor.kernels.signature import params_from_json, params_to_json, parse_params

    source = """__kernel void k(__global const float4 *a, __global struct thing *s,
                                 __local int *scratch, double x, uchar2 v, ulong n) {}"""
    params = parse_params(source, "k")
    payload = params_to_json(params)
    assert payload is not None and params_from_json(payload) == params
    assert params_from_json(b"not json") is None
    assert params_from_json(b'[1, [["a", "yes", null, false, "t", 1, "", "", "source"]]]') is None
    assert params_from_json(b'{"a": 1}') is None


def test_clear_removes_the_signatures_too(device, private_cache):
    device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    cache = build.default_cache()
    assert cache is not None and cache.clear() == 1  # entries, as info() counts them
    assert list(private_cache.glob("*.sig")) == [] and cache.info().entries == 0


def test_a_failed_build_leaves_no_signature(device, private_cache):
    for _ in range(2):
        with pytest.raises(CompileError):
            device.compile(BROKEN_SOURCE, "broken")
        future = device.compile(BROKEN_SOURCE, "broken", wait=False)
        with pytest.raises(CompileError):
            future.result()
    assert _sig_files(private_cache) == []


def test_parameters_read_unexpanded_are_not_kept(device, private_cache, monkeypatch):
    real = build.expand_checked

    def failed_expansion(source, options=(), macros=(), headers=""):
        real(source, options, macros, headers)
        return source, False  # as when pcpp gives up: the raw text

    monkeypatch.setattr(build, "expand_checked", failed_expansion)
    device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"])
    device.compile(SCALE_SOURCE, "scale", ["-DSCALE=3"], wait=False).result()
    assert _sig_files(private_cache) == [] and build.default_cache().info().entries == 2


def test_an_async_build_stores_the_signature_after_the_binary(device, private_cache,
                                                               monkeypatch):
    future = device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"], wait=False)
    kernel = future.result()
    assert len(_sig_files(private_cache)) == 1
    build.clear_memo()
    monkeypatch.setattr(build, "_read_params", None)  # a warm build must not call it
    assert device.compile(SCALE_SOURCE, "scale", ["-DSCALE=2"]).params == kernel.params


def test_an_edited_header_gives_the_new_parameters_now_and_in_later_builds(device, tmp_path):
    """The memoized expansion and the stored .sig both follow the included header's text."""
    folder = tmp_path / "include"
    folder.mkdir()
    header = folder / "real.h"
    source = PRELUDE + """#include "real.h"
__kernel void fill(__global real *out, real v, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) out[i] = v; }
"""
    options = ["-I", str(folder)]
    kinds = []
    for text in ("typedef float real;\n", "typedef int real;\n", "typedef float real;\n"):
        header.write_text(text)
        build.clear_memo()
        kinds.append(device.compile(source, "fill", options).params[1].dtype)
    assert kinds == [np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float32)]
    build.clear_memo()  # the third build found the first's .sig: still float32
    header.write_text("typedef int real;\n")
    assert device.compile(source, "fill", options).params[1].dtype == np.dtype(np.int32)


def test_a_dropped_device_is_not_kept_alive_by_its_kernels(device):
    """Round fourteen: the process-wide memo of loaded kernels held each kernel, and each
    kernel its device, so a device made and dropped (here a second OpenCL context, closed
    after a stream) stayed alive with its pools for good. The memo lives on the device now."""
    import gc
    import weakref

    if device.backend != "opencl":
        pytest.skip("a second context of one device is an OpenCL notion")
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    second = opencl.Device(device.cl_device, platform, index)
    kernel = second.compile(SCALE_SOURCE, "scale", options=["-DSCALE=3.0f"])
    assert second.compile(SCALE_SOURCE, "scale", options=["-DSCALE=3.0f"]) is kernel  # memo
    np.testing.assert_array_equal(run_scale(second, kernel), np.arange(1000) * 3.0)
    gone = weakref.ref(second)
    second.close()
    del second, kernel
    gc.collect()
    assert gone() is None
    build.clear_memo()  # with the device gone: nothing left to clear, nothing raised
