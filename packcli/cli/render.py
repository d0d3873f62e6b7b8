"""Everything a person sees: progress bars and summary tables on stderr, via rich.

The commands reach it as one module (``import packcli.cli.render as console``); its parts are in
``consoles`` (the two consoles, ``Error:``/``Warning:`` lines, progress bars, ``--json``'s stdout),
``pack_summary`` (the pack summary's table), ``stats_tables`` (``packcli stats``' tables) and
``row_view`` (``packcli inspect``'s row, or record).
"""

from __future__ import annotations

from packcli.cli.consoles import (
    STAGE_LABELS as STAGE_LABELS,
    emit_json as emit_json,
    error as error,
    progress_bars as progress_bars,
    stderr as stderr,
    stdout as stdout,
    stdout_for_json as stdout_for_json,
    warning as warning,
)
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
