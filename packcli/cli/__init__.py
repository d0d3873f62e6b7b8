"""The command line: a client of the library (``packcli.api``).

``_app.py`` holds the typer app and the error -> exit-code table; ``options.py`` the options shared by
commands; ``pack.py`` and ``report.py`` the commands; ``render.py`` everything a person sees (rich
tables, progress bars, error and warning lines). The package itself imports none of them, so that
the commands can import ``render`` and ``options`` without a circle.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from packcli.errors import INTERRUPTED

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Run the command line.

    As the ``packcli`` entry point (``argv`` None: the process's own arguments) it ends the process once the
    command is over (``_exit``); given ``argv`` (a test, a script that goes on after it) it returns, or
    raises ``SystemExit`` as any click program does.
    """
    # Until the run sets its own handlers (once the command's modules are imported), SIGINT and SIGTERM
    # end the process at once, with the line of an interrupted run: nothing was done yet.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stopped_early)
    # numpy before the app: numpy's typing module builds about 200 Literal types as it is imported, and once
    # typing_extensions is (typer's pydantic imports it) each one goes through its slower replacement of
    # typing's parameter collection: 1.2 ms imported first, 38-57 ms after it under ``python -m packcli``
    # (a tenth of a cache hit). Every command but ``--help`` and ``--version`` imports numpy anyway.
    import numpy  # noqa: F401

    # pyarrow's allocator in packcli's processes (a user's own choice kept): read by libarrow once, as it
    # loads, so set before anything loads pyarrow (``arrow_allocator``).
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = arrow_allocator()

    from packcli.cli._app import main as run

    if argv is not None:
        run(argv)
        return
    try:
        run(argv)
    except SystemExit as exc:
        _exit(exc.code)
    _exit(0)


def arrow_allocator() -> str:
    """The allocator packcli's processes have pyarrow use: jemalloc where this pyarrow was built with it (its
    build's configuration header says so, read without loading pyarrow), else the system's malloc.

    pyarrow's default, mimalloc, made packcli's reads and writes of Parquet slower: on 17,545
    conversations' three shards (5 runs each, seconds), the pack's write 1.40-1.51 against 0.97-1.11 with
    the system's malloc, ``verify`` 1.76-2.13 against 1.17-1.27 (system) and 1.07-1.09 (jemalloc),
    ``stats`` 0.71-1.54 against 0.87-0.89 and 0.78-0.80.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec("pyarrow")
        where = Path(spec.origin).parent if spec is not None and spec.origin else None
        built = (where / "include" / "arrow" / "util" / "config.h").read_text() if where else ""
    except (OSError, ValueError, ImportError):
        built = ""
    return "jemalloc" if "#define ARROW_JEMALLOC\n" in built else "system"


def _exit(code: Any) -> NoReturn:
    """End the process with ``code`` (as ``sys.exit`` takes it) once the command is over, without tearing
    down every module and object first: the exit handlers run and the streams are flushed as at any exit,
    and the memory goes back with the process (tearing down numpy, pydantic, typer and the rest took about
    a tenth of a cache hit). Where that cannot be done so (a thread still at work, a stream that cannot be
    flushed), Python's own exit ends it."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if any(t.is_alive() and not t.daemon and t is not threading.main_thread() for t in threading.enumerate()):
        sys.exit(code)  # Python's exit waits for it
    if not _flushed():
        sys.exit(code)  # nothing has run yet: Python says what could not be written, and how it ends
    atexit._run_exitfuncs()
    os._exit(code if _flushed() else 120)  # 120: Python's exit status when it cannot flush at exit


def _flushed() -> bool:
    """Whether stdout and stderr took what was written to them."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return False
    return True


def _stopped_early(signum: int, frame: Any) -> None:
    os.write(2, f"Error: {INTERRUPTED}\n".encode())
    os._exit(130)


def __getattr__(name: str) -> Any:
    if name == "app":
        from packcli.cli._app import app

        return app
    raise AttributeError(f"module 'packcli.cli' has no attribute {name!r}")
