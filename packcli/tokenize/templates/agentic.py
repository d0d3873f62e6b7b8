"""Agent traces: tool calls passed as the template expects them, checked rendered, and reasoning accounted.

Three rules, each paid for only by the conversations that have tool calls or reasoning:

- **Arguments as the template expects them.** ``tool_calls[].function.arguments`` comes as a JSON string
  or as an object. Which one a template takes is learned once, by rendering a probe call both ways: a
  template takes a mapping when it renders its keys and values, and a string when it writes the string as
  given (not quoted again by ``tojson``). A call's arguments are passed as they are when the template takes
  that form; otherwise they are converted to the form it takes (an object written with ``json.dumps``, as
  ``tojson`` writes it; a string parsed as JSON, an error when it is not valid JSON).
- **A call is rendered or the record is refused.** The conversation is rendered again without a message's
  ``tool_calls``: the call's function name and its argument names must be in what differs, inside the
  answer's trained text when the answer is trained (``tool_calls_not_rendered`` otherwise). A name that
  merely appears elsewhere (the user's text, the tools' schemas in the system prompt) does not count.
- **Reasoning accounted.** An assistant turn's reasoning (``reasoning_content``, ``reasoning``,
  ``thinking``, or a ``<think>`` block at the start of its content) is left out when the rendering does
  not hold it; where the text could come from elsewhere in the conversation, the turn is rendered with
  its reasoning replaced by a probe text to decide. The turns counted are the trained ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from packcli.errors import Opt, RecordError
from packcli.jsontypes import ChatMessage
from packcli.records.turns import orphan_tool_results
from packcli.tokenize.templates.template_shape import common_prefix

REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_KEY, _VALUE, _NAME = "qzxargkeyzq", "qzxargvaluezq", "qzxprobefnzq"

Renderer = Callable[[list[ChatMessage]], str]


# -- arguments -----------------------------------------------------------------------------------------


def probe_conversation(arguments: Any, content: str | None) -> tuple[list[ChatMessage], list[Any]]:
    """Return a one-call conversation and its tools, with the call's arguments as given."""
    call = {"id": "call0", "type": "function", "function": {"name": _NAME, "arguments": arguments}}
    assistant: ChatMessage = {"role": "assistant", "tool_calls": [call]}
    if content is not None:
        assistant["content"] = content
    messages = [
        {"role": "user", "content": "qzxaskzq"},
        assistant,
        {"role": "tool", "content": "qzxresultzq", "tool_call_id": "call0", "name": _NAME},
        {"role": "assistant", "content": "qzxdonezq"},
    ]
    schema = {"type": "function", "function": {"name": _NAME, "description": "probe", "parameters": {"type": "object"}}}
    return messages, [schema]


def arguments_forms(render: Callable[[list[ChatMessage], list[Any]], str]) -> tuple[bool, bool]:
    """Return whether the template renders arguments given as a mapping, and given as a JSON string."""
    as_text = json.dumps({_KEY: _VALUE})
    for content in (None, ""):
        forms = []
        for arguments in ({_KEY: _VALUE}, as_text):
            try:
                text = render(*probe_conversation(arguments, content))
            except RecordError:
                forms.append(False)
                continue
            if isinstance(arguments, str):
                forms.append(as_text in text)
            else:
                forms.append(_KEY in text and _VALUE in text and f'\\"{_KEY}' not in text)
        if any(forms):
            return forms[0], forms[1]
    return False, False


def renders_tools(render: Callable[[list[ChatMessage], list[Any]], str]) -> bool | None:
    """Return whether the template renders a ``tools`` list (a probe function's name in the text), None when
    the probe does not render at all."""
    messages, tools = probe_conversation({_KEY: _VALUE}, None)
    try:
        return _NAME in render(messages[:1], tools)
    except RecordError:
        return None


def conform_arguments(message: ChatMessage, i: int, forms: tuple[bool, bool]) -> ChatMessage:
    """Return the message with each call's arguments in the form the template takes (see the module doc)."""
    takes_mapping, takes_string = forms
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or takes_mapping == takes_string:
        return message
    new_calls = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        holder = function if isinstance(function, dict) else call
        arguments = holder.get("arguments") if isinstance(holder, dict) else None
        if isinstance(arguments, dict) and not takes_mapping:
            converted: Any = json.dumps(arguments, ensure_ascii=False)
        elif isinstance(arguments, str) and not takes_string:
            converted = _parsed(arguments, i, j, holder.get("name"))
        else:
            new_calls.append(call)
            continue
        if isinstance(function, dict):
            new_calls.append({**call, "function": {**function, "arguments": converted}})
        else:
            new_calls.append({**call, "arguments": converted})
    return {**message, "tool_calls": new_calls}


