"""The ICD check names NVIDIA's OpenCL library when it is present but not registered."""

from __future__ import annotations

from pathlib import Path

from conveyor.backends.diagnose import unregistered_nvidia_opencl


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
