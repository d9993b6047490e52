# shellcheck shell=bash
# Source this on the lent GPU machine, from the project's root, before any GPU step:
#   source scripts/gpu-env.sh
# It installs the carried wheels (.whl/, fetched here by ../shared/gpu/fetch-wheels.sh) into
# /tmp/site, puts them and src/ on PYTHONPATH, and registers NVIDIA's OpenCL driver (plus any
# ICD already installed, such as PoCL's) for this shell through OCL_ICD_VENDORS.
_conveyor_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if compgen -G "$_conveyor_root/.whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$_conveyor_root"/.whl/*.whl || return 1 2> /dev/null || exit 1
fi
export PYTHONPATH="/tmp/site:$_conveyor_root/src${PYTHONPATH:+:$PYTHONPATH}"

mkdir -p /tmp/icd
for _icd in /etc/OpenCL/vendors/*.icd; do
    [ -e "$_icd" ] && cp -f "$_icd" /tmp/icd/
done
for _lib in /usr/lib/libnvidia-opencl.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 \
            /usr/lib64/libnvidia-opencl.so.1; do
    if [ -e "$_lib" ]; then
        echo "$_lib" > /tmp/icd/nvidia.icd
        break
    fi
done
export OCL_ICD_VENDORS=/tmp/icd
unset _conveyor_root _icd _lib
