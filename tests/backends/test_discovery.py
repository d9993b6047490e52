"""Device discovery: ``devices()``, ``device(spec)`` and ``CONVEYOR_DEVICE``."""

from __future__ import annotations

import pytest

import conveyor as cv

ALL = cv.devices()
OPENCL = [d for d in ALL if d.backend == "opencl"]


@pytest.fixture(autouse=True)
def no_device_env(monkeypatch):
    monkeypatch.delenv("CONVEYOR_DEVICE", raising=False)


def test_devices_lists_a_pocl_cpu_device_with_its_facts():
    cpus = [d for d in OPENCL if d.kind == "cpu" and "Portable" in d.info.platform]
    assert cpus, f"no PoCL CPU device among {ALL}"
    dev = cpus[0]
    assert dev.name and dev.spec.startswith("opencl:")
    assert 0 < dev.max_alloc_bytes <= dev.global_mem_bytes
    assert dev.compute_units >= 1
    assert isinstance(dev.svm, bool)
    assert dev.host_unified


def test_devices_are_found_once_and_shared():
    assert all(a is b for a, b in zip(cv.devices(), cv.devices(), strict=True))


def test_default_device_without_a_gpu_is_a_cpu_device():
    if any(d.kind == "gpu" for d in ALL):
        pytest.skip("a GPU is present: the default is the GPU")
    assert cv.device().kind == "cpu"


@pytest.mark.parametrize("spec", ["cpu", "opencl", "opencl:0", "opencl:0:0", " OpenCL:0:0 "])
def test_spec_selects_an_opencl_device(spec):
    dev = cv.device(spec)
    assert dev.backend == "opencl"
    assert dev in ALL


def test_full_spec_selects_exactly_that_device():
    for dev in ALL:
        assert cv.device(dev.spec) is dev


def test_platform_spec_selects_a_device_of_that_platform():
    assert cv.device("opencl:0").spec.startswith("opencl:0:")


@pytest.mark.parametrize("spec", ["cuda:7", "opencl:9:9", "banana"])
def test_bad_spec_raises_input_error_listing_the_devices(spec):
    with pytest.raises(cv.InputError) as caught:
        cv.device(spec)
    message = str(caught.value)
    assert spec in message
    assert all(d.spec in message for d in ALL)


def test_environment_variable_names_the_default_device(monkeypatch):
    monkeypatch.setenv("CONVEYOR_DEVICE", "cpu")
    assert cv.device() is cv.device("cpu")


def test_explicit_spec_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("CONVEYOR_DEVICE", "banana")
    assert cv.device("opencl:0:0").spec == "opencl:0:0"


def test_bad_environment_device_raises_input_error(monkeypatch):
    monkeypatch.setenv("CONVEYOR_DEVICE", "banana")
    with pytest.raises(cv.InputError, match="banana"):
        cv.device()


def test_blank_environment_variable_means_the_default(monkeypatch):
    default = cv.device()
    monkeypatch.setenv("CONVEYOR_DEVICE", "   ")
    assert cv.device() is default


def test_a_bad_pool_keep_is_refused_when_a_device_is_asked_for(monkeypatch):
    # The pools read it mid-stream, when first needed: before, the error came from inside the
    # engine, raised again by its clean-up.
    monkeypatch.setenv("CONVEYOR_POOL_KEEP", "lots")
    with pytest.raises(cv.InputError, match="CONVEYOR_POOL_KEEP='lots' is not a size"):
        cv.device(OPENCL[0].spec)


@pytest.mark.parametrize("spec", [0, 1.5, b"opencl:0:0", ["opencl:0:0"]],
                         ids=["int", "float", "bytes", "list"])
def test_a_spec_that_is_not_a_string_says_what_to_pass(spec):
    """cv.device(0) was AttributeError: 'int' object has no attribute 'strip'."""
    with pytest.raises(cv.InputError, match=r"pass a spec string like 'cuda:0'"):
        cv.device(spec)


def test_a_device_passed_to_device_is_returned_as_it_is(device):
    assert cv.device(device, warm_up=False) is device
