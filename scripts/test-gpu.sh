#!/usr/bin/env bash
# Run the test suite once per backend that has a device here: CUDA, then OpenCL.
# On the lent GPU machine: `source scripts/gpu-env.sh; bash scripts/test-gpu.sh [pytest args]`.
set -uo pipefail
cd "$(dirname "$0")/.."
case ":${PYTHONPATH:-}:" in *":$PWD/src:"* | *":src:"*) ;; *) export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" ;; esac

present="$(python3 -c 'import conveyor as cv; print(" ".join(sorted({d.backend for d in cv.devices()})))')"
echo "backends with a device: ${present:-none}"
status=0
for backend in cuda opencl; do
    case " $present " in
        *" $backend "*) ;;
        *) echo "== $backend: no device, skipped"; continue ;;
    esac
    echo "== CONVEYOR_TEST_BACKENDS=$backend"
    CONVEYOR_TEST_BACKENDS=$backend CONVEYOR_TEST_KIND=${CONVEYOR_TEST_KIND:-gpu} \
        python3 -m pytest tests "$@" || status=1
done
exit $status
