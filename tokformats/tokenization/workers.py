"""Pool workers that stop when the run that started them dies.

When tokenize's process is killed (``kill -9``, the OOM killer) while a process pool encodes, the pool's workers
would live on as orphans, still appending to the spools of a run that a resume is about to take over. Two guards:

- :func:`die_with_parent`, the initializer of the pools tokformats creates (the command line's ``--workers``): on
  Linux the kernel sends the worker ``SIGKILL`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
- :func:`parent_watch`, around every partition job, whatever executor runs it: a thread that kills the worker as
  soon as its parent process changes (it was re-parented: the parent died). Killed, not exited: buffered spool
  writes must not be flushed by an orderly exit.

A worker that a pool runs in the parent's own process (threads) has nothing to watch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["die_with_parent", "parent_watch", "submitter"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCH_EVERY = 0.1  # seconds between the watchdog's looks at the parent


def _kill_self() -> None:
    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


def die_with_parent(parent: int | None = None) -> None:
    """Pool initializer: have the kernel kill this worker when its parent dies (Linux), and kill it now if the
    parent (process id ``parent``, when given) is already gone. Elsewhere a no-op (:func:`parent_watch` remains)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        _kill_self()


def submitter() -> tuple[str, int]:
    """Who submits a job: this machine (see :func:`_machine`) and this process's id, for :func:`parent_watch`."""
    return _machine(), os.getpid()


def _machine() -> str:
    """This machine's identity: host name and boot id (a job shipped to another machine has other process ids)."""
    import socket

    boot = ""
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
        boot = handle.read().strip()
    return f"{socket.gethostname()}/{boot}"


@contextlib.contextmanager
def parent_watch(origin: tuple[str, int] | None) -> Iterator[None]:
    """For the block, kill this process as soon as its parent is no longer the process that submitted the job
    (``origin``, from :func:`submitter`). Nothing is watched in the submitter itself (a thread pool), on another
    machine, or where the submitter is not this worker's parent (a cluster's worker under its own nanny)."""
    if origin is None or origin[1] == os.getpid() or origin[0] != _machine():
        yield
        return
    parent = origin[1]
    if os.getppid() != parent:
        if _alive(parent):  # a worker of someone else's process tree: its own supervisor stops it
            yield
            return
        _kill_self()  # the job was queued before the submitter died: an orphan must not start writing
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(_WATCH_EVERY):
            if os.getppid() != parent:
                _kill_self()

    watcher = threading.Thread(target=watch, name="tokformats-parent-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
