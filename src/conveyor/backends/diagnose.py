"""Why a device that should be here is not, or is but cannot work: checks that name the fix.

- NVIDIA's OpenCL driver ships as ``libnvidia-opencl.so.1``; the OpenCL ICD loader finds it
  only through an ``.icd`` file naming it. Containers often carry the library without the file
  (the lent GPU machine does), and then OpenCL lists no NVIDIA GPU with no word of why.
- cuda.core installed but no CUDA device listed: the driver or the GPU is missing.
- PoCL's CPU device offers only part of the host's memory (``POCL_MEMORY_LIMIT`` sets it).
- A device whose compiler cannot build even a trivial kernel (the PoCL of the
  pocl-binary-distribution wheel, LLVM 14, on CPUs newer than LLVM 14 knows).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor import config
from conveyor.errors import ConveyorError
from conveyor.kernels.portable import portable

if TYPE_CHECKING:
    from conveyor.backends.base import Device

NVIDIA_OPENCL_PATHS = (
    "/usr/lib/libnvidia-opencl.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1",
    "/usr/lib64/libnvidia-opencl.so.1",
    "/usr/local/nvidia/lib64/libnvidia-opencl.so.1",
)


def _registered(vendor_dirs: Sequence[Path]) -> bool:
    for place in vendor_dirs:
        files = [place] if place.is_file() else sorted(place.glob("*.icd"))
        for icd in files:
            try:
                if "nvidia-opencl" in icd.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def unregistered_nvidia_opencl(
    library_paths: Sequence[str] = NVIDIA_OPENCL_PATHS,
    vendor_dirs: Sequence[Path] | None = None,
) -> str | None:
    """A message with the fix when NVIDIA's OpenCL library exists but no ICD file names it;
    None when there is no such library or it is registered."""
    library = next((p for p in library_paths if Path(p).exists()), None)
    if library is None:
        return None
    dirs = list(vendor_dirs) if vendor_dirs is not None else config.icd_vendor_dirs()
    if _registered(dirs):
        return None
    return (
        f"NVIDIA's OpenCL library is at {library} but no OpenCL ICD file names it, so OpenCL "
        f"lists no NVIDIA GPU. Register it: `echo {library} > /etc/OpenCL/vendors/nvidia.icd` "
        f"(as root), or for one shell: `mkdir -p ~/.icd && echo {library} > ~/.icd/nvidia.icd "
        f"&& cp /etc/OpenCL/vendors/*.icd ~/.icd/ 2>/dev/null; export OCL_ICD_VENDORS=~/.icd`"
    )


def hidden_devices() -> list[str]:
    """Settings that hide installed devices, each with its fix, for a machine where no device
    was found at all: "install pocl-binary-distribution" was the only advice, for a PoCL
    that was installed all along."""
    found = []
    # What OCL_ICD_VENDORS names (icd_vendor_dirs lists it before the system's folder): the
    # ICD loader then reads drivers' .icd files from there instead of /etc/OpenCL/vendors.
    for place in config.icd_vendor_dirs():
        if place == SYSTEM_VENDORS:
            continue
        what = (" and does not exist" if not place.exists() else
                " and holds no .icd file" if place.is_dir() and not any(place.glob("*.icd"))
                else "")
        found.append(f"{config.ICD_VENDORS_VAR}={str(place)!r} is set{what}: the OpenCL ICD "
                     f"loader looks for drivers' .icd files there instead of {SYSTEM_VENDORS}, "
                     f"so the installed ones are not found; unset it, or copy the .icd files "
                     f"of {SYSTEM_VENDORS} into it")
    home = pocl_home_refusal()
    if home is not None:
        found.append(home)
    kinds = config.pocl_devices()
    if kinds is not None:  # a typo ("pthreads") lists none of PoCL's devices
        found.append(f"POCL_DEVICES={kinds!r} is set: PoCL lists only the kinds of device it "
                     f"names (cpu, pthread, basic...); unset it, or name one PoCL has")
    return found


#: Where the OpenCL ICD loader finds drivers' .icd files unless OCL_ICD_VENDORS says.
SYSTEM_VENDORS = Path("/etc/OpenCL/vendors")


def pocl_home_refusal() -> str | None:
    """Why PoCL cannot make its kernel cache under the home (``XDG_CACHE_HOME``, else
    ``HOME/.cache``), or None. PoCL then lists no device at all (a HOME that is a file, or
    one this user cannot write: ``docker run -u 1000`` with HOME=/)."""
    if config.pocl_cache_dir_set():
        return None  # PoCL's cache is where POCL_CACHE_DIR says, not under the home
    base = config.driver_cache_home()
    if base is None:
        why = "there is no home folder"
    else:
        probe = Path(base).absolute()
        while not os.path.lexists(probe) and probe.parent != probe:
            probe = probe.parent
        if not probe.is_dir():
            why = f"{probe} is not a folder"
        elif not os.access(probe, os.W_OK | os.X_OK):
            why = f"this user cannot write {probe}"
        else:
            return None
    where = f"{base}/pocl" if base is not None else "the home folder"
    return (f"PoCL keeps its kernel cache under {where} (XDG_CACHE_HOME, else HOME/.cache), "
            f"and {why}, so PoCL lists no device: set HOME to a folder you can write, or "
            f"POCL_CACHE_DIR to one for PoCL's cache")


def cuda_without_devices(devices: Sequence[Device], cuda_installed: bool | None = None
                         ) -> str | None:
    """A message when cuda.core is installed but no CUDA device was found."""
    if cuda_installed is None:
        try:
            cuda_installed = importlib.util.find_spec("cuda.core") is not None
        except (ImportError, ValueError):
            cuda_installed = False
    if not cuda_installed or any(d.backend == "cuda" for d in devices):
        return None
    return ("cuda.core is installed but no CUDA device was found: check that `nvidia-smi` "
            "lists a GPU and that the driver matches cuda-bindings' major version")


def pocl_memory(devices: Sequence[Device], host_bytes: int | None = None) -> list[str]:
    """A note for each PoCL CPU device offering less than the host's memory."""
    if host_bytes is None:
        from conveyor.memory.hostmem import physical_bytes

        host_bytes = physical_bytes()
        if host_bytes is None:
            return []
    notes = []
    for dev in devices:
        if "Portable Computing Language" in dev.info.platform and dev.kind == "cpu":
            if dev.global_mem_bytes < host_bytes // 2:
                notes.append(
                    f"{dev.spec} (PoCL) offers {dev.global_mem_bytes / 2**30:.1f} GiB of this "
                    f"machine's {host_bytes / 2**30:.1f} GiB; set POCL_MEMORY_LIMIT=<GiB> to "
                    f"change it"
                )
    return notes


_PROBE = portable("__kernel void conveyor_probe(__global float *x) { x[0] = 1.0f; }")


def cannot_compile(devices: Sequence[Device]) -> list[str]:
    """A message for each device whose compiler fails on a trivial kernel (builds one each)."""
    found = []
    for dev in devices:
        try:
            dev.build_binary(_PROBE, ())
        except ConveyorError as exc:
            first = next((line for line in str(exc).splitlines()[1:] if line.strip()), "")
            found.append(
                f"{dev.spec} ({dev.name}) cannot build kernels: {first.strip()[:160]}; "
                f"pick another device (CONVEYOR_DEVICE / --device)"
            )
    return found


def problems(devices: Sequence[Device] | None = None, probe: bool = False) -> list[str]:
    """Every known misconfiguration found on this machine, each with its fix. With ``devices``
    the device checks run too; ``probe`` also builds a trivial kernel on each (slow)."""
    found = [p for p in [unregistered_nvidia_opencl()] if p]
    if devices is not None:
        cuda = cuda_without_devices(devices)
        found += [cuda] if cuda else []
        found += pocl_memory(devices)
        if probe:
            found += cannot_compile(devices)
    return found
