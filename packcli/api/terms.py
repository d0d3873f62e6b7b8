"""Messages in the library's terms: option names for flags, in-memory inputs named as the caller passed them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from packcli.errors import PackcliError

_FLAG_RE = re.compile(r"(?<![\w-])--(no-)?([a-z][a-z0-9-]*)")
_NOT_OPTIONS = {"help"}
# A flag with its values ("--overflow split, truncate or drop"): the values become quoted strings.
_CHOICE_RE = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*) ([a-z_]+(?:(?:, | or )[a-z_]+)*)")
_OUTPUT_FLAG_RE = re.compile(r"(?<![\w-])-o\b")


def _choice_terms(match: re.Match[str]) -> str:
    from packcli.config import CHOICES

    name = match.group(1).replace("-", "_")
    words = re.split(r"(, | or )", match.group(2))
    allowed = CHOICES.get(name, ())
    n = 0  # how many of the words are values of the option ("--truncate-side left, or ...": one)
    while 2 * n < len(words) and words[2 * n] in allowed:
        n += 1
    if n == 0:
        return match.group(0)
    quoted = [f'"{w}"' if i % 2 == 0 else w for i, w in enumerate(words[: 2 * n - 1])]
    return f"{name}=" + "".join(quoted) + "".join(words[2 * n - 1 :])


# Flags whose keyword argument has another name.
_KEYWORDS = {"field": "fields", "template_kwarg": "template_kwargs", "no_cache": "cache=False"}


def api_terms(message: str, names: Mapping[str, str] | None = None) -> str:
    """Return a core message written with flags (a warning's, or an error without option fields) in the
    library's terms, and with in-memory inputs named as the caller passed them (``in_memory_terms``).

    Flags become keyword arguments (``--max-len`` -> ``max_len``, ``--overflow split`` ->
    ``overflow="split"``). Errors that carry their options as fields (``PackcliError.structured``)
    need none of this: ``str()`` renders them in Python's terms.
    """
    renamed = _CHOICE_RE.sub(_choice_terms, message)

    def keyword(m: re.Match[str]) -> str:
        if m.group(2) in _NOT_OPTIONS:
            return m.group(0)
        name = (m.group(1) or "") + m.group(2)
        return _KEYWORDS.get(name.replace("-", "_"), m.group(2).replace("-", "_"))

    renamed = _FLAG_RE.sub(keyword, renamed)
    renamed = _OUTPUT_FLAG_RE.sub("output", renamed)
    return in_memory_terms(renamed, names)


def in_memory_terms(message: str, names: Mapping[str, str] | None) -> str:
    """Name the files in-memory inputs were written to as what the caller passed (``names``: path ->
    words), their lines as the list's indices (from 0)."""
    for path, words in (names or {}).items():
        at_line = re.compile(re.escape(path) + r" line (\d+)")

        def at_index(m: re.Match[str], w: str = words) -> str:
            return f"{w}, index {int(m.group(1)) - 1}"

        message = at_line.sub(at_index, message).replace(path, words)
    return message


@contextmanager
def library_terms(names: Mapping[str, str] | None = None) -> Iterator[None]:
    """Re-raise packcli errors in the library's terms, with in-memory inputs named as the caller passed them."""
    try:
        yield
    except PackcliError as exc:
        if exc.structured:  # its options are fields or Opt parts: only the in-memory paths to rename
            if not names:
                raise
            parts = tuple(in_memory_terms(p, names) if isinstance(p, str) else p for p in exc.message)
            hint = tuple(in_memory_terms(p, names) if isinstance(p, str) else p for p in exc.hint)
            if (parts, hint) == (exc.message, exc.hint):
                raise
            raise type(exc)(*parts, option=exc.option, hint=hint) from exc
        text = str(exc)
        renamed = api_terms(text, names)
        if renamed == text:
            raise
        raise type(exc)(renamed) from exc
