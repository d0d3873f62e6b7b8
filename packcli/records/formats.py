"""Detect the record format and normalise each record to a ``Sample``.

Record formats: ``messages`` (OpenAI-style chat), ``conversations`` (ShareGPT), ``prompt_completion``
(strings or message lists), ``alpaca``, ``text`` and ``tokenized`` (``input_ids``, optional ``labels``);
and preference data (``preference``: ``chosen``/``rejected`` with an optional ``prompt``; ``kto``:
``prompt``/``completion``/``label``), which ``packcli.records.preference`` turns into several Samples per record.
Field names can be remapped (``--field messages=dialog``), so every lookup goes through ``fields``.

The names of formats, fields and roles are ``names``' (re-exported here), the reading of one field
``cells``', the reading of a message list ``messages``'.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from packcli.errors import RecordError, parts_of
from packcli.jsontypes import ChatMessage, Record, TemplateKwargs
from packcli.records.cells import (
    INT64_MAX as INT64_MAX,
    INT64_MIN as INT64_MIN,
    int_list,
    json_cell,
    require,
    string,
    tname,
)
from packcli.records.messages import read_messages
from packcli.records.names import (
    DEFAULT_FIELDS as DEFAULT_FIELDS,
    FORMATS as FORMATS,
    PREFERENCE_FORMATS as PREFERENCE_FORMATS,
    RESERVED_TEMPLATE_KWARGS as RESERVED_TEMPLATE_KWARGS,
    ROLE_ALIASES as ROLE_ALIASES,
    ROLES as ROLES,
    SHAREGPT_ROLES as SHAREGPT_ROLES,
    TRAIN_KEYS as TRAIN_KEYS,
)


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
        turns = read_messages(require(record, fields[fmt]), fields, sharegpt=sharegpt, rename=rename_roles)
        return Sample("chat", **turns.sample_fields(), **_template_extras(record, fields))
    if fmt == "prompt_completion":
        prompt = require(record, fields["prompt"])
        completion = require(record, fields["completion"])
        if isinstance(prompt, str) and isinstance(completion, str):
            return Sample("prompt_completion", prompt=prompt, completion=completion)
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        head = read_messages(
            prompt, fields, sharegpt=False, field=fields["prompt"], allow_empty=True, rename=rename_roles
        )
        tail = read_messages(completion, fields, sharegpt=False, field=fields["completion"], rename=rename_roles)
        extras = _template_extras(record, fields)
        turns = head.then(tail)
        return Sample("chat", **turns.sample_fields(), prompt_len=len(head.messages), **extras)
    if fmt == "alpaca":
        instruction = string(record, fields["instruction"])
        extra = record.get(fields["input"])
        if extra is not None and not isinstance(extra, str):
            raise RecordError("wrong_type", f"field '{fields['input']}' must be a string, not {tname(extra)}")
        output = string(record, fields["output"])
        user = instruction + ("\n\n" + extra if extra else "")
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
        system = record.get(fields["system"])
        if isinstance(system, str) and system:
            messages.insert(0, {"role": "system", "content": system})
        return Sample("chat", messages=messages, prompt_len=len(messages) - 1)
    if fmt == "text":
        return Sample("text", text=string(record, fields["text"]))
    if fmt == "tokenized":
        ids = int_list(require(record, fields["input_ids"]), fields["input_ids"])
        labels = record.get(fields["labels"])
        if labels is not None:
            labels = int_list(labels, fields["labels"])
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
    shown = f"{len(lengths)} samples" if isinstance(lengths, list) else f"{tname(lengths)}"
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
        tools = json_cell(tools, fields["tools"], "a list of function schemas")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise RecordError("wrong_type", f"field '{fields['tools']}' must be a list of objects (function schemas)")
        extras["tools"] = tools or None
    kwargs = record.get(fields["chat_template_kwargs"])
    if isinstance(kwargs, str):
        kwargs = json_cell(kwargs, fields["chat_template_kwargs"], "an object")
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
