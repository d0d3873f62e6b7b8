"""The one error hierarchy. Core modules raise these; ``cli.main`` turns them into one line and an exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Opt:
    """An option named in a message: rendered as its flag on the command line, by its name in Python.

    ``Opt("max_len")`` reads ``--max-len`` or ``max_len``; with values, ``Opt("overflow", "split",
    "drop")`` reads ``--overflow split or drop`` or ``overflow="split" or "drop"``, and a boolean
    ``Opt("cache", False)`` reads ``--no-cache`` or ``cache=False``.
    """

    name: str
    values: tuple[Any, ...] = ()

    def __init__(self, name: str, *values: Any) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "values", values)


# A message as parts: text, and the options it names (rendered by the reader's terms).
Part = str | Opt
Terms = Callable[[Opt], str]


def python_term(opt: Opt) -> str:
    """Return how Python names an option: ``max_len``, ``overflow="split" or "drop"``, ``cache=False``."""
    if not opt.values:
        return opt.name
    shown = [json.dumps(v) if isinstance(v, str) else repr(v) for v in opt.values]
    return f"{opt.name}={joined(shown)}"


def joined(words: list[str]) -> str:
    """Return ``a``, ``a or b``, ``a, b or c``."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def render(parts: Iterable[Part], terms: Terms = python_term) -> str:
    """Join message parts into text, each option named by ``terms``."""
    return "".join(terms(p) if isinstance(p, Opt) else str(p) for p in parts)


class PackcliError(Exception):
    """A known failure: the message is one line that names what went wrong and how to fix it.

    ``option`` is the option at fault (its Python name), ``hint`` what to do about it; both are fields,
    so that each client names options its own way: ``str(error)`` speaks Python (``max_len must be
    ...``), the command line renders it with flags (``--max-len must be ...``; ``cli/_app.py``). The
    message and the hint are text and :class:`Opt` parts.
    """

    exit_code = 1

    def __init__(self, *message: Part, option: str | None = None, hint: str | Sequence[Part] | None = None) -> None:
        self.message: tuple[Part, ...] = message
        self.option = option
        self.hint: tuple[Part, ...] = (hint,) if isinstance(hint, str) else tuple(hint or ())
        super().__init__(self.render())

    def render(self, terms: Terms = python_term) -> str:
        """Return the one-line message with options named by ``terms`` (Python's names by default)."""
        head: list[Part] = [Opt(self.option), " "] if self.option else []
        tail: list[Part] = ["; ", *self.hint] if self.hint else []
        return render([*head, *self.message, *tail], terms)

    @property
    def structured(self) -> bool:
        """Whether every option the message names is a field or an :class:`Opt` (none written as a flag)."""
        return bool(self.option or self.hint or any(isinstance(p, Opt) for p in self.message))

    def __reduce__(self) -> tuple[Any, ...]:  # keyword fields survive a trip to and from a worker process
        return (_rebuild, (type(self), self.message, self.option, self.hint))


def _rebuild(
    cls: type[PackcliError], message: tuple[Part, ...], option: str | None, hint: tuple[Part, ...]
) -> PackcliError:
    return cls(*message, option=option, hint=hint)


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


def record_fix(reason: str) -> str:
    """Return the fix an error about one bad record names (--on-error fail): a file cut short is copied
    again, another record fixed; or the bad records skipped."""
    fixes = {
        "truncated_file": "copy the file again",
        "template_error": "fix the record or use a chat template that renders it (--chat-template)",
    }
    fix = fixes.get(reason, "fix the record")
    return f"{fix}, or pass --on-error skip to skip bad records"
