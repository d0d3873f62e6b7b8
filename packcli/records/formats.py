"""Detect the record format and normalise each record to a ``Sample``.

Record formats: ``messages`` (OpenAI-style chat), ``conversations`` (ShareGPT), ``prompt_completion``
(strings or message lists), ``alpaca``, ``text`` and ``tokenized`` (``input_ids``, optional ``labels``);
and preference data (``preference``: ``chosen``/``rejected`` with an optional ``prompt``; ``kto``:
``prompt``/``completion``/``label``), which ``packcli.records.preference`` turns into several Samples per record.
Field names can be remapped (``--field messages=dialog``), so every lookup goes through ``fields``.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from packcli.errors import Opt, RecordError, Text, parts_of, too_many_digits
from packcli.jsontypes import ChatMessage, Record, TemplateKwargs

FORMATS = ("messages", "conversations", "prompt_completion", "alpaca", "text", "tokenized", "preference", "kto")
# Record formats whose records are not one SFT sample each (see packcli.records.preference).
PREFERENCE_FORMATS = ("preference", "kto")

DEFAULT_FIELDS: dict[str, str] = {
    "messages": "messages",
    "conversations": "conversations",
    "role": "role",
    "content": "content",
    "from": "from",
    "value": "value",
    "prompt": "prompt",
    "completion": "completion",
    "instruction": "instruction",
    "input": "input",
    "output": "output",
    "system": "system",
    "text": "text",
    "input_ids": "input_ids",
    "labels": "labels",
    "tools": "tools",
    "chat_template_kwargs": "chat_template_kwargs",
    "chosen": "chosen",
    "rejected": "rejected",
    "label": "label",
}

ROLES = ("system", "user", "assistant", "tool")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# ShareGPT speaker names seen in real exports, mapped to chat roles.
SHAREGPT_ROLES: dict[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "prompter": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "ai": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "function_response": "tool",
    "observation": "tool",
    "ipython": "tool",
}


# Template keyword arguments packcli passes itself, or that would leave samples incomplete.
RESERVED_TEMPLATE_KWARGS: dict[str, Text] = {
    "continue_final_message": "leaves the last message open (its end-of-turn marker is dropped), and a packed "
    "sample must be complete so that the model learns where an answer ends; leave it out",
    "add_generation_prompt": "is set by packcli (false: a packed sample ends with its last message); leave it out",
    "tools": "comes from each record's own tools field; leave it out",
    "conversations": "is the record's messages; leave it out",
    "chat_template": ("is the template itself; pass ", Opt("chat_template"), " FILE instead"),
    "return_assistant_tokens_mask": "is set by packcli to find what is trained; leave it out",
}


@dataclass(frozen=True)
class Sample:
    """One normalised record.

    ``kind`` is ``chat`` (``messages``; ``prompt_len`` messages of prompt when it came from a
    prompt/completion pair), ``prompt_completion`` (strings), ``text``, or ``tokenized``.
    """

    kind: str
    messages: list[ChatMessage] | None = None
    prompt_len: int | None = None
    prompt: str | None = None
    completion: str | None = None
    text: str | None = None
    input_ids: list[int] | None = None
    labels: list[int] | None = None
    tools: list[Any] | None = None  # function schemas, passed to the template as ``tools``
    template_kwargs: TemplateKwargs | None = None  # the record's own ``chat_template_kwargs``
    # A piece of a split conversation: which of its messages are trained, as the whole record's rule
    # decided (None: decided by --train-on on these messages).
    trained_turns: tuple[int, ...] | None = None
    # Per message, its own training mark ("train": true/false, or "weight": 1/0), None where unmarked;
    # None when no message is marked. The keys themselves are removed from the messages.
    message_train: tuple[bool | None, ...] | None = None
    # Roles renamed by normalize(rename_roles=True): (message index, the name read, the role given).
    renamed: tuple[tuple[int, str, str], ...] = ()


def detect_format(record: Any, fields: dict[str, str]) -> str | None:
    """Return the record format that a record's fields show, or None when none fits."""
    if not isinstance(record, dict):
        return None
    if fields["chosen"] in record and fields["rejected"] in record:
        return "preference"
    if fields["messages"] in record:
        return "messages"
    if fields["conversations"] in record:
        return "conversations"
    if fields["prompt"] in record and fields["completion"] in record:
        # KTO's unpaired preference data: a boolean label says whether the completion is desirable.
        return "kto" if isinstance(record.get(fields["label"]), bool) else "prompt_completion"
    if fields["instruction"] in record and fields["output"] in record:
        return "alpaca"
    if fields["input_ids"] in record:
        return "tokenized"
    if fields["text"] in record:
        return "text"
    return None


