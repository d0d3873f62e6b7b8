"""How messages name the options: an option's flag, its command-line term, and the hints that name options.

The core names options as ``Opt`` parts; ``flag_term`` is how the command line (and the files it reads)
spells one, from its declaration (``DECLARATIONS``). A ``Hint`` is a setting an error or a warning
suggests; ``suggest`` joins those that would change something.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from packcli.config.pack_config import DECLARATIONS
from packcli.errors import Opt, Part, Text, joined, parts_of

# A hint of an error or a warning: (option, value) it would set, or None for a step that is no option,
# and its words. ``suggest`` leaves out those that set what the run already has.
Hint = tuple[tuple[str, Any] | None, Text]


def suggest(config: Any, hints: Iterable[Hint]) -> tuple[Part, ...]:
    """Join the hints (``A, or B``) that would change something: a suggestion never names what was passed.

    ``config`` is any object with the settings the hints name (a PackConfig, the planner's options).
    """
    kept = [parts_of(words) for setting, words in hints if setting is None or getattr(config, setting[0]) != setting[1]]
    return tuple(part for n, words in enumerate(kept) for part in (*((", or ",) if n else ()), *words))


def flag(name: str) -> str:
    """Return the flag of an option name: ``max_len`` -> ``--max-len``, or the one its declaration names."""
    declared = DECLARATIONS.get(name)
    return declared.flag if declared and declared.flag else "--" + name.replace("_", "-")


def flag_term(opt: Opt) -> str:
    """Return how the command line names an option: ``--max-len``, ``--overflow split or drop``, ``--no-cache``.

    The terms of the command line, and of the files it reads (the manifest's warnings).
    """
    dashed = opt.name.replace("_", "-")
    if len(opt.values) == 1 and isinstance(opt.values[0], bool):
        return f"--{dashed}" if opt.values[0] else f"--no-{dashed}"
    short = DECLARATIONS[opt.name].short if opt.short else None
    name = short or flag(opt.name)
    return f"{name} {joined([str(v) for v in opt.values])}" if opt.values else name
