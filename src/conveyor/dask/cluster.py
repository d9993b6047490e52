"""Connecting to a Dask cluster for the ``conveyor`` command's ``--scheduler``/``--cluster``."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from typing import Any

from conveyor.errors import InputError

CLUSTERS = ("local", "local-cuda")


@contextlib.contextmanager
def connect(scheduler: str | None = None, cluster: str | None = None) -> Iterator[Any]:
    """A ``distributed.Client``: of the scheduler at ``scheduler`` (``tcp://host:8786``), or
    of a cluster started here and stopped on exit: ``cluster="local"`` (a ``LocalCluster`` of
    worker processes) or ``"local-cuda"`` (dask-cuda's ``LocalCUDACluster``, one worker per
    GPU). InputError when Dask (or dask-cuda) is missing or both or neither are given."""
    if (scheduler is None) == (cluster is None):
        raise InputError("give one of --scheduler ADDRESS and --cluster local|local-cuda")
    # A Ctrl-C while the client gathers leaves the client's waiting tasks to end with
    # distributed's AllExit, which asyncio logs as "Task exception was never retrieved", a
    # traceback each, after the command's one line. The command is no asyncio program.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise InputError("running on a cluster needs Dask: pip install 'conveyor[dask]'"
                         ) from exc
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="10s")
        except ValueError as exc:  # no port, an unknown scheme
            raise InputError(f"--scheduler {scheduler!r} is not a scheduler address ({exc}): "
                             f"give one like tcp://HOST:8786") from exc
        except OSError as exc:
            raise InputError(f"--scheduler {scheduler}: no Dask scheduler answers there "
                             f"({exc}): check the address (tcp://HOST:8786)") from exc
        except TypeError as exc:  # tls:// with no ssl_context, ucx:// without UCX installed
            raise InputError(f"--scheduler {scheduler}: Dask cannot open that kind of "
                             f"connection here ({exc}): configure TLS in Dask's settings or "
                             f"install UCX for ucx://, or give tcp://HOST:8786") from exc
        with client:
            yield client
        return
    made: Any
    if cluster == "local":
        # The command reports a failure itself, in one line: the workers' own logs of it
        # (a task's traceback, "Compute Failed", tasks cancelled by Ctrl-C) would bury it.
        made = LocalCluster(processes=True, dashboard_address=":0",
                            silence_logs=logging.CRITICAL)
    elif cluster == "local-cuda":
        if importlib.util.find_spec("dask_cuda") is None:
            raise InputError("--cluster local-cuda needs dask-cuda (pip install dask-cuda) "
                             "and NVIDIA GPUs; use --cluster local for CPU worker processes")
        from dask_cuda import LocalCUDACluster

        made = LocalCUDACluster()
    else:
        raise InputError(f"--cluster {cluster}: use one of {', '.join(CLUSTERS)}")
    with made, Client(made) as client:
        yield client
