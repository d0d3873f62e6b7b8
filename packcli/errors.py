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
    short: bool = False  # the command line names it by its short flag (``-o``)

    def __init__(self, name: str, *values: Any, short: bool = False) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "short", short)


# The output directory, as the command line names it in messages (``-o``).
OUTPUT = Opt("output", short=True)

# A message as parts: text, and the options it names (rendered by the reader's terms).
Part = str | Opt
Terms = Callable[[Opt], str]
# Words that may name options: plain text, or text and Opt parts (a hint, a fix).
Text = str | tuple[Part, ...]


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


def parts_of(message: str | Sequence[Part] | None) -> tuple[Part, ...]:
    """Return a message (text, or text and :class:`Opt` parts) as parts."""
    return (message,) if isinstance(message, str) else tuple(message or ())


@dataclass(frozen=True)
class Message:
    """A message that is no error (a warning): text and :class:`Opt` parts, rendered by the client that shows it.

    ``str()`` speaks Python (``max_len``); the command line renders it with flags (``--max-len``), and so
    do the files it reads (the manifest records warnings as the command line shows them).
    """

    parts: tuple[Part, ...]

    def __init__(self, *parts: Part) -> None:
        object.__setattr__(self, "parts", parts)

    def render(self, terms: Terms = python_term) -> str:
        """Return the message with options named by ``terms`` (Python's names by default)."""
        return render(self.parts, terms)

    def __str__(self) -> str:
        return self.render()

    def __contains__(self, text: str) -> bool:
        """Whether the message, as Python names its options, contains ``text``."""
        return text in str(self)

    def prefixed(self, *parts: Part) -> Message:
        """Return the message with ``parts`` before it."""
        return Message(*parts, *self.parts)

    def replace(self, old: str, new: str) -> Message:
        """Return the message with ``old`` replaced by ``new`` in its text (not in the options it names)."""
        return Message(*(p.replace(old, new) if isinstance(p, str) else p for p in self.parts))


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
        self.hint: tuple[Part, ...] = parts_of(hint)
        super().__init__(self.render())

    @property
    def parts(self) -> tuple[Part, ...]:
        """The whole message as parts: the option at fault, the message, the hint."""
        head: tuple[Part, ...] = (Opt(self.option), " ") if self.option else ()
        tail: tuple[Part, ...] = ("; ", *self.hint) if self.hint else ()
        return (*head, *self.message, *tail)

    def render(self, terms: Terms = python_term) -> str:
        """Return the one-line message with options named by ``terms`` (Python's names by default)."""
        return render(self.parts, terms)

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


INTERRUPTED = "interrupted; the previous output, if any, was left as it was"


class ShardTooLarge(OSError):
    """A shard past its format's size limit; the words (text and :class:`Opt` parts) name the option that
    makes shards smaller. Raised where a shard is written, reported as the output not being written."""

    def __init__(self, *parts: Part) -> None:
        super().__init__(render(parts))
        self.parts: tuple[Part, ...] = parts

    def __reduce__(self) -> tuple[Any, ...]:  # the parts survive a trip from a worker process
        return (type(self), self.parts)


class RecordError(Exception):
    """One record cannot be used. ``reason`` is a short snake_case key counted in the summary.

    The detail is text and :class:`Opt` parts (``parts``), so that an error naming the record names
    the options in its reader's terms; ``detail`` is its text with Python's names (the rejects file
    holds it with the command line's flags: ``tokenize.batches.worker.reject``).
    """

    def __init__(self, reason: str, *detail: Part) -> None:
        super().__init__(render(detail))
        self.reason = reason
        self.parts: tuple[Part, ...] = detail
        self.detail = render(detail)


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


def record_fix(reason: str) -> tuple[Part, ...]:
    """Return the fix an error about one bad record names (--on-error fail): a file cut short is copied
    again, another record fixed; or the bad records skipped."""
    fixes: dict[str, tuple[Part, ...]] = {
        "truncated_file": ("copy the file again",),
        "template_error": ("fix the record or use a chat template that renders it (", Opt("chat_template"), ")"),
    }
    fix = fixes.get(reason, ("fix the record",))
    return (*fix, ", or pass ", Opt("on_error", "skip"), " to skip bad records")
