"""The ICD check names NVIDIA's OpenCL library when it is present but not registered."""

from __future__ import annotations

from pathlib import Path

from conveyor.backends.diagnose import (
    cannot_compile,
    cuda_without_devices,
    pocl_memory,
    unregistered_nvidia_opencl,
)


def _library(tmp_path: Path) -> str:
    lib = tmp_path / "libnvidia-opencl.so.1"
    lib.write_bytes(b"\x7fELF")
    return str(lib)


def test_present_but_unregistered_names_the_library_and_the_fix(tmp_path):
    lib = _library(tmp_path)
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "pocl.icd").write_text("libpocl.so.2\n")
    message = unregistered_nvidia_opencl([lib], [vendors])
    assert message is not None
    assert lib in message and "nvidia.icd" in message and "OCL_ICD_VENDORS" in message


def test_registered_library_is_not_a_problem(tmp_path):
    lib = _library(tmp_path)
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "nvidia.icd").write_text(lib + "\n")
    assert unregistered_nvidia_opencl([lib], [vendors]) is None


def test_an_icd_file_given_directly_counts(tmp_path):
    lib = _library(tmp_path)
    icd = tmp_path / "one.icd"
    icd.write_text(lib)
    assert unregistered_nvidia_opencl([lib], [icd]) is None


def test_no_library_no_message(tmp_path):
    assert unregistered_nvidia_opencl([str(tmp_path / "missing.so")], [tmp_path]) is None


def test_cuda_installed_without_devices_is_named(device):
    message = cuda_without_devices([device], cuda_installed=True)
    if device.backend == "cuda":
        assert message is None
    else:
        assert "no CUDA device" in message and "nvidia-smi" in message


def test_cuda_not_installed_is_not_a_problem(device):
    assert cuda_without_devices([device], cuda_installed=False) is None


def test_pocl_memory_note_names_the_variable(device):
    notes = pocl_memory([device], host_bytes=device.global_mem_bytes * 4)
    if "Portable Computing Language" in device.info.platform and device.kind == "cpu":
        assert len(notes) == 1 and "POCL_MEMORY_LIMIT" in notes[0]
    else:
        assert notes == []


def test_a_device_that_compiles_is_not_listed(device):
    assert cannot_compile([device]) == []  # conftest only hands out devices that compile
