"""A chat template's failure on a record, worded as the template's and naming the message it fails on.

A template raises on what it does not handle: its own refusal (``raise_exception``: gpt-oss refuses
text and reasoning beside one call), or a Jinja error (Qwen3's own template reads ``message.content`` of
a call whose content is null). Either way the record is refused (``template_error``), as
``apply_chat_template`` refuses it; the error names the first message whose conversation prefix the
template cannot render (its index and role) and, where rendering that message changed shows it, what
would fix it. Here too: the end of the warning for a template of another model's markers, and that
warning made a message again from the tokenizer's identity that keeps it (read on every run, a cache
hit's included, which imports no other template module).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from packcli.errors import Message, Opt, Part, RecordError, first_line, render
from packcli.jsontypes import ChatMessage

REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


# The end of the warning for a template of another model's markers (``ChatTemplate.marker_warnings``).
CHECK_BOTH: tuple[Part, ...] = ("; check ", Opt("tokenizer"), " and ", Opt("chat_template"))


def stored_warning(text: str) -> Message:
    """Return a warning the tokenizer's identity holds (as the manifest records it: flags) as a message again.

    The identity is kept in the cache entry and the manifest in the command line's terms; the summary
    names the options by the terms of whichever client shows it.
    """
    from packcli.config import flag_term

    end = render(CHECK_BOTH, flag_term)
    if text.endswith(end):
        return Message(text[: -len(end)], *CHECK_BOTH)
    return Message(text)


def template_failure(exc: Exception) -> str:
    """Word a template's failure as the template's: its own refusal (``raise_exception``) as it said it, any
    other error (a missing key, None + str) as something the template does not handle in this record."""
    said = _said(exc)
    if said.startswith("the chat template raised"):
        return said
    return (
        f"the chat template cannot render this record ({said}): it does not handle something the record "
        "holds, such as a message without content or with tool_calls"
    )


def located(error: RecordError, messages: list[ChatMessage], render: Callable[[list[ChatMessage]], str]) -> RecordError:
    """Return the template's error on ``messages`` naming the message it fails on (``error`` when none is found).

    The message is the last of the shortest prefix the template cannot render. A call with both text
    and reasoning that renders with either alone, or a message without content that renders with an
    empty one, says so.
    """

    def renders(prefix: list[ChatMessage]) -> bool:
        try:
            render(prefix)
        except RecordError:
            return False
        return True

    at = next((k for k in range(len(messages)) if not renders(messages[: k + 1])), None)
    if at is None:
        return error
    message = messages[at]
    head = f"message {at} ({message.get('role')})"
    cause = error.__cause__ if isinstance(error.__cause__, Exception) else None
    said = error.detail if cause is None else _said(cause)
    key = next((k for k in REASONING_KEYS if isinstance(message.get(k), str) and message[k].strip()), None)
    text = message.get("content")
    both = bool(message.get("tool_calls") and key and isinstance(text, str) and text.strip())
    if both and renders([*messages[:at], {k: v for k, v in message.items() if k != "content"}]):
        return RecordError(
            "template_error",
            f"{head} has both text (content) and reasoning ({key}) beside its tool call, and this model's "
            f"format carries either text or reasoning beside a call ({said}); keep one of them: move the "
            "text into the reasoning, or leave one out",
        )
    if text is None and renders([*messages[:at], {**message, "content": ""}]):
        return RecordError(
            "template_error",
            f'{head} has no content, which this chat template needs ({said}); give it a string content ("" '
            "beside a tool call)",
        )
    if cause is None:
        return RecordError("template_error", f"{head}: {error.detail}")
    if said.startswith("the chat template raised: "):
        return RecordError("template_error", f"the chat template raised on {head}: {said.split(': ', 1)[1]}")
    return RecordError(
        "template_error",
        f"the chat template cannot render {head} ({said}): it does not handle something the message holds, "
        "such as a missing content or tool_calls",
    )


def _said(exc: Exception) -> str:
    from jinja2.exceptions import TemplateError

    if type(exc) is TemplateError:  # raise_exception('...') in the template: the template's own words
        return f"the chat template raised: {first_line(exc)}"
    return f"{type(exc).__name__}: {first_line(exc)}"


def with_twin(error: RecordError, source: str) -> RecordError:
    """Return a located answer's error naming the template's training twin (``NAME_training.jinja`` beside the
    file, with generation blocks), where there is one: it packs what the rendering alone cannot locate."""
    path = Path(source)
    twin = path.with_name(f"{path.stem}_training{path.suffix}")
    if error.reason != "template_spans_not_found" or path.suffix != ".jinja" or not twin.is_file():
        return error
    return RecordError(
        error.reason, *error.parts, f" (its training twin {twin} has them: pass it as ", Opt("chat_template"), ")"
    )
