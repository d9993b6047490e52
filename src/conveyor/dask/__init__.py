"""conveyor on Dask: the same streams, one per chunk or per worker, on a Dask cluster.

- :func:`map_blocks` and :func:`reduce` over ``dask.array`` arrays (``conveyor.dask.arrays``);
- :func:`stream` from files to files, one long stream per worker over its own rows
  (``conveyor.dask.files``);
- :func:`kernel` names a kernel by its source, built on each worker once and kept there
  (``conveyor.dask.worker``): the client compiles nothing and opens no device;
  :func:`warm` builds it on every worker ahead of the first task.

Needs the extra: ``pip install 'conveyor[dask]'`` (dask[array] and distributed; dask-cuda for
``LocalCUDACluster``).
"""

from __future__ import annotations

from conveyor.dask.arrays import map_blocks, reduce
from conveyor.dask.files import stream
from conveyor.dask.worker import KernelSpec, kernel, warm

__all__ = ["KernelSpec", "kernel", "map_blocks", "reduce", "stream", "warm"]
