"""Ending a run at once: what it must remove first (its temporary files), and the steps it must not cut.

A run ended this way (a second interrupt, or the watchdog: ``procs.watchdog``) does not unwind: its
workers are killed, the temporary files and directories it registered here are removed, one line is
written to stderr and the process exits. Nothing it leaves can pass for a complete output: outputs
appear by a rename of a complete staging directory, which runs inside ``critical`` and is never cut;
a kill at any other point is the SIGKILL case the safety guide covers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from packcli.procs import lifetime

CRITICAL_WAIT = 10.0  # the longest an end at once waits, from another thread, for a critical step to finish

# The run's temporary files and directories, by path, in the order they were made.
_TEMPORARY: dict[Path, None] = {}
# How deep the main thread is in steps an end at once must not cut, and an end asked for meanwhile.
_CRITICAL = [0]
_PENDING: list[tuple[int, str]] = []


def temporary(path: Path) -> Path:
    """Register ``path`` as the run's to remove if it is ended at once; return it."""
    _TEMPORARY[path] = None
    return path


def kept(path: Path) -> None:
    """Forget ``path``: removed already, or about to become what the run made."""
    _TEMPORARY.pop(path, None)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Run the body whole even if the run is ended at once meanwhile (the end comes right after it)."""
    _CRITICAL[0] += 1
    try:
        yield
    finally:
        _CRITICAL[0] -= 1
        if not _CRITICAL[0] and _PENDING:
            end_now(*_PENDING[0])


def end_now(code: int, line: str) -> None:
    """End the process: kill the workers, remove the temporaries, write ``line`` to stderr, exit with ``code``.

    Inside a critical step of the main thread, the end waits for the step: called there (a signal
    handler), it returns and the step's end ends the process; called from another thread, it waits up
    to ``CRITICAL_WAIT`` seconds for the step.
    """
    lifetime.kill_all()
    if _CRITICAL[0]:
        if threading.current_thread() is threading.main_thread():
            _PENDING.append((code, line))
            return
        deadline = time.monotonic() + CRITICAL_WAIT
        while _CRITICAL[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    remove_temporaries()
    with contextlib.suppress(OSError):
        os.write(2, (line.rstrip("\n") + "\n").encode("utf-8", "replace"))
    os._exit(code)


def remove_temporaries() -> None:
    """Remove every registered temporary file and directory, the newest first."""
    for path in reversed(list(_TEMPORARY)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
        _TEMPORARY.pop(path, None)
