"""Fixtures shared by the reliability tests."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipeline"))  # test_multi
from test_multi import two_devices  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    """Two devices of one backend (PoCL's two here), else an OpenCL device and a second
    context on it (tests/pipeline/test_multi.py)."""
    first, second, made = two_devices()
    yield [first, second]
    if made is not None:
        gc.collect()
        made.close()
