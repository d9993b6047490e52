"""Why a device that should be here is not: checks that name the fix.

NVIDIA's OpenCL driver ships as ``libnvidia-opencl.so.1``; the OpenCL ICD loader finds it only
through an ``.icd`` file naming it. Containers often carry the library without the file (the
lent GPU machine does), and then OpenCL lists no NVIDIA GPU with no word of why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from conveyor import config

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


def problems() -> list[str]:
    """Every known misconfiguration found on this machine, each with its fix."""
    found = unregistered_nvidia_opencl()
    return [found] if found else []
