"""Round forty-seven: a review of session 23's fixes (a576d63..HEAD) to streams, folds and
reports.

Tried (scripts under /tmp/r47rev, not kept): 3,000 seeded sequences of two to five "sum"
partials (NumPy ints of every width near their limits, Python ints and bools, np.bool_,
floats of every width, and tuples/lists of NumPy ints ending in a float) folded by
``fold.combine`` and compared with ``np.sum`` of the partials; 20,000 seeded views (slices
with negative steps, transposes, broadcasts, 0-size) through ``hostmem.byte_bounds`` and
``hostmem.address`` against NumPy's ``byte_bounds`` and ``__array_interface__`` (all equal);
``_writable_within`` over deques, UserList/UserDict, SimpleNamespace, mappingproxy, dict
views, namedtuples, cycles, handles as keys, a key whose repr raises, and a 2e6-element list;
a read-only resident of opencl:1:0 over ``device=[d0]``, open and closed.

Found (each a strict xfail asserting the right behaviour):

- Tuple/list partials of NumPy integers (two or more of one type: folded as one array)
  whose totals wrapped, then a tuple of floats: the fold leaves its array form, and the
  folds per element it makes do not take the array fold's float64 sums, so the wrapped
  integer totals are added to the float (sign flipped); a single scalar column is right.
- An int64 total that wrapped, then a uint64 partial: NumPy promotes int64 with uint64 to
  float64 (each partial first), the fold converts the wrapped int64 total (sign flipped).
  The float64 sum kept for a float partial is used only when the partial itself is a float.
- A writable ``cv.resident`` handle in a deque, UserList, UserDict or mappingproxy among a
  callable's args is handed over, not refused (only tuple, list, set and dict are walked).
- A dict among a callable's args whose key's ``repr`` raises makes every stream fail with
  that error: ``_writable_within`` formats the path of every element before it looks at
  any (2.6 s for a 2,000,000-element list on this machine, where the old check took none).
- conveyor.dask.reduce of a callable whose int64 partials wrap in one chunk, then a float
  chunk: the chunk's wrapped int64 total reaches the aggregate without its float64 sum
  (-9.2e18; the local stream gives +9.2e18 since session 23).
- A file output named by a hard link of a writable table's file is refused as replacing the
  table's file, though the rename replaces only the link's name (a576d63 ran it right).
"""

from __future__ import annotations

import collections
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import compiling_opencl_spec, two_worker_client  # noqa: E402, F401

import conveyor as cv  # noqa: E402
from conveyor.pipeline.fold import combine  # noqa: E402


