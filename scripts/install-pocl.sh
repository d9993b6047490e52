#!/usr/bin/env bash
# Make sure PoCL's CPU device can compile kernels here.
#
# The PoCL inside the pocl-binary-distribution wheel (3.0-rc2, LLVM 14) fails every build on
# CPUs newer than LLVM 14 knows ("unknown target CPU 'generic'", seen on AMD Zen 5). Debian's
# PoCL (3.1, LLVM 15) builds there. Where we are root with apt-get (CI, containers), install
# it; elsewhere leave the machine alone and say so: the wheel's PoCL works on older CPUs.
set -euo pipefail
if dpkg -s pocl-opencl-icd >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's PoCL (pocl-opencl-icd) for the CPU OpenCL device"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends pocl-opencl-icd >/dev/null
else
    echo "note: not root or no apt-get: using only the pocl-binary-distribution wheel's PoCL" >&2
fi
