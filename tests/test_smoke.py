import numpy as np

import conveyor as cv


def test_default_device_exists():
    dev = cv.device()
    assert dev.global_mem_bytes > 0


def test_pinned_array_is_ndarray(device):
    x = cv.pinned.empty((100,), np.float32, device=device)
    assert type(x) is np.ndarray
    assert cv.pinned.is_pinned(x, device)
