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
from collections.abc import Iterator
from typing import Any, Protocol

PR_SET_PDEATHSIG = 1
WATCH_SECONDS = 1.0

# The pools alive in this process, so that a second Ctrl-C can kill their workers at once.
_POOLS: list[Pool] = []


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


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the body runs (a fork); one that came meanwhile is handled right after."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Pool(Protocol):
    """What this module asks of a pool it keeps: its processes, and to kill them."""

    def processes(self) -> list[Any]: ...

    def kill(self) -> None: ...

    @property
    def last_answer(self) -> float: ...


def register(pool: Pool) -> None:
    """Keep ``pool`` until it is forgotten, so that a second interrupt or the watchdog can reach its workers."""
    _POOLS.append(pool)


def forget(pool: Pool) -> None:
    with contextlib.suppress(ValueError):
        _POOLS.remove(pool)


def kill_all() -> None:
    """SIGKILL every worker of every pool (called on a second interrupt: end everything at once)."""
    for pool in list(_POOLS):
        pool.kill()


def stalled(seconds: float) -> bool:
    """Whether an open pool has no live worker and has not answered for ``seconds`` (a run waiting on nothing)."""
    now = time.monotonic()
    for pool in list(_POOLS):
        if now - pool.last_answer <= seconds:
            continue
        alive = False
        for process in pool.processes():
            with contextlib.suppress(OSError, ValueError, AssertionError):
                alive = alive or bool(process.is_alive())
        if not alive:
            return True
    return False
