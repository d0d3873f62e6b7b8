"""The command line: a client of the library (``packcli.api``).

``_app.py`` holds the typer app and the error -> exit-code table; ``options.py`` the options shared by
commands; ``pack.py`` and ``report.py`` the commands; ``render.py`` everything a person sees (rich
tables, progress bars, error and warning lines). The package itself imports none of them, so that
the commands can import ``render`` and ``options`` without a circle.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from packcli.errors import INTERRUPTED

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Run the command line (the ``packcli`` entry point)."""
    # Until the run sets its own handlers (once the command's modules are imported), SIGINT and SIGTERM
    # end the process at once, with the line of an interrupted run: nothing was done yet.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stopped_early)
    from packcli.cli._app import main as run

    run(argv)


def _stopped_early(signum: int, frame: Any) -> None:
    os.write(2, f"Error: {INTERRUPTED}\n".encode())
    os._exit(130)


def __getattr__(name: str) -> Any:
    if name == "app":
        from packcli.cli._app import app

        return app
    raise AttributeError(f"module 'packcli.cli' has no attribute {name!r}")