def accepted_fields(fields: dict[str, str]) -> str:
    """Return the field sets that :func:`detect_format` recognises, as the error naming them shows them."""
    sets = (
        ("messages",),
        ("conversations",),
        ("prompt", "completion"),
        ("instruction", "output"),
        ("chosen", "rejected"),
        ("input_ids",),
        ("text",),
    )
    names = ["+".join(fields[name] for name in group) for group in sets]
    return ", ".join(names[:-1]) + " or " + names[-1]


def normalize(record: Any, fmt: str, fields: dict[str, str], *, rename_roles: bool = False) -> Sample:
    """Return the record as a Sample of format ``fmt``; raise RecordError naming what is wrong.

    With ``rename_roles`` (``--fix-turns``), message roles that are not chat roles but name one
    unambiguously (``human``, ``gpt``, ``model``, ``User``...: ``ROLE_ALIASES``) are renamed, and listed
    in the Sample's ``renamed``.
    """
    if not isinstance(record, dict):
        raise RecordError("not_an_object", f"the record is a {type(record).__name__}, not a JSON object")
    if fmt in ("messages", "conversations"):
        sharegpt = fmt == "conversations"
        turns = _messages(_require(record, fields[fmt]), fields, sharegpt=sharegpt, rename=rename_roles)
        return Sample("chat", **turns.sample_fields(), **_template_extras(record, fields))
    if fmt == "prompt_completion":
        prompt = _require(record, fields["prompt"])
        completion = _require(record, fields["completion"])
        if isinstance(prompt, str) and isinstance(completion, str):
            return Sample("prompt_completion", prompt=prompt, completion=completion)
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        head = _messages(prompt, fields, sharegpt=False, field=fields["prompt"], allow_empty=True, rename=rename_roles)
        tail = _messages(completion, fields, sharegpt=False, field=fields["completion"], rename=rename_roles)
        extras = _template_extras(record, fields)
        turns = head.then(tail)
        return Sample("chat", **turns.sample_fields(), prompt_len=len(head.messages), **extras)
    if fmt == "alpaca":
        instruction = _string(record, fields["instruction"])
        extra = record.get(fields["input"])
        if extra is not None and not isinstance(extra, str):
            raise RecordError("wrong_type", f"field '{fields['input']}' must be a string, not {_tname(extra)}")
        output = _string(record, fields["output"])
        user = instruction + ("\n\n" + extra if extra else "")
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
        system = record.get(fields["system"])
        if isinstance(system, str) and system:
            messages.insert(0, {"role": "system", "content": system})
        return Sample("chat", messages=messages, prompt_len=len(messages) - 1)
    if fmt == "text":
        return Sample("text", text=_string(record, fields["text"]))
    if fmt == "tokenized":
        ids = _int_list(_require(record, fields["input_ids"]), fields["input_ids"])
        labels = record.get(fields["labels"])
        if labels is not None:
            labels = _int_list(labels, fields["labels"])
            if len(labels) != len(ids):
                raise RecordError(
                    "length_mismatch",
                    f"'{fields['labels']}' has {len(labels)} values but '{fields['input_ids']}' has {len(ids)}",
                )
        _refuse_packed_row(record, len(ids))
        return Sample("tokenized", input_ids=ids, labels=labels)
    raise ValueError(f"unknown format {fmt!r}")


