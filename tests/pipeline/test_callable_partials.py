"""A reducing callable returns each block's partial: a missing ``return`` (None) or text is an
InputError naming the block, never a total that silently leaves blocks out."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import to_host

import conveyor as cv

N = 100_000
BLOCK = 4096


def test_a_partial_of_none_names_the_block(device):
    x = np.arange(N, dtype=np.float32)

    def forgot_return(a, *, queue, offset, n):
        float(to_host(a, queue).sum())

    with pytest.raises(cv.InputError, match=r"returned None for block 0 \(rows 0\.\."):
        cv.stream(forgot_return, [x], reduce="sum", device=device, block_bytes=BLOCK)


def test_none_for_some_blocks_only_is_refused_too(device):
    x = np.arange(N, dtype=np.float32)

    def sometimes(a, *, queue, offset, n):
        if offset < N // 2:
            return float(to_host(a, queue).sum(dtype=np.float64))
        return None

    with pytest.raises(cv.InputError, match="returned None for block"):
        cv.stream(sometimes, [x], reduce="sum", device=device, block_bytes=BLOCK)


def test_text_is_refused(device):
    x = np.arange(N, dtype=np.float32)
    with pytest.raises(cv.InputError, match="return a number or a numeric array"):
        cv.stream(lambda a, *, queue, offset, n: "abc", [x], reduce="sum", device=device,
                  block_bytes=BLOCK)


def test_any_other_partial_still_folds_with_a_function(device):
    x = np.arange(N, dtype=np.float64)

    def sum_and_count(a, *, queue, offset, n):
        host = to_host(a, queue)
        return (float(host.sum()), host.size)

    report = cv.stream(sum_and_count, [x], device=device, block_bytes=BLOCK,
                       reduce=lambda p, q: (p[0] + q[0], p[1] + q[1]))
    assert report.result == (float(x.sum()), N)


def test_a_dict_partial_is_folded_by_a_custom_reduce(device):
    """A dict has a ``get`` method, which was taken for a device array's: TypeError."""
    x = np.arange(N, dtype=np.float32)

    def moments(a, *, queue, offset, n):
        values = to_host(a, queue).astype(np.float64)
        return {"sum": float(values.sum()), "count": int(values.size)}

    report = cv.stream(moments, [x], device=device, block_bytes=BLOCK,
                       reduce=lambda p, q: {k: p[k] + q[k] for k in p})
    assert report.result == {"sum": float(x.astype(np.float64).sum()), "count": N}


def test_a_partial_sum_cannot_fold_says_what_to_return(device):
    """reduce="sum" over dict partials was a raw TypeError from np.add."""
    x = np.arange(N, dtype=np.float32)

    def as_dict(a, *, queue, offset, n):
        return {"sum": float(to_host(a, queue).sum())}

    with pytest.raises(cv.InputError, match=r"reduce='sum' cannot fold .*\(dict: .*reduce=f"):
        cv.stream(as_dict, [x], reduce="sum", device=device, block_bytes=BLOCK)
