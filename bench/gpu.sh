#!/usr/bin/env bash
# The benchmark suite of issue 6 on the lent GPU machine, from the repository root:
#   bash bench/gpu.sh [OUTDIR] [suite options, e.g. --gib 1]
#   bash bench/gpu.sh /tmp/suite --small     # tiny, on PoCL where there is no GPU
# Writes OUTDIR/suite.json, suite.md and suite.png (OUTDIR: $OUT if set, else bench/out) and
# prints suite.md. Sets up the carried wheels and NVIDIA's OpenCL (scripts/gpu-env.sh) unless
# src/ is on PYTHONPATH already.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
case ":${PYTHONPATH:-}:" in
    *":$PWD/src:"* | *":src:"*) ;;
    *) if [ -f scripts/gpu-env.sh ]; then
           # shellcheck source=/dev/null
           source scripts/gpu-env.sh || exit 1
       else
           export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
       fi ;;
esac
export PYTHONUNBUFFERED=1
out="${OUT:-bench/out}"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    out="$1"
    shift
fi
exec "${PYTHON:-python3}" -m bench.suite --out "$out" "$@"