def _refuse_packed_row(record: Record, n_tokens: int) -> None:
    """Raise RecordError when a tokenized record is a packed row: ``seq_lengths`` says it holds several samples.

    Read as one sample, its samples would attend to each other (three of 33 tokens become one of 99).
    A ``seq_lengths`` of one sample as long as ``input_ids`` says nothing more and is accepted.
    """
    lengths = record.get("seq_lengths")
    if isinstance(lengths, str):
        with contextlib.suppress(ValueError, RecursionError):
            lengths = json.loads(lengths)
    if lengths is None or lengths == [n_tokens]:
        return
    shown = f"{len(lengths)} samples" if isinstance(lengths, list) else f"{_tname(lengths)}"
    raise RecordError(
        "packed_row",
        f"the record is a packed row ('seq_lengths' holds {shown}): read as one sample, their boundaries would be "
        "lost; pass the original records (a packcli output's manifest.json names them), one sample per record",
    )


def _template_extras(record: Record, fields: dict[str, str]) -> Record:
    """Return the record's ``tools`` (function schemas) and ``chat_template_kwargs``, checked."""
    extras: dict[str, Any] = {}
    tools = record.get(fields["tools"])
    if isinstance(tools, str):
        tools = _json_cell(tools, fields["tools"], "a list of function schemas")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise RecordError("wrong_type", f"field '{fields['tools']}' must be a list of objects (function schemas)")
        extras["tools"] = tools or None
    kwargs = record.get(fields["chat_template_kwargs"])
    if isinstance(kwargs, str):
        kwargs = _json_cell(kwargs, fields["chat_template_kwargs"], "an object")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise RecordError("wrong_type", f"field '{fields['chat_template_kwargs']}' must be an object")
        reserved = sorted(set(kwargs) & set(RESERVED_TEMPLATE_KWARGS))
        if reserved:
            raise RecordError(
                "reserved_template_kwarg",
                f"field '{fields['chat_template_kwargs']}': '{reserved[0]}' ",
                *parts_of(RESERVED_TEMPLATE_KWARGS[reserved[0]]),
            )
        extras["template_kwargs"] = kwargs
    return extras


