"""Round thirty-eight: a review of session 20's very last fixes (``git diff 2aa1ab6 304b350``):
``conveyor.dask``'s ``_check_halo`` shared by ``stream`` (files), ``map_blocks`` and
``reduce``; ``structs._attributed_names``; ``validate._array_fix``'s advice for records,
bytes and text given to a numeric pointer.

A seeded sweep (/tmp/r38rev/fuzz.py: 38 ``boundary=`` values x 5 dtypes, halo 1, against
``cv.stream`` outputs and sums on a LocalCluster of 2 in-process workers) found the three
Dask roads agreeing with ``cv.stream`` except for the cases below (and ``"none"``, which is
Dask's own name). Each finding is a strict xfail asserting the right behaviour.
"""

from __future__ import annotations

import re
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_only  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import conveyor.dask as cvd  # noqa: E402

SPEC = "opencl:0:0"
SRC = """__kernel void nb(__global const int *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + x[i + 2];
}
__kernel void nbf(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + x[i + 2];
}
__kernel void sc(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}
"""
NB = cvd.kernel(SRC, "nb")
NBF = cvd.kernel(SRC, "nbf")
X = ((np.arange(9) * 7) % 13).astype(np.int32)


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


def _roads(client, tmp_path, kernel, x, boundary):
    """What each Dask road gives for ``x`` with halo=1 under ``boundary``: map_blocks'
    output, reduce's sum, the file stream's output and sum."""
    np.save(tmp_path / "x.npy", x)
    dx = da.from_array(x, chunks=4)
    yield "map_blocks", lambda: client.compute(
        cvd.map_blocks(kernel, dx, halo=1, boundary=boundary, device=SPEC)).result()
    yield "reduce", lambda: client.compute(
        cvd.reduce(kernel, dx, "sum", halo=1, boundary=boundary, device=SPEC)).result()
    yield "stream", lambda: np.load(cvd.stream(
        kernel, [tmp_path / "x.npy"], [tmp_path / "y.npy"], client=client, halo=1,
        boundary=boundary, device=SPEC).outputs[0])


# halo.constant reads an int dtype's constant by boundary.is_integer(), which Fraction has
# only from Python 3.12; cv.stream makes a Fraction a float first (options._boundary), the
# Dask roads give it to constant as is (arrays._check_halo): a bare AttributeError on every
# Dask road, where cv.stream takes Fraction(3) and refuses Fraction(1, 2) with an InputError.
def test_a_fraction_boundary_for_an_int_input_as_cv_stream(client, tmp_path):
    dev = cv.device(SPEC)
    k = dev.compile(SRC, "nb")
    local = cv.stream(k, [X], [np.int32], halo=1, boundary=Fraction(3), device=dev)
    total = cv.stream(k, [X], halo=1, boundary=Fraction(3), reduce="sum", device=dev).result
    with pytest.raises(InputError, match="int32"):
        cv.stream(k, [X], [np.int32], halo=1, boundary=Fraction(1, 2), device=dev)
    for road, call in _roads(client, tmp_path, NB, X, Fraction(3)):
        got = call()
        np.testing.assert_array_equal(got, total if road == "reduce" else local.outputs[0])
    for _road, call in _roads(client, tmp_path, NB, X, Fraction(1, 2)):
        with pytest.raises(InputError, match="int32"):
            call()


# cv.stream refuses a finite constant past float64's range (options._boundary: "lies past
# float64's range"), and so does the file stream (its workers' cv.stream), but map_blocks
# and reduce hand it to dask's overlap, which pads with it: float32 inf in every pad row, a
# result of inf with no error. (With a halo longer than the array map_blocks refuses it: its
# one chunk's cv.stream pads.) _check_halo checks it only by halo.constant, which takes a
# float() of inf as a float value.
@pytest.mark.skipif(np.finfo(np.longdouble).max <= np.finfo(np.float64).max,
                    reason="no longdouble wider than float64 here")
def test_a_constant_past_float64_is_refused_on_every_road(client, tmp_path):
    big = np.longdouble("1e4000")
    x = X.astype(np.float32)
    dev = cv.device(SPEC)
    with pytest.raises(InputError, match="past float64"):
        cv.stream(dev.compile(SRC, "nbf"), [x], [np.float32], halo=1, boundary=big,
                  device=dev)
    refused = []
    for road, call in _roads(client, tmp_path, NBF, x, big):
        try:
            call()
        except InputError as exc:
            assert "past float64" in str(exc), str(exc)
            refused.append(road)
    assert refused == ["map_blocks", "reduce", "stream"]


# 304b350 moved conveyor.dask.stream's boundary check after the client is found and every
# input opened: with no cluster a bad boundary= is "needs a Dask cluster" (before 304b350:
# the boundary named, as map_blocks and reduce still do before any work).
def test_a_bad_boundary_is_named_before_the_client_is_looked_up(tmp_path):
    np.save(tmp_path / "x.npy", X)
    with pytest.raises(InputError, match="boundary="):
        cvd.stream(NB, [tmp_path / "x.npy"], [tmp_path / "y.npy"], halo=1, boundary="bogus",
                   device=SPEC)


def _records(tmp_path):
    a = np.zeros(6, [("name", "S4"), ("v", "f4")])
    a["v"] = np.arange(6)
    np.save(tmp_path / "rec.npy", a)
    return a


# Round thirty-six fixed the advice for records and bytes in memory (validate._array_fix),
# but records and bytes in a file get validate._file_in_fix's ".astype(np.float32)" (NumPy:
# "Cannot cast array data from dtype([...]) to dtype('float32')", or, for cv.raw of records,
# whose dtype it writes as '|V8', "setting an array element with a sequence"; bytes:
# "could not convert string to float").
@pytest.mark.parametrize("kind", ["npy-records", "raw-records", "npy-bytes"])
def test_the_advice_for_a_file_of_records_or_bytes_runs(device, tmp_path, monkeypatch, kind):
    opencl_c_only(device)
    k = device.compile(SRC, "sc")
    if kind == "npy-bytes":
        np.save(tmp_path / "b.npy", np.arange(6, dtype=np.float32).view("S4"))
        source = cv.npy(tmp_path / "b.npy")
    else:
        a = _records(tmp_path)
        source = (cv.npy(tmp_path / "rec.npy") if kind == "npy-records"
                  else cv.raw(tmp_path / "rec.npy", a.dtype, a.shape, offset=128))
    with pytest.raises(InputError) as info:
        cv.stream(k, [source], [np.float32], device=device)
    advised = re.search(r"np\.save\(.*\)\)", str(info.value))
    assert advised, str(info.value)
    monkeypatch.chdir(tmp_path)  # the advice writes as_float32.npy where it runs
    exec(advised.group(0), {"np": np})
    out = cv.stream(k, [tmp_path / "as_float32.npy"], [np.float32], device=device)
    np.testing.assert_array_equal(out.outputs[0], 2 * np.arange(6, dtype=np.float32))