def _same(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


def _sum(partials):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return combine("sum", list(partials))


def _never(*args, **kwargs):
    raise AssertionError("the callable ran: the writable handle was not refused")


def _counts(x, *args, queue, offset, n):
    return int(n)


BIG = np.int64(2**63 - 1)
U64 = np.uint64(2**64 - 1)


# -- 1. tuple partials of NumPy integers, then a tuple of floats -------------------------------
@pytest.mark.parametrize("partials", [
    [(BIG, BIG), (np.int64(10), np.int64(10)), (np.float64(1.5), np.float64(1.5))],
    [[U64, U64], [U64, U64], [np.float64(1.5), np.float64(1.5)]],
    [(BIG, BIG), (np.int64(10), np.int64(10)), (np.float32(1.5), np.float32(1.5))],
], ids=["int64-tuples", "uint64-lists", "float32"])
def test_integer_tuple_partials_then_float_ones_sum_as_np_sum(partials):
    """A callable returning ``(count_a, count_b)`` as NumPy ints per block, and floats for a
    last block: README has list and tuple partials fold element by element "each element by
    these rules", one of which is that integers followed by a float are added again as
    float64 (an int64 total that wrapped does not flip the float total's sign). A one-element
    tuple does that (guard below); two elements of one NumPy type are folded as one array
    (``_flat``), and ``Fold._unflatten`` (fold.py) makes the folds per element from its
    totals without its ``_floats``: got -9.2e18 for 9.2e18, 1.8e19 for 3.7e19."""
    got = _sum(partials)
    assert type(got) is type(partials[0])
    for index, element in enumerate(got):
        want = np.sum(np.array([p[index] for p in partials]))
        assert _same(element, want), (index, element, want)


def test_one_element_tuple_partials_then_a_float_sum_as_np_sum():
    # guard: a one-element tuple folds its element by a fold of its own, which keeps the sums
    partials = [(BIG,), (np.int64(10),), (np.float64(1.5),)]
    assert _same(_sum(partials)[0], np.sum(np.array([p[0] for p in partials])))


# -- 2. a wrapped int64 total, then a uint64 partial -------------------------------------------
@pytest.mark.parametrize("partials", [
    [BIG, np.int64(10), np.uint64(0)],
    [BIG, np.uint16(13919), np.uint64(0), np.float32(1.5)],
    [np.int32(-1255210175), np.int64(-2**63), np.uint64(15455406518726134446)],
], ids=["uint64", "uint64-then-float32", "negative"])
def test_a_wrapped_int64_total_then_a_uint64_partial_sums_as_np_sum(partials):
    """Counts as int64 per block that pass 2**63 (they wrap, as np.sum's int64 total does),
    then a block returning a uint64: np.sum of the partials is float64, each partial made
    float64 first (+9.2e18). The fold gives -9.2e18: ``np.result_type(int64, uint64)`` is
    float64, so the wrapped int64 total is converted, while the float64 sum the fold keeps
    (``_floats``) is put in its place only where the partial itself is a float
    (fold.py ``_fold``: ``_inexact(value)``, not "the promoted type became inexact")."""
    assert _same(_sum(partials), np.sum(np.array(partials)))


# -- 3. a writable handle in other containers among a callable's args ---------------------------
def _containers(handle):
    return [
        ("deque", collections.deque([handle])),
        ("UserList", collections.UserList([handle])),
        ("UserDict", collections.UserDict(table=handle)),
        ("mappingproxy", types.MappingProxyType({"table": handle})),
    ]


@pytest.mark.parametrize("index", range(4), ids=["deque", "UserList", "UserDict",
                                                 "mappingproxy"])
def test_a_writable_handle_in_any_container_of_a_callables_args_is_refused(device, index):
    """Session 23 refused a writable handle nested in a callable's args "like one at the top
    level" (its copy-back never happens), walking tuple, list, set, frozenset and dict only
    (resident.py ``_writable_within``): a deque or ``collections.UserDict`` of handles is
    passed to the callable as given. Walking any ``collections.abc.Collection`` (Mappings'
    keys and values), strings and arrays aside, would refuse these too."""
    x = np.ones(1000, np.float32)
    with cv.resident(np.zeros(4, np.int32), writable=True) as handle:
        _, value = _containers(handle)[index]
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            cv.stream(_never, [x], device=device, reduce="sum", args=(value,),
                      block_bytes=400)


# -- 4. a key whose repr raises -----------------------------------------------------------------
class _Key:
    """A dict key whose repr fails (or is costly): conveyor has no need to call it."""

    reprs = 0

    def __repr__(self) -> str:
        type(self).reprs += 1
        raise RuntimeError("this key has no repr")


def test_a_callables_args_with_keys_whose_repr_fails_stream(device):
    """A callable given ``{key: weight}`` with keys of the user's own class (no handle in it):
    before session 23 the args were not looked into; now ``_writable_within`` builds
    ``f"{path}[{key!r}]"`` for every key and element before looking at any, so a key whose
    ``__repr__`` raises fails the stream with that error, and a list of 2,000,000 numbers
    took 2.6 s of checking per stream. The path need only be made for the handle found
    (push (container, key) pairs; format on a hit)."""
    x = np.ones(1000, np.float32)
    _Key.reprs = 0
    report = cv.stream(_counts, [x], device=device, reduce="sum", args=({_Key(): 1.0},),
                       block_bytes=400)
    assert report.result == 1000
    assert _Key.reprs == 0


# -- 5. a Dask chunk whose integer partials wrapped, then a float chunk ---------------------------
def _wrapping_then_float(x, *, queue, offset, n):
    """Block partials: int64 counts that pass 2**63 over rows 0:8, a float over rows 8:12."""
    if offset == 0:
        return np.int64(2**63 - 1)
    return np.int64(10) if offset < 8 else np.float64(1.5)


def test_dask_reduce_of_wrapping_integer_chunks_then_a_float_one_is_the_streams(dask_client):
    """conveyor.dask.reduce promises ``cv.stream(compute, [array], reduce=op).result``.
    Locally, session 23's fold keeps the int64 partials' float64 sum and adds the float to
    it (+9.2e18). Over Dask, chunk 0 (rows 0:8: 2**63 - 1 and 10) gives its int64 total,
    wrapped, and the aggregate (dask/arrays.py ``_fold``) adds chunk 1's 1.5 to that: -9.2e18.
    The float64 sum would have to travel with the chunk's total, as WideHalves carries a
    narrow float's wide total (fold.py)."""
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    spec = compiling_opencl_spec()
    if spec is None:
        pytest.skip("no OpenCL device that builds here")
    x = np.arange(12, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        local = cv.stream(_wrapping_then_float, [x], device=cv.device(spec), reduce="sum",
                          block_bytes=16).result
        got = cvd.reduce(_wrapping_then_float, da.from_array(x, chunks=8), "sum",
                         device=spec, block_bytes=16).compute(scheduler=dask_client)
    assert local == np.sum(np.array([np.int64(2**63 - 1), np.int64(10), 1.5]))  # the stream's
    assert _same(got, local), (got, local)


# -- 6. a file output named by a hard link of a writable table's file ---------------------------
BUMP = """__kernel void bump(__global const float *x, __global float *y, __global int *t,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = 2.0f * x[i]; if (offset + i == 0) t[0] += 1; }
}"""


def test_a_file_output_at_a_hard_link_of_a_writable_tables_file_runs(tmp_path):
    """A writable table mapped from ``counts.npy`` (``np.load(mmap_mode="r+")``) and a file
    output at ``out.npy``, a hard link of it (a backup made with ``cp -l``, say). The output
    is written to a part file renamed over the name ``out.npy``: ``counts.npy`` and the
    table's mapping keep their inode, so the copy-back lands and the output is written (a576d63
    did both: counts [1, 0], out [2, 2...]). overlap.py ``_check_table_files`` compares the
    target's (st_dev, st_ino) with the table's file and refuses it as "the file that output 0
    replaces". What the rename replaces is the name: compare the target's resolved path with
    the mapping's path (/proc/self/maps), keeping the inode only for a deleted file."""
    dev = cv.device("opencl:0:0")
    kernel = dev.compile(BUMP, "bump")
    counts = tmp_path / "counts.npy"
    np.save(counts, np.zeros(4, np.int32))
    out = tmp_path / "out.npy"
    out.hardlink_to(counts)
    table = np.load(counts, mmap_mode="r+")
    x = np.ones(256, np.float32)
    with cv.resident(table, writable=True) as handle:
        cv.stream(kernel, [x], [str(out)], device=dev, args=(handle,), block_bytes=256)
    del table
    assert np.load(counts).tolist() == [1, 0, 0, 0]
    assert np.array_equal(np.load(out), 2 * x)


def test_a_file_output_over_a_writable_tables_own_file_is_refused(tmp_path):
    # guard: the same file by its own name, or through a symlink, is refused (the rename
    # replaces the table's file: a576d63 lost the copy-back)
    dev = cv.device("opencl:0:0")
    kernel = dev.compile(BUMP, "bump")
    counts = tmp_path / "counts.npy"
    np.save(counts, np.zeros(4, np.int32))
    link = tmp_path / "link.npy"
    link.symlink_to(counts)
    table = np.load(counts, mmap_mode="r+")
    x = np.ones(256, np.float32)
    with cv.resident(table, writable=True) as handle:
        for target in (counts, link):
            with pytest.raises(cv.InputError, match="replaces at the end of the stream"):
                cv.stream(kernel, [x], [str(target)], device=dev, args=(handle,),
                          block_bytes=256)