def _tname(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _require(record: Record, key: str) -> Any:
    if key not in record:
        raise RecordError("missing_field", f"the record has no field '{key}' (it has: {', '.join(map(str, record))})")
    value = record[key]
    if value is None:
        raise RecordError("wrong_type", f"field '{key}' is null")
    return value


def _string(record: Record, key: str) -> str:
    value = _require(record, key)
    if not isinstance(value, str):
        raise RecordError("wrong_type", f"field '{key}' must be a string, not {_tname(value)}")
    return value


def _int_list(value: Any, key: str) -> list[int]:
    if isinstance(value, str):
        value = _json_cell(value, key, "a list of integers")
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RecordError("wrong_type", f"field '{key}' must be a list of integers")
    if value and not INT64_MIN <= min(value) <= max(value) <= INT64_MAX:
        # JSON integers have no size limit; token ids and labels are machine integers.
        big = next(v for v in value if not INT64_MIN <= v <= INT64_MAX)
        shown = str(big) if len(str(big)) <= 30 else str(big)[:27] + "..."
        raise RecordError("integer_out_of_range", f"field '{key}' holds {shown}, beyond the 64-bit integer range")
    return value


def _json_cell(value: str, key: str, expected: str) -> Any:
    # CSV cells and some exports carry lists as JSON text.
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise RecordError(
            "wrong_type",
            f"field '{key}' must be {expected}; it is a string that is not valid JSON "
            f"({exc.msg} at character {exc.pos})",
        ) from exc
    except ValueError as exc:  # the only other one: an integer past Python's digit limit
        raise RecordError(
            "integer_out_of_range", f"field '{key}' holds {too_many_digits()}; write it as a string"
        ) from exc
    except RecursionError as exc:  # the decoder recurses per nesting level
        raise RecordError("too_deep", f"field '{key}' nests too deep to decode") from exc


@dataclass(frozen=True)
class _Turns:
    """Messages as read: the messages, their training marks, and the roles renamed."""

    messages: list[ChatMessage]
    train: tuple[bool | None, ...]
    renamed: tuple[tuple[int, str, str], ...]

    def then(self, other: _Turns) -> _Turns:
        shift = len(self.messages)
        return _Turns(
            self.messages + other.messages,
            self.train + other.train,
            self.renamed + tuple((i + shift, old, new) for i, old, new in other.renamed),
        )

    def sample_fields(self) -> dict[str, Any]:
        marked = any(flag is not None for flag in self.train)
        return {"messages": self.messages, "message_train": self.train if marked else None, "renamed": self.renamed}


# Role names of other tools and exports that name one chat role unambiguously (``--fix-turns`` renames
# them in message lists; ShareGPT speakers are always mapped, by SHAREGPT_ROLES). Matched case-insensitively.
# Left out: speakers only ShareGPT exports use, and roles templates know by their own name (Llama 3's
# "ipython" is its tool role; "function_call" and "function_response" are parts of a turn elsewhere).
_NOT_ALIASES = ("bing", "bard", "function_call", "function_response", "ipython")
ROLE_ALIASES: dict[str, str] = {name: role for name, role in SHAREGPT_ROLES.items() if name not in _NOT_ALIASES}
# Per-message training marks: "train" (true/false), and axolotl's "weight" (1/0).
TRAIN_KEYS = ("train", "weight")


def _train_mark(message: ChatMessage, i: int, field: str) -> bool | None:
    """Return a message's own training mark (None when it has none); raise RecordError for a bad one."""
    marks = []
    if "train" in message and message["train"] is not None:
        if not isinstance(message["train"], bool):
            raise RecordError(
                "wrong_type", f"message {i} of '{field}': 'train' must be true or false, not {_tname(message['train'])}"
            )
        marks.append(message["train"])
    if "weight" in message and message["weight"] is not None:
        weight = message["weight"]
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight not in (0, 1):
            shown = json.dumps(weight) if isinstance(weight, (int, float, str, bool)) else _tname(weight)
            raise RecordError("wrong_type", f"message {i} of '{field}': 'weight' must be 0 or 1, not {shown}")
        marks.append(weight == 1)
    if len(set(marks)) > 1:
        raise RecordError("wrong_type", f"message {i} of '{field}': 'train' and 'weight' disagree; keep one")
    return marks[0] if marks else None


def _function_call_turn(
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


def _messages(
    value: Any,
    fields: dict[str, str],
    *,
    sharegpt: bool,
    field: str | None = None,
    allow_empty: bool = False,
    rename: bool = False,
) -> _Turns:
    field = field or (fields["conversations"] if sharegpt else fields["messages"])
    if isinstance(value, str):
        value = _json_cell(value, field, "a list of messages")
    if not isinstance(value, list):
        raise RecordError("wrong_type", f"field '{field}' must be a list of messages, not {_tname(value)}")
    if not value and not allow_empty:
        raise RecordError("empty_conversation", f"field '{field}' is an empty list")
    role_key = fields["from"] if sharegpt else fields["role"]
    content_key = fields["value"] if sharegpt else fields["content"]
    out: list[ChatMessage] = []
    marks: list[bool | None] = []
    renamed: list[tuple[int, str, str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise RecordError("wrong_type", f"message {i} of '{field}' is a {_tname(message)}, not an object")
        if role_key not in message:
            raise RecordError("missing_field", f"message {i} of '{field}' has no '{role_key}'")
        role = message[role_key]
        if not isinstance(role, str):
            raise RecordError("wrong_type", f"message {i} of '{field}': '{role_key}' must be a string")
        if sharegpt and role.lower() == "function_call":
            message = _function_call_turn(message, i, field, content_key, fields)
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
                "wrong_type", f"message {i} of '{field}': '{content_key}' must be a string, not {_tname(content)}"
            )
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise RecordError("wrong_type", f"message {i} of '{field}': content parts must be objects")
        marks.append(_train_mark(message, i, field))
        if sharegpt or role_key != "role" or content_key != "content" or role != message[role_key]:
            # Keep every other key (tool_calls, reasoning, names): templates may read them.
            # A stray "role" or "content" key never replaces the mapped ones (a human turn with
            # "role": "assistant" would otherwise be trained on).
            rest = {k: v for k, v in message.items() if k not in (role_key, content_key, "role", "content")}
            message = {"role": role, "content": content, **rest}
        if any(k in message for k in TRAIN_KEYS):
            # The marks are packcli's, not the template's: the template renders the message without them.
            message = {k: v for k, v in message.items() if k not in TRAIN_KEYS}
        out.append(message)
    return _Turns(out, tuple(marks), tuple(renamed))
