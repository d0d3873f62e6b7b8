"""Write docs/reference/cli.md from the commands' own ``--help``: ``python docs/gen_cli_reference.py``.

tests/test_docs.py fails when the checked-in page differs from what this prints now, so the reference
cannot drift from the command line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from typer import rich_utils
from typer.main import get_command
from typer.testing import CliRunner

PAGE = Path(__file__).parent / "reference" / "cli.md"
WIDTH = 100
HEADER = """# The command line

Generated from the commands' own `--help` by `docs/gen_cli_reference.py` (run it after changing an
option; `tests/test_docs.py` fails while this page and `--help` differ). The options of `packcli pack`
with their defaults in one table: [pack options at a glance](pack-options.md).
"""


def command_paths() -> list[list[str]]:
    """Every command and subcommand, as argument lists after ``packcli``, in help order."""
    from packcli.cli import app

    def walk(command: Any, prefix: list[str]) -> list[list[str]]:
        paths = [prefix]
        for name, sub in getattr(command, "commands", {}).items():  # a group's commands, in help order
            if not sub.hidden:
                paths += walk(sub, [*prefix, name])
        return paths

    return walk(get_command(app), [])


def render_help(path: list[str]) -> str:
    """``packcli PATH --help`` as a user sees it in a terminal WIDTH columns wide, without colour."""
    from packcli.cli import app

    # typer reads TERMINAL_WIDTH, GITHUB_ACTIONS, FORCE_COLOR and PY_COLORS once, at import: undo what they set.
    saved = {name: getattr(rich_utils, name) for name in ("MAX_WIDTH", "FORCE_TERMINAL", "COLOR_SYSTEM")}
    rich_utils.MAX_WIDTH, rich_utils.FORCE_TERMINAL, rich_utils.COLOR_SYSTEM = None, False, None
    try:
        runner = CliRunner(env={"COLUMNS": str(WIDTH), "TERM": "dumb", "NO_COLOR": "1", "FORCE_COLOR": None})
        result = runner.invoke(app, [*path, "--help"], prog_name="packcli", color=False)
    finally:
        for name, value in saved.items():
            setattr(rich_utils, name, value)
    if result.exit_code != 0:
        raise RuntimeError(f"packcli {' '.join(path)} --help exited {result.exit_code}: {result.output}")
    lines = [line.rstrip() for line in result.output.splitlines()]
    return "\n".join(lines).strip("\n")


def render_page() -> str:
    """The whole page: one section per command, its help in a text block."""
    parts = [HEADER]
    for path in command_paths():
        name = " ".join(["packcli", *path])
        parts.append(f"## `{name}`\n\n```text\n{render_help(path)}\n```\n")
    return "\n".join(parts)


def main() -> int:
    PAGE.write_text(render_page(), encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