def _parsed(arguments: str, i: int, j: int, name: Any) -> Any:
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError) as exc:
        raise RecordError(
            "wrong_type",
            f"message {i}: the arguments of tool call {j} ('{name}') are not valid JSON ({exc}); the chat "
            "template takes them as an object: write them as a JSON object",
        ) from exc


def check_tool_results(messages: Sequence[ChatMessage]) -> None:
    """Refuse a tool result that no assistant message (a call) comes before, or whose ``tool_call_id``
    names none of the calls of the assistant message it answers (when both sides carry ids)."""
    orphans = orphan_tool_results(messages)
    if orphans:
        raise RecordError(
            "tool_result_without_call",
            f"message {orphans[0]} is a tool result, but no assistant message (its call) comes before it; "
            "fix the record, or pass ",
            Opt("fix_turns"),
            " to drop such results",
        )
    ids: list[str] = []  # the call ids of the assistant message the results answer
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            calls = message.get("tool_calls")
            ids = (
                [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str) and c["id"]]
                if (isinstance(calls, list))
                else []
            )
        elif role == "tool":
            answered = message.get("tool_call_id")
            if ids and isinstance(answered, str) and answered and answered not in ids:
                raise RecordError(
                    "tool_result_unmatched",
                    f"message {i} is the result of call '{answered}', but the calls it answers are "
                    f"{', '.join(repr(x) for x in ids)}",
                )


