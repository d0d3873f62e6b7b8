"""Conversation cleaning (``--fix-turns``): the repairs real chat exports need before a strict template renders them.

Exports often start with the assistant's greeting, end with a question nobody answered, hold two user turns
in a row (a message sent in two parts) or answers that are empty. Strict templates (Llama-3, Gemma,
Mistral...) refuse such conversations. ``clean`` repairs a normalised chat Sample, in this order:

1. ``empty_answer_dropped``: an assistant message whose content is empty or only whitespace (zero-width
   characters included, see ``is_blank``) and that carries nothing else (no tool calls) is dropped;
2. ``leading_assistant_dropped``: assistant messages before the first user message (after the system
   messages that open the conversation) are dropped;
3. ``orphan_tool_result_dropped``: a tool result that no call comes before (the nearest earlier message
   that is not a tool result is not an assistant message) is dropped;
4. ``trailing_user_dropped``: user messages after the last assistant message are dropped;
5. ``merged``: consecutive messages of one role (user, assistant or system) with string content and no
   other keys are joined into one, their contents separated by a blank line (``MERGE_SEPARATOR``).

Roles are renamed (``role_renamed``) where records are normalised (``formats.normalize(rename_roles=True)``).
A prompt/completion record keeps its boundary: messages are never merged across it. Every change is
returned by kind and message (its index in the record as read), for the summary and the detail file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NotRequired, TypedDict

from packcli.errors import Opt, RecordError
from packcli.jsontypes import ChatMessage
from packcli.records.formats import Sample

KINDS = (
    "role_renamed",
    "leading_assistant_dropped",
    "trailing_user_dropped",
    "merged",
    "empty_answer_dropped",
    "orphan_tool_result_dropped",
)
MERGE_SEPARATOR = "\n\n"
# Characters that show nothing but that str.isspace() does not count: zero-width space, non-joiner and
# joiner, word joiner, and the byte-order mark (a zero-width no-break space).
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
# Keys a message may carry that hold no content of its own.
_PLAIN_KEYS = frozenset({"role", "content", "name"})


def is_blank(text: str) -> bool:
    """Return True when ``text`` is empty or only whitespace, zero-width characters included.

    Stops at the first visible character, so a real answer costs a character or two.
    """
    return all(c.isspace() or c in ZERO_WIDTH for c in text)


def content_is_blank(content: Any) -> bool:
    """Return True for empty or whitespace-only content: a string, or text parts that are all blank."""
    if content is None:
        return True
    if isinstance(content, str):
        return is_blank(content)
    if isinstance(content, list):
        return all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) and is_blank(p["text"])
            for p in content
        )
    return False


def is_empty_answer(message: ChatMessage) -> bool:
    """Return True for an assistant message whose content is blank and that carries nothing else (no tool calls)."""
    if message.get("role") != "assistant" or not content_is_blank(message.get("content")):
        return False
    return not any(v not in (None, "", [], {}) for k, v in message.items() if k not in _PLAIN_KEYS)


def opens_with_answer(sample: Sample, turns: list[int]) -> bool:
    """Return True when the conversation's first message after its system messages is an assistant message
    that ``turns`` trains: an answer to nothing (exports often start with the assistant's greeting)."""
    for i, message in enumerate(sample.messages or []):
        if message.get("role") != "system":
            return message.get("role") == "assistant" and i in turns
    return False


def blank_answers(sample: Sample, turns: list[int]) -> int:
    """Return how many of the messages at ``turns`` are empty answers."""
    messages = sample.messages or []
    return sum(is_empty_answer(messages[i]) for i in turns)


def orphan_tool_results(messages: Sequence[ChatMessage]) -> list[int]:
    """Return the indices of tool results that no call comes before: the nearest earlier message that is
    not a tool result is not an assistant message (or there is none)."""
    orphans, last = [], None
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool" and last != "assistant":
            orphans.append(i)
        elif role != "tool":
            last = role
    return orphans


# One change --fix-turns made to a conversation: its kind (KINDS), the message (its index as read), and
# for a renamed role the names ``from`` and ``to``, for a merged message the one it went ``into``.
TurnChange = TypedDict(
    "TurnChange",
    {"kind": str, "message": int, "from": NotRequired[str], "to": NotRequired[str], "into": NotRequired[int]},
)


def clean(sample: Sample) -> tuple[Sample, list[TurnChange]]:
    """Return the repaired sample and its changes (``{"kind", "message", ...}``, in the order made).

    A conversation that had an answer and has none left is a RecordError (``no_answer_after_fix``).
    """
    if sample.kind != "chat" or not sample.messages:
        return sample, []
    changes: list[TurnChange] = [
        {"kind": "role_renamed", "message": i, "from": old, "to": new} for i, old, new in sample.renamed
    ]
    n = len(sample.messages)
    flags = sample.message_train or (None,) * n
    boundary = sample.prompt_len
    # (original index, message, train flag, in the prompt of a prompt/completion record)
    items = [(i, m, flags[i], boundary is not None and i < boundary) for i, m in enumerate(sample.messages)]
    had_answer = any(m.get("role") == "assistant" for m in sample.messages)

    kept = []
    for item in items:
        if is_empty_answer(item[1]):
            changes.append({"kind": "empty_answer_dropped", "message": item[0]})
        else:
            kept.append(item)
    items = kept

    start = 0
    while start < len(items) and items[start][1].get("role") == "system":
        start += 1
    while start < len(items) and items[start][1].get("role") == "assistant":
        changes.append({"kind": "leading_assistant_dropped", "message": items[start][0]})
        del items[start]

    orphans = set(orphan_tool_results([m for _, m, _, _ in items]))
    for k in sorted(orphans):
        changes.append({"kind": "orphan_tool_result_dropped", "message": items[k][0]})
    items = [item for k, item in enumerate(items) if k not in orphans]

    while items and items[-1][1].get("role") == "user" and any(m.get("role") == "assistant" for _, m, _, _ in items):
        changes.append({"kind": "trailing_user_dropped", "message": items[-1][0]})
        items.pop()

    merged: list[_Item] = []
    for item in items:
        if merged and _mergeable(merged[-1], item):
            index, first, flag, in_prompt = merged[-1]
            joined = {**first, "content": first["content"] + MERGE_SEPARATOR + item[1]["content"]}
            merged[-1] = (index, joined, flag, in_prompt)
            changes.append({"kind": "merged", "message": item[0], "into": index})
        else:
            merged.append(item)
    items = merged

    if not changes:
        return sample, []
    if had_answer and not any(m.get("role") == "assistant" for _, m, _, _ in items):
        raise RecordError(
            "no_answer_after_fix",
            "no assistant answer is left after ",
            Opt("fix_turns"),
            f" ({describe(changes)})",
        )
    messages = [m for _, m, _, _ in items]
    new_flags = tuple(f for _, _, f, _ in items)
    return (
        replace(
            sample,
            messages=messages,
            message_train=new_flags if any(f is not None for f in new_flags) else None,
            prompt_len=sum(p for _, _, _, p in items) if boundary is not None else None,
            renamed=(),
        ),
        changes,
    )


_Item = tuple[int, ChatMessage, bool | None, bool]


def _mergeable(a: _Item, b: _Item) -> bool:
    """Return whether two neighbours are joined: one role (not tool), string contents, no other keys, one
    training mark, and the same side of a prompt/completion boundary."""
    (_, x, fx, px), (_, y, fy, py) = a, b
    role = x.get("role")
    return (
        role in ("user", "assistant", "system")
        and y.get("role") == role
        and fx == fy
        and px == py
        and isinstance(x.get("content"), str)
        and isinstance(y.get("content"), str)
        and set(x) <= _PLAIN_KEYS
        and set(y) <= _PLAIN_KEYS
        and x.get("name") == y.get("name")
    )


def counts(changes: list[TurnChange]) -> Counter[str]:
    """Return the changes counted by kind."""
    return Counter(c["kind"] for c in changes)


_WORDS = {
    "role_renamed": ("renames {n} role", "renames {n} roles"),
    "leading_assistant_dropped": ("drops the leading assistant turn", "drops {n} leading assistant turns"),
    "trailing_user_dropped": ("drops the trailing user turn", "drops {n} trailing user turns"),
    "merged": ("merges 2 consecutive turns of one role", "merges {n} turns into the turn of their role before them"),
    "empty_answer_dropped": ("drops the empty answer", "drops {n} empty answers"),
    "orphan_tool_result_dropped": ("drops a tool result without a call", "drops {n} tool results without a call"),
}


def describe(changes: list[TurnChange]) -> str:
    """Return the changes in words: "drops the leading assistant turn, merges 2 consecutive turns of one role"."""
    found = counts(changes)
    return ", ".join(_WORDS[kind][found[kind] > 1].format(n=found[kind]) for kind in KINDS if found[kind])
