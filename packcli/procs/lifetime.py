"""Worker processes that never outlive packcli.

A worker dies with its parent: on Linux the kernel sends it SIGKILL when the parent dies
(``PR_SET_PDEATHSIG``), even when the parent was killed with SIGKILL (the OOM killer, a CI timeout);
a watchdog thread that sees the parent change is the fallback elsewhere. A worker takes SIGTERM with
the default action (it must not inherit the parent's handler, which only asks for a stop), and
ignores SIGINT: Ctrl-C reaches the whole process group, and the parent stops the workers itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

PR_SET_PDEATHSIG = 1
WATCH_SECONDS = 1.0

# The pools alive in this process, so that a second Ctrl-C can kill their workers at once.
_POOLS: list[ProcessPoolExecutor] = []


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def init_worker(parent_pid: int) -> None:
    """Run first in every worker process (the pool's initializer).

    The worker was forked with SIGINT and SIGTERM blocked (see ``submit``), so the parent's handlers
    it inherited never run; they are replaced before the signals are let in.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the death signal was asked for
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="packcli-watchdog").start()


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(WATCH_SECONDS)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)


def start_pool(workers: int, context: Any, initializer: Any, *initargs: Any) -> ProcessPoolExecutor:
    """Start a pool of ``workers`` processes whose initializer gets this process's PID, then ``initargs``."""
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=initializer, initargs=(os.getpid(), *initargs)
    )
    _POOLS.append(pool)
    return pool


def submit(pool: ProcessPoolExecutor, fn: Any, *args: Any) -> Any:
    """Submit a job with SIGINT and SIGTERM held back: a pool forks its workers on the first submit, and
    an interrupt between a fork and the pool's record of the new process would leave a worker that
    nothing stops. A signal that comes meanwhile is handled right after."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return pool.submit(fn, *args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _processes(pool: ProcessPoolExecutor) -> list[Any]:
    return list((getattr(pool, "_processes", None) or {}).values())


def stop_pool(pool: ProcessPoolExecutor, grace: float = 1.0) -> None:
    """Stop a pool without waiting for the work in flight: SIGTERM, then SIGKILL after ``grace``."""
    processes = _processes(pool)
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            if process.is_alive():
                process.kill()
                process.join(1.0)
    close_pool(pool, wait=True, cancel=True)


def close_pool(pool: ProcessPoolExecutor, wait: bool = True, cancel: bool = False) -> None:
    with contextlib.suppress(ValueError):
        _POOLS.remove(pool)
    pool.shutdown(wait=wait, cancel_futures=cancel)


def kill_all() -> None:
    """SIGKILL every worker of every pool (called on a second interrupt: end everything at once)."""
    for pool in list(_POOLS):
        for process in _processes(pool):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                process.kill()
