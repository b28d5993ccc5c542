"""Executors for ``tokenize(executor=...)`` beyond the standard library's: Ray.

Ray has no ``concurrent.futures.Executor`` (ray-project/ray#29456). ``ray.util.multiprocessing.Pool`` works as
``executor=`` as it is (``tokenize`` only calls ``map``); :class:`RayExecutor` is the full ``Executor``: each
``submit`` is one Ray task, and its ``ObjectRef.future()`` is the ``Future``. ``tokenize`` ships each task its
partition (file paths and byte ranges, never data), so every node must see the inputs and the output's work
folder at the same paths (a shared file system), as with dask.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

from ..errors import ConfigError

__all__ = ["FASTOKENS_DEFAULT_CAP", "RayExecutor", "engine_threads", "in_process_engine_threads"]


def engine_threads(executor: Executor) -> int | None:
    """How many threads each of ``executor``'s worker processes may give its engine so that the workers together do
    not run more encoding threads than this machine has cores: ``max(1, C // N)`` for a standard-library process
    pool of ``N`` workers on ``C`` cores (:func:`_cores`), when that is fewer than ``C``; else None (the engines'
    default: a pool of one worker, or any pool on one core). None for any other executor: a thread pool's workers
    share this process's engines, and dask's or Ray's workers may run on other machines, with other cores and
    other neighbours."""
    if not isinstance(executor, ProcessPoolExecutor):
        return None
    workers = getattr(executor, "_max_workers", None)  # the pool's size: no public accessor
    if not isinstance(workers, int) or workers < 1:
        return None
    cores = _cores()
    threads = max(1, cores // workers)
    return threads if threads < cores else None


#: fastokens' own default for its batch threads: one per core, at most this many (its ``MAX_DEFAULT_THREADS``; a
#: count it is given explicitly has no cap).
FASTOKENS_DEFAULT_CAP = 32


def in_process_engine_threads() -> int | None:
    """The threads a run encoding in this process (no executor) gives fastokens for each batch: one core fewer than
    this process may run on (:func:`_cores`), at least one; None (its own default) where that would not be fewer
    than its default: above :data:`FASTOKENS_DEFAULT_CAP` cores, and on macOS, where its default counts the
    performance cores only. The run's reader and its main thread (parsing the input, spooling the ids: Python,
    under the GIL) keep about one core busy beside the engine. On two cores one fastokens thread beside them is
    faster than two, for less CPU: a batch split between two threads is joined by the calling thread, which spins
    while the other, descheduled by the reader or the main thread, finishes its share (``benchmarks/README.md``,
    ``tok6``, both with two batches ahead: 1.42-1.53 against 1.62-1.64 s, 2.20-2.34 against 2.55-2.60 CPU-s for
    220 MB). Above two cores the rule is not measured; it only ever lowers fastokens' default by one."""
    cores = _cores()
    if sys.platform == "darwin" or cores > FASTOKENS_DEFAULT_CAP:
        return None
    return max(1, cores - 1)


def _cores() -> int:
    """The cores this process may run on, counted as the engines' thread pools count them by default (Rust's
    ``available_parallelism``): those its CPU affinity allows, fewer under a cgroup CPU quota (a container's
    ``--cpus``: quota // period, at least one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    return min(cores, quota) if quota is not None else cores


#: Where a container's CPU quota is: cgroup v2's ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD"), else cgroup v1's.
_CPU_MAX = "/sys/fs/cgroup/cpu.max"
_CFS_QUOTA, _CFS_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"


def _cgroup_quota() -> int | None:
    """Whole cores the cgroup file system's root allows (at least one), or None: no quota, or none readable (not
    Linux, no cgroup file system). In a container (its own cgroup namespace, as Docker and Kubernetes give it) the
    root is the container's cgroup; a quota set on a cgroup nested below it is not seen. Each file read is bounded
    and parsed as untrusted: anything unexpected means no quota."""
    fields = _small_text(_CPU_MAX).split()
    if len(fields) != 2:
        fields = [_small_text(_CFS_QUOTA).strip(), _small_text(_CFS_PERIOD).strip()]
    quota, period = fields
    if not (quota.isdigit() and period.isdigit()) or int(period) == 0:  # "max", "-1" or unreadable: no quota
        return None
    return max(1, int(quota) // int(period))


def _small_text(path: str) -> str:
    """The first 64 bytes of ``path`` as ASCII text; "" when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(64).decode("ascii", errors="replace")
    except OSError:
        return ""


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The one Ray task: any callable Ray can pickle (a builtin too, which ``ray.remote`` cannot wrap)."""
    return fn(*args, **kwargs)


class RayExecutor(Executor):
    """A ``concurrent.futures.Executor`` running each call as a Ray task on the connected cluster.

    Args:
        num_cpus: CPUs Ray reserves per task (1 by default: one partition per core).
        address: when Ray is not yet initialised, the cluster to join (``"auto"``, ``"ray://host:10001"``,
            ``"local"``); by default ``ray.init()``'s own choice.
    """

    def __init__(self, num_cpus: float = 1, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("RayExecutor needs Ray: pip install 'tokformats[ray]'.") from None
        if not ray.is_initialized():
            ray.init(address=address)
        self._ray = ray
        self._task = ray.remote(num_cpus=num_cpus)(_call)
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` as a Ray task; its result (or exception) arrives in the returned future."""
        if self._shutdown:
            raise RuntimeError("cannot submit to a RayExecutor after shutdown")
        future: Future[Any] = self._task.remote(fn, args, kwargs).future()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse further tasks (the Ray cluster itself stays up: it is the caller's)."""
        self._shutdown = True
