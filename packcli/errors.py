"""The one error hierarchy. Core modules raise these; ``cli.main`` turns them into one line and an exit code."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

_STOP = threading.Event()
_STOPPING = threading.Event()
# How deep the main thread is in blocking calls that a stop request interrupts at once (see interruptible).
_BLOCKING = [0]


class PackcliError(Exception):
    """A known failure: the message is one line that names what went wrong and how to fix it."""

    exit_code = 1


class UsageError(PackcliError):
    """Bad flags or options (exit code 2)."""

    exit_code = 2


class InputError(PackcliError):
    """Bad or unreadable input data (exit code 1)."""


class TokenizerError(PackcliError):
    """The tokenizer or chat template cannot be loaded or applied (exit code 1)."""


class OutputError(PackcliError):
    """The output cannot be written (exit code 1)."""


class IncompatibleError(PackcliError):
    """A packed output does not fit what trains on it: the recipe's task, the model or the tokenizer (exit code 1)."""


class Interrupted(PackcliError):
    """The run was stopped by a signal; nothing partial was left behind (exit code 130)."""

    exit_code = 130


class RecordError(Exception):
    """One record cannot be used. ``reason`` is a short snake_case key counted in the summary."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def too_many_digits() -> str:
    """Return the words for an integer Python refuses to convert: longer than its digit limit (4,300).

    JSON has no such limit, so a record, preset or flag may hold one; every place that meets it says so
    in these words.
    """
    return f"an integer of more than {sys.get_int_max_str_digits()} digits"


def first_line(exc: BaseException, limit: int | None = 200) -> str:
    """Return the first line of an exception's message (its type name when it has none), at most ``limit`` long
    (None: the whole line).

    Third-party errors (transformers, Jinja, Arrow) can be many lines long; packcli's messages are one.
    """
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


def where(source: str, unit: str, position: int) -> str:
    """Return the words that name a record in an error message: its source, ``line`` or ``record``, and its number."""
    return f"{source} {unit} {position}"


def request_stop() -> None:
    """Ask the running pack to stop at its next safe point (called from a signal handler)."""
    _STOP.set()


def reset_stop() -> None:
    """Forget an earlier stop request, so that a new run in the same process (a library call) runs."""
    _STOP.clear()


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
