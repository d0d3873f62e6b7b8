"""The marks that find text in a rendering: a message's characters perturbed, or marked one by one.

``packcli.tokenize.templates.spans`` renders a conversation again with some messages changed by these marks and
reads where the rendering differs (an answer's body) or where the marks stand (other messages' text).
The marks are private-use code points, which no tokenizer vocabulary or template literal holds.
"""

from __future__ import annotations

import re
from typing import Any

from packcli.jsontypes import ChatMessage

# Inserted between characters to perturb a message: a private-use code point, which no tokenizer
# vocabulary or template literal contains in practice.
MARK = "\ue0c7"
# The first of the marks that tell several perturbed messages apart in one rendering (private use too).
MULTI_MARK = 0xE100
# Between the characters of messages whose characters are looked for one by one (private use as well).
OWN_MARK = "\ue0c8"

# Text fields of a message that are not what the model generates (perturbing them could change the
# template's branches for a reason that has nothing to do with the answer).
# A tool call's function name stays too: templates repeat it in the tool's answer (gpt-oss).
KEEP_KEYS = frozenset({"role", "type", "name"})


def marked_message(message: ChatMessage) -> ChatMessage:
    return {key: (v if key in KEEP_KEYS else _marked_value(v, key == "arguments")) for key, v in message.items()}


# Marks and the characters between and after them: with the character before it, a run of marked text.
_MARK_RUN = re.compile(f"{OWN_MARK}(?:[^{OWN_MARK}]?{OWN_MARK})*[^{OWN_MARK}]?")


def mark_runs(other: str) -> list[tuple[int, int]]:
    """Return the [start, end) runs, in ``other`` without its marks, of the characters next to a mark.

    A run found by the pattern starts with a mark, so the character before it (never a mark, nor in the
    run before: either would have joined the two) is next to a mark too.
    """
    runs = []
    marks_before = 0
    for found in _MARK_RUN.finditer(other):
        text = found.group()
        marks = text.count(OWN_MARK)
        start = found.start() - marks_before
        runs.append((max(start - 1, 0), start + len(text) - marks))
        marks_before += marks
    return runs


def expand(runs: list[tuple[int, int]]) -> list[int]:
    return [p for start, end in runs for p in range(start, end)]


def _marked_value(value: Any, arguments: bool = False) -> Any:
    if isinstance(value, str):
        return OWN_MARK + value if len(value) == 1 else OWN_MARK.join(value)
    if isinstance(value, list):
        return [_marked_value(v, arguments) for v in value]
    if isinstance(value, dict):
        if arguments:
            return {(_marked_value(k) if isinstance(k, str) else k): _marked_value(v, True) for k, v in value.items()}
        return {k: (v if k in KEEP_KEYS else _marked_value(v, k == "arguments")) for k, v in value.items()}
    return value


def answer_marks(n: int) -> list[str]:
    return [chr(MULTI_MARK + k) for k in range(n)]


def perturb(message: ChatMessage, empty: int, mark: str = MARK, scalars: bool = False) -> ChatMessage:
    """Return ``message`` with its text changed (a mark between characters), its structure kept.

    Role, type and name keys are kept wherever they are, but inside a tool call's ``arguments`` (which
    the model generates): there every key and string is perturbed, and with ``scalars`` numbers are
    changed (to another number of the same type) and booleans flipped, so that a call whose arguments
    hold no text is found too. ``empty``: 0 leaves empty values alone, 1 gives empty arguments a key,
    2 also gives empty strings a mark (an empty content made non-empty can change the template's branches,
    so it comes last).
    """
    return {k: (v if k in KEEP_KEYS else _perturb_value(v, empty, mark, scalars)) for k, v in message.items()}


def _perturb_value(value: Any, empty: int, mark: str, scalars: bool, arguments: bool = False) -> Any:
    if isinstance(value, str):
        return mark + mark.join(value) + mark if (value or empty >= 2) else value
    if isinstance(value, list):
        return [_perturb_value(v, empty, mark, scalars, arguments) for v in value]
    if isinstance(value, dict) and arguments:
        if not value and empty >= 1:
            return {mark: mark}
        return {
            (_perturb_value(k, empty, mark, scalars) if isinstance(k, str) else k): _perturb_value(
                v, empty, mark, scalars, True
            )
            for k, v in value.items()
        }
    if isinstance(value, dict):
        return {
            k: (v if k in KEEP_KEYS else _perturb_value(v, empty, mark, scalars, k == "arguments"))
            for k, v in value.items()
        }
    if arguments and scalars:
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return value + 1
        if isinstance(value, float):
            return value + 1.0 if value == value else 0.0  # NaN: any number differs
    return value
