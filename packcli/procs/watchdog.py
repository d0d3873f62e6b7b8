"""The watchdog of a command-line run: it ends a run that a stop request did not end, or that waits on nothing.

Two cases nobody predicted, each ended through ``cleanup.end_now``:
- a stop request (SIGINT, SIGTERM) not honoured within ``STOP_GRACE`` seconds: the run is stuck where
  no safe point comes; it exits 130 as an interrupted run does;
- a pool of workers open, none of them alive, and no answer from it for ``STALL`` seconds: the run waits
  for work nobody does; it says so and exits 1.

Only the command line starts it: a library call must never end its caller's process.
"""

from __future__ import annotations

import threading
import time

from packcli.procs import cleanup, lifetime, stop

STOP_GRACE = 5.0
STALL = 30.0
LOOK_EVERY = 0.5

_STARTED: list[threading.Thread] = []


def start(interrupted: str, stalled: str) -> None:
    """Start the watchdog (once a process); ``interrupted`` and ``stalled`` are the lines it ends with."""
    if _STARTED:
        return
    thread = threading.Thread(target=_watch, args=(interrupted, stalled), daemon=True, name="packcli-watchdog")
    thread.start()
    _STARTED.append(thread)


def _watch(interrupted: str, stalled: str) -> None:
    while True:
        time.sleep(LOOK_EVERY)
        asked = stop.stop_requested_at()
        if asked is not None and time.monotonic() - asked > STOP_GRACE:
            cleanup.end_now(130, interrupted)
        if lifetime.stalled(STALL):
            cleanup.end_now(1, stalled)