def check_calls(message: ChatMessage, i: int) -> None:
    """Refuse a call with no function name, or whose arguments are neither an object nor JSON text of one.

    Trained as it is, such a call would teach the model to call nothing, or to write arguments no parser
    reads.
    """
    for j, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        holder = function if isinstance(function, dict) else call
        name = holder.get("name") if isinstance(holder, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise RecordError(
                "tool_call_invalid", f"message {i}: tool call {j} has no function name; give it function.name"
            )
        arguments = holder.get("arguments")
        if arguments is None or isinstance(arguments, dict):
            continue
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as exc:
                raise RecordError(
                    "tool_call_invalid",
                    f"message {i}: the arguments of tool call {j} ('{name}') are not valid JSON ({exc}); write "
                    "them as a JSON object",
                ) from None
            if isinstance(parsed, dict):
                continue
        raise RecordError(
            "tool_call_invalid",
            f"message {i}: the arguments of tool call {j} ('{name}') are not a JSON object; write them as one",
        )


# -- calls rendered ------------------------------------------------------------------------------------


def call_words(call: Any) -> tuple[str | None, list[str]]:
    """Return a call's function name and its argument names (those of an object, or of a JSON object string)."""
    if not isinstance(call, dict):
        return None, []
    function = call.get("function")
    holder = function if isinstance(function, dict) else call
    name = holder.get("name")
    arguments = holder.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = None
    keys = [k for k in arguments if isinstance(k, str) and k] if isinstance(arguments, dict) else []
    return (name if isinstance(name, str) and name else None), keys


def changed(full: str, other: str) -> tuple[int, int]:
    """Return the span of ``full`` that differs from ``other`` (empty when they are equal)."""
    if full == other:
        return 0, 0
    head = common_prefix(full, other)
    limit = min(len(full), len(other)) - head
    tail = common_prefix(full[::-1][:limit], other[::-1][:limit])
    return head, len(full) - tail


def check_calls_rendered(
    messages: list[ChatMessage],
    text: str,
    render: Renderer,
    trained: dict[int, list[tuple[int, int]]],
) -> None:
    """Refuse a conversation when a message's tool calls are not in its rendering (see the module doc).

    ``trained``: per trained message, the character spans it trains in ``text`` (all of them, when the
    message's own cannot be told apart).
    """
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if not calls or not isinstance(calls, list):
            continue
        without = {k: v for k, v in message.items() if k != "tool_calls"}
        without.setdefault("content", "")
        try:
            other = render([*messages[:i], without, *messages[i + 1 :]])
            start, end = changed(text, other)
        except RecordError:
            start, end = 0, len(text)  # the template cannot render the message without its calls
        if i in trained:
            pieces = [text[max(a, start) : min(b, end)] for a, b in trained[i] if min(b, end) > max(a, start)]
        else:
            pieces = [text[start:end]]
        for call in calls:
            name, keys = call_words(call)
            if name is None:
                continue
            missing = [w for w in (name, *keys) if not any(w in piece for piece in pieces)]
            if missing:
                where = "its trained answer" if i in trained else "the rendering"
                lacks = f"'{name}'" if name in missing else f"its arguments ({', '.join(missing)})"
                raise RecordError(
                    "tool_calls_not_rendered",
                    f"message {i} calls '{name}', but the chat template leaves {lacks} out of {where} (the "
                    "answer would be trained without its call); pass a ",
                    Opt("chat_template"),
                    " that renders tool_calls",
                )


# -- reasoning -----------------------------------------------------------------------------------------


def reasoning_of(message: ChatMessage) -> tuple[str, str | None]:
    """Return an assistant message's reasoning text (stripped; "" when none) and the key that holds it.

    The key is None for a ``<think>`` block at the start of the content.
    """
    for key in REASONING_KEYS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip(), key
    content = message.get("content")
    if isinstance(content, str) and THINK_CLOSE in content:
        head = content.split(THINK_CLOSE, 1)[0]
        head = head.split(THINK_OPEN, 1)[1] if THINK_OPEN in head else head
        if head.strip():
            return head.strip(), None
    return "", None


def with_reasoning(message: ChatMessage, key: str | None, text: str) -> ChatMessage:
    """Return the message with its reasoning replaced by ``text`` (the key's value, or the ``<think>`` block's)."""
    if key is not None:
        return {**message, key: text}
    answer = message["content"].split(THINK_CLOSE, 1)[1]
    return {**message, "content": f"{THINK_OPEN}{text}{THINK_CLOSE}{answer}"}


_PROBE = "qzxreasoningprobezq"


def reasoning_left_out(
    messages: list[ChatMessage], text: str, render: Renderer, turns: Sequence[int]
) -> tuple[int, tuple[int, ...]]:
    """Return how many of the assistant messages at ``turns`` have reasoning, and those whose reasoning ``text``
    leaves out.

    Reasoning absent from the text is left out; present once, and in no other value of the messages, it
    is kept. Otherwise (the answer repeats it, say) the turn's reasoning is replaced by a probe text and
    the conversation rendered again: left out when the probe is not in that rendering.
    """
    counted, left = 0, []
    for i in turns:
        reasoning, key = reasoning_of(messages[i])
        if not reasoning:
            continue
        counted += 1
        if reasoning not in text:
            left.append(i)
            continue
        # Kept for certain when the text holds it once and no other value of the messages does (the
        # answer's own content may repeat it). Otherwise the turn is rendered with its reasoning replaced
        # by a probe text: left out when the probe is not in that rendering. (Rendering without the
        # reasoning would not do: some templates change their markup when reasoning is given, and drop it.)
        held = sum(v.count(reasoning) for m in messages for v in m.values() if isinstance(v, str))
        if held == 1 and text.count(reasoning) == 1:
            continue
        try:
            probed = render([*messages[:i], with_reasoning(messages[i], key, _PROBE), *messages[i + 1 :]])
        except RecordError:
            continue
        if _PROBE not in probed:
            left.append(i)
    return counted, tuple(left)


# An empty think block: what Qwen3's template writes into the last answer when the answer has no reasoning.
_EMPTY_THINK = re.compile(r"<think>\s*</think>")


def empty_thinks(messages: list[ChatMessage], text: str, trained: dict[int, list[tuple[int, int]]]) -> int:
    """Return how many trained answers without reasoning of their own hold an empty think block in their
    trained text (``trained``: each one's own spans in ``text``): a block the template wrote, trained."""
    return sum(
        1
        for i, spans in trained.items()
        if not reasoning_of(messages[i])[0] and any(_EMPTY_THINK.search(text, a, b) for a, b in spans)
    )


@dataclass(frozen=True)
class Reasoning:
    """The reasoning of a conversation's trained turns: how many turns have some, which of those the
    template leaves out of the text (``left``, their message indices), whether it keeps the last trained
    turn's only, and how many trained answers without reasoning get an empty think block of the template's."""

    turns: int
    left: tuple[int, ...]
    last_only: bool
    empty_think: int = 0

    @property
    def left_out(self) -> int:
        return len(self.left)

    @staticmethod
    def of(turns: int, left: tuple[int, ...], trained: list[int], empty_think: int = 0) -> Reasoning:
        last_only = bool(left) and len(left) == turns - 1 and trained[-1] not in left
        return Reasoning(turns, left, last_only, empty_think)
