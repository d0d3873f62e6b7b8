"""Everything a person sees: progress bars and summary tables on stderr, via rich.

The commands reach it as one module (``import packcli.cli.render as console``); its parts are in
``consoles`` (the two consoles, ``Error:``/``Warning:`` lines, progress bars, ``--json``'s stdout),
``pack_summary`` (the pack summary's table), ``stats_tables`` (``packcli stats``' tables) and
``row_view`` (``packcli inspect``'s row, or record).

Only ``consoles``' lines and ``--json`` come with this module; the consoles themselves, the tables and
rich load when a command first uses them (a quiet run prints no table).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from packcli.cli.consoles import (
    STAGE_LABELS as STAGE_LABELS,
    emit_json as emit_json,
    error as error,
    progress_bars as progress_bars,
    stdout_for_json as stdout_for_json,
    warning as warning,
)

if TYPE_CHECKING:
    from packcli.cli.consoles import stderr as stderr, stdout as stdout
    from packcli.cli.pack_summary import (
        TEMPLATE_SOURCES as TEMPLATE_SOURCES,
        encoder_line as encoder_line,
        mix_table as mix_table,
        print_pack_summary as print_pack_summary,
        reasoning_words as reasoning_words,
    )
    from packcli.cli.row_view import (
        IMAGE_STYLE as IMAGE_STYLE,
        MASKED_STYLE as MASKED_STYLE,
        TRAINED_CLOSE as TRAINED_CLOSE,
        TRAINED_OPEN as TRAINED_OPEN,
        TRAINED_STYLE as TRAINED_STYLE,
        print_row as print_row,
        print_sample as print_sample,
    )
    from packcli.cli.stats_tables import (
        BAR_WIDTH as BAR_WIDTH,
        print_packed_stats as print_packed_stats,
        print_raw_stats as print_raw_stats,
    )

# The names above that load with their module on first use, and that module.
_LATER = {
    **dict.fromkeys(("stderr", "stdout"), "packcli.cli.consoles"),
    **dict.fromkeys(
        ("TEMPLATE_SOURCES", "encoder_line", "mix_table", "print_pack_summary", "reasoning_words"),
        "packcli.cli.pack_summary",
    ),
    **dict.fromkeys(
        (
            "IMAGE_STYLE",
            "MASKED_STYLE",
            "TRAINED_CLOSE",
            "TRAINED_OPEN",
            "TRAINED_STYLE",
            "print_row",
            "print_sample",
        ),
        "packcli.cli.row_view",
    ),
    **dict.fromkeys(("BAR_WIDTH", "print_packed_stats", "print_raw_stats"), "packcli.cli.stats_tables"),
}


def __getattr__(name: str) -> Any:
    module = _LATER.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
