"""conveyor against its peers on the GPU (issue 6): one command, every figure in one run.

Run from the repository root:

    bash bench/gpu.sh [OUTDIR]                          # the lent GPU machine, full sizes
    PYTHONPATH=src python3 -m bench.suite --help        # options
    PYTHONPATH=src .venv/bin/python -m bench.suite --gib 0.0625 --block-mib 4 \\
        --device opencl:0:0 --out /tmp/suite            # PoCL on the CPU, tiny

Modules: ``workloads`` (data, kernels, NumPy references, checks), ``systems`` (conveyor on
CUDA and OpenCL, the naive PyOpenCL loop), ``cuda_peers`` (naive CuPy loop, hand-written CuPy
pipeline, PyTorch), ``ceilings`` (copy ceilings and the kernel alone), ``output`` (suite.json,
suite.md, suite.png and the issue's targets), ``__main__`` (the command).
"""
