"""A stop request (Ctrl-C, SIGTERM): asked for by the signal handler, honoured by the run at its safe points.

The one piece of process-wide state of a run, kept with the worker processes it stops: the request,
whether the run is already stopping, and how deep the main thread is in calls that a request must
interrupt at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

_STOP = threading.Event()
_STOPPING = threading.Event()
# How deep the main thread is in blocking calls that a stop request interrupts at once (see interruptible).
_BLOCKING = [0]
# When the stop was first requested (time.monotonic()), for the watchdog.
_ASKED_AT: list[float] = []


def stop_requested() -> bool:
    """Whether a stop was requested (and not forgotten since)."""
    return _STOP.is_set()


def request_stop() -> None:
    """Ask the running pack to stop at its next safe point (called from a signal handler)."""
    if not _ASKED_AT:
        _ASKED_AT.append(time.monotonic())
    _STOP.set()


def stop_requested_at() -> float | None:
    """When the stop was first requested (``time.monotonic()``), or None."""
    return _ASKED_AT[0] if _ASKED_AT and _STOP.is_set() else None


def reset_stop() -> None:
    """Forget an earlier stop request, so that a new run in the same process (a library call) runs."""
    _STOP.clear()
    _ASKED_AT.clear()


def raise_if_stopped() -> None:
    """Raise KeyboardInterrupt if a stop was requested: long loops call this between steps.

    Stopping at these points, never inside an import or a file write, is what lets a run that is
    interrupted clean up every time.
    """
    if _STOP.is_set():
        begin_stopping()
        raise KeyboardInterrupt


def begin_stopping() -> bool:
    """Mark the run as stopping; return True the first time only.

    A signal that arrives while the run is already cleaning up must not interrupt the cleanup (the
    staging directory would be left behind): only the first stop raises.
    """
    first = not _STOPPING.is_set()
    _STOPPING.set()
    return first


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Let the first stop request interrupt the main thread at once while it runs the body.

    For calls that may block for ever (opening a FIFO that no program writes, reading standard input
    or a pipe): the signal handler raises KeyboardInterrupt inside them instead of waiting for a safe
    point they never reach. The body must be safe to stop anywhere (it reads inputs; what it writes is
    removed when it is stopped). In other threads, which receive no signals, it changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raise_if_stopped()
    _BLOCKING[0] += 1
    try:
        yield
    finally:
        _BLOCKING[0] -= 1


def stop_at_once() -> bool:
    """Whether a stop request must interrupt the main thread where it is (it is inside ``interruptible``)."""
    return _BLOCKING[0] > 0
