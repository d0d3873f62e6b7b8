"""A record's list of messages read into chat messages (``read_messages``): OpenAI-style roles or ShareGPT
speakers mapped to roles, function-call turns made tool calls, each message's own training mark read and
taken off, and (``--fix-turns``) role aliases renamed.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from packcli.errors import Opt, RecordError
from packcli.jsontypes import ChatMessage
from packcli.records.cells import json_cell, tname
from packcli.records.names import ROLE_ALIASES, ROLES, SHAREGPT_ROLES, TRAIN_KEYS

_TRAIN_KEYS = frozenset(TRAIN_KEYS)


@dataclass(frozen=True)
class Turns:
    """Messages as read: the messages, their training marks, and the roles renamed."""

    messages: list[ChatMessage]
    train: tuple[bool | None, ...]
    renamed: tuple[tuple[int, str, str], ...]

    def then(self, other: Turns) -> Turns:
        shift = len(self.messages)
        return Turns(
            self.messages + other.messages,
            self.train + other.train,
            self.renamed + tuple((i + shift, old, new) for i, old, new in other.renamed),
        )

    def sample_fields(self) -> dict[str, Any]:
        marked = any(flag is not None for flag in self.train)
        return {"messages": self.messages, "message_train": self.train if marked else None, "renamed": self.renamed}


def train_mark(message: ChatMessage, i: int, field: str) -> bool | None:
    """Return a message's own training mark (None when it has none); raise RecordError for a bad one."""
    marks = []
    if "train" in message and message["train"] is not None:
        if not isinstance(message["train"], bool):
            raise RecordError(
                "wrong_type", f"message {i} of '{field}': 'train' must be true or false, not {tname(message['train'])}"
            )
        marks.append(message["train"])
    if "weight" in message and message["weight"] is not None:
        weight = message["weight"]
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight not in (0, 1):
            shown = json.dumps(weight) if isinstance(weight, (int, float, str, bool)) else tname(weight)
            raise RecordError("wrong_type", f"message {i} of '{field}': 'weight' must be 0 or 1, not {shown}")
        marks.append(weight == 1)
    if len(set(marks)) > 1:
        raise RecordError("wrong_type", f"message {i} of '{field}': 'train' and 'weight' disagree; keep one")
    return marks[0] if marks else None


def function_call_turn(
    message: ChatMessage, i: int, field: str, content_key: str, fields: dict[str, str]
) -> ChatMessage:
    """Return a ShareGPT ``function_call`` turn (LLaMA-Factory's format) as an assistant message with tool calls.

    Its value is a JSON object ``{"name", "arguments"}``, or a list of them (parallel calls); the
    ``observation`` turns that follow are the tool results.
    """
    value = message.get(content_key)
    calls: Any = None
    if isinstance(value, str):
        with contextlib.suppress(ValueError, RecursionError):
            calls = json.loads(value)
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) and "name" in c for c in calls):
        raise RecordError(
            "wrong_type",
            f"message {i} of '{field}': a function_call turn must hold a JSON object with 'name' and 'arguments' "
            "(or a list of them)",
        )
    tool_calls = [
        {"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}} for c in calls
    ]
    rest = {k: v for k, v in message.items() if k not in (fields["from"], content_key)}
    return {fields["from"]: "assistant", content_key: None, **rest, "tool_calls": tool_calls}


def read_messages(
    value: Any,
    fields: dict[str, str],
    *,
    sharegpt: bool,
    field: str | None = None,
    allow_empty: bool = False,
    rename: bool = False,
) -> Turns:
    field = field or (fields["conversations"] if sharegpt else fields["messages"])
    if isinstance(value, str):
        value = json_cell(value, field, "a list of messages")
    if not isinstance(value, list):
        raise RecordError("wrong_type", f"field '{field}' must be a list of messages, not {tname(value)}")
    if not value and not allow_empty:
        raise RecordError("empty_conversation", f"field '{field}' is an empty list")
    role_key = fields["from"] if sharegpt else fields["role"]
    content_key = fields["value"] if sharegpt else fields["content"]
    out: list[ChatMessage] = []
    marks: list[bool | None] = []
    renamed: list[tuple[int, str, str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise RecordError("wrong_type", f"message {i} of '{field}' is a {tname(message)}, not an object")
        if role_key not in message:
            raise RecordError("missing_field", f"message {i} of '{field}' has no '{role_key}'")
        role = message[role_key]
        if not isinstance(role, str):
            raise RecordError("wrong_type", f"message {i} of '{field}': '{role_key}' must be a string")
        if sharegpt and role.lower() == "function_call":
            message = function_call_turn(message, i, field, content_key, fields)
            role = "assistant"
        if sharegpt:
            mapped = SHAREGPT_ROLES.get(role.lower())
            if mapped is None:
                raise RecordError(
                    "unknown_role",
                    f"message {i} of '{field}': unknown speaker '{role}' (known: {', '.join(SHAREGPT_ROLES)})",
                )
            role = mapped
        elif role not in ROLES:
            alias = ROLE_ALIASES.get(role.lower())
            if alias is not None and rename:
                renamed.append((i, role, alias))
                role = alias
            else:
                fix = ("; ", Opt("fix_turns"), f" renames it to '{alias}'") if alias is not None else ()
                raise RecordError(
                    "unknown_role",
                    f"message {i} of '{field}': unknown role '{role}' (known: {', '.join(ROLES)})",
                    *fix,
                )
        content = message.get(content_key)
        if content is None and not message.get("tool_calls"):
            raise RecordError("wrong_type", f"message {i} of '{field}': '{content_key}' is missing or null")
        if content is not None and not isinstance(content, (str, list)):
            raise RecordError(
                "wrong_type", f"message {i} of '{field}': '{content_key}' must be a string, not {tname(content)}"
            )
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise RecordError("wrong_type", f"message {i} of '{field}': content parts must be objects")
        marked = not _TRAIN_KEYS.isdisjoint(message)
        marks.append(train_mark(message, i, field) if marked else None)
        if sharegpt or role_key != "role" or content_key != "content" or role != message[role_key]:
            if len(message) == 2 and content_key in message and role_key != content_key:  # speaker and text alone
                message = {"role": role, "content": content}
            else:
                # Keep every other key (tool_calls, reasoning, names): templates may read them.
                # A stray "role" or "content" key never replaces the mapped ones (a human turn with
                # "role": "assistant" would otherwise be trained on).
                rest = {k: v for k, v in message.items() if k not in (role_key, content_key, "role", "content")}
                message = {"role": role, "content": content, **rest}
        if marked and not _TRAIN_KEYS.isdisjoint(message):
            # The marks are packcli's, not the template's: the template renders the message without them.
            message = {k: v for k, v in message.items() if k not in TRAIN_KEYS}
        out.append(message)
    return Turns(out, tuple(marks), tuple(renamed))
