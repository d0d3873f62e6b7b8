"""A chat template: rendering as ``apply_chat_template`` renders, and the character spans to train on.

With ``{% generation %}`` blocks the spans are the blocks; without them they are located in the
rendering of the whole conversation (``packcli.tokenize.templates.spans``) by the template's shape, learned once
per keyword arguments (``packcli.tokenize.templates.template_shape``). Also here: how the template takes content
(strings, text parts, or both), whether its markers are tokens of the tokenizer, and which assistant
messages ``--train-on`` trains.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packcli.errors import Message, Opt, RecordError, TokenizerError, first_line
from packcli.jsontypes import ChatMessage, TemplateKwargs
from packcli.records.formats import Sample
from packcli.records.images import IMAGE_KEY
from packcli.tokenize.templates.agentic import (
    THINK_CLOSE,
    Reasoning,
    arguments_forms,
    check_calls,
    check_calls_rendered,
    check_tool_results,
    conform_arguments,
    empty_thinks,
    reasoning_left_out,
    renders_tools,
)
from packcli.tokenize.templates.spans import assistant_spans
from packcli.tokenize.templates.template_errors import CHECK_BOTH, located, template_failure, with_twin
from packcli.tokenize.templates.template_shape import Render, TemplateShape, learn_shape

GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Marker-looking substrings, for tokenizers that do not have a template's markers as added tokens.
_MARKER_RE = re.compile(r"<\|[^<>|\s]{1,40}\|>|<｜[^<>\s]{1,40}｜>|</?[A-Za-z_][\w.-]{0,40}>|\[/?[A-Z_]{2,20}\]")
# The markers a template's text holds, for the check that a trained span never cuts one: _MARKER_RE's forms
# and Gemma 4's half-open ones (<|turn>, <turn|>, <|tool_response>).
_TEMPLATE_MARKER_RE = re.compile(_MARKER_RE.pattern + r'|<\|[a-z_"]{1,40}>|<[a-z_]{1,40}\|>')
_NON_TEXT_PARTS = ("image", "image_url", "input_image", "audio", "input_audio", "video", "video_url", "file")


class ChatTemplate:
    """One Jinja chat template with the keyword arguments it is rendered with."""

    def __init__(self, template: str, source: str, template_kwargs: TemplateKwargs, added_tokens: set[str]) -> None:
        self.template = template
        self.source = source
        self.template_kwargs = template_kwargs
        self.has_generation_blocks = bool(GENERATION_RE.search(template))
        self._added = added_tokens
        self._shapes: dict[str, TemplateShape | str] = {}  # str: why it could not be learned
        self._parts: tuple[bool, bool] | None = None
        self._forms: tuple[bool, bool] | None = None  # tool call arguments taken as a mapping, as a string
        self._tools: list[bool | None] = []  # whether it renders a tools list (learned once; None: unknown)
        self.split_markers: tuple[str, ...] = ()  # set by marker_warnings: markers the tokenizer splits
        # Set where no template fits the tokenizer (templates.no_template): rendering raises it.
        self.refused: Callable[[], TokenizerError] | None = None
        # A run with a processor: image parts (packcli.records.images) render as {"type": "image"}.
        self.images = False
        # The renderer (jinja2) is imported by the first template made, not with this module: a cache hit
        # imports this module and renders nothing.
        from packcli.tokenize.templates.rendering import compile_template

        try:
            compile_template(template)
        except Exception as exc:
            first = first_line(exc, limit=10_000)
            raise TokenizerError(f"the chat template does not compile ({first}); fix the template") from exc

    def render(
        self,
        messages: list[ChatMessage],
        *,
        add_generation_prompt: bool = False,
        spans: bool = False,
        tools: list[Any] | None = None,
        kwargs: TemplateKwargs | None = None,
    ) -> tuple[str, list[tuple[int, int]]]:
        """Return the rendered conversation and, with ``spans``, its generation-block character spans."""
        if self.refused is not None:
            raise self.refused()
        from packcli.tokenize.templates import rendering

        try:
            return rendering.render(
                self.template,
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                spans=spans,
                **(self.template_kwargs if kwargs is None else kwargs),
            )
        except RecordError:
            raise
        except Exception as exc:  # a template may raise anything (raise_exception, TypeError, ...)
            raise RecordError("template_error", template_failure(exc)) from exc

    def renderer(self, tools: list[Any] | None, kwargs: TemplateKwargs) -> Render:
        def render(messages: list[ChatMessage], add_generation_prompt: bool) -> str:
            return self.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, kwargs=kwargs)[0]

        return render

    def shape(self, kwargs: TemplateKwargs | None = None) -> TemplateShape:
        """Return the template's assistant header and end markers (learned once per keyword arguments)."""
        kwargs = self.template_kwargs if kwargs is None else kwargs
        key = json.dumps(kwargs, sort_keys=True, default=str)
        if key not in self._shapes:
            try:
                self._shapes[key] = learn_shape(self.renderer(None, kwargs), self.marker_spans, self.message)
            except (RecordError, ValueError) as exc:
                self._shapes[key] = exc.detail if isinstance(exc, RecordError) else str(exc)
        shape = self._shapes[key]
        if isinstance(shape, str):
            if kwargs == self.template_kwargs:
                # With the run's own keyword arguments this is the template's fault, not a record's: every
                # conversation would be dropped for it, so the run stops and names the template.
                raise TokenizerError(
                    f"{self.source}: cannot learn where the chat template puts assistant answers ({shape})",
                    hint=(
                        "use a chat template with {% generation %} blocks (",
                        Opt("chat_template"),
                        "), or pass ",
                        Opt("train_on", "all"),
                    ),
                )
            raise RecordError(
                "template_spans_not_found",
                f"cannot learn where the template puts assistant answers with this record's "
                f"chat_template_kwargs ({shape}); use a chat template with {{% generation %}} blocks",
            )
        return shape

    def marker_spans(self, text: str) -> list[tuple[int, int]]:
        """Return where the tokenizer's added tokens (or, failing those, marker-looking text) are in ``text``."""
        found = []
        for token in self._added:
            at = text.find(token)
            while at >= 0:
                found.append((at, at + len(token)))
                at = text.find(token, at + 1)
        return found or [m.span() for m in _MARKER_RE.finditer(text)]

    def marker_warnings(self, count_tokens: Callable[[str], int], tokenizer_name: str) -> list[Message]:
        """Return a warning when the template's markers are not single tokens (a template for another model).

        Also sets ``split_markers``: every marker of the template's text that the tokenizer splits.
        """
        # The template's markers that this tokenizer splits: a trained span must never cut one.
        found = dict.fromkeys(_TEMPLATE_MARKER_RE.findall(self.template))
        self.split_markers = tuple(m for m in found if count_tokens(m) > 1)
        try:
            shape = self.shape()
        except (RecordError, TokenizerError):
            return []
        markers = [m for text in (*shape.end_markers, shape.header) for m in _MARKER_RE.findall(text)]
        split = [m for m in dict.fromkeys(markers) if count_tokens(m) > 1]
        if not split:
            return []
        return [
            Message(
                f"the chat template's role markers ({', '.join(split)}) are not single tokens of tokenizer "
                f"'{tokenizer_name}': the template is probably not this tokenizer's model's",
                *CHECK_BOTH,
            )
        ]

    def content_mode(self) -> tuple[bool, bool]:
        """Return whether the template renders string content, and whether it renders text parts itself."""
        if self._parts is None:

            def renders(content: Any) -> bool:
                probe = [
                    {"role": "user", "content": content("qzxpartprobezq")},
                    {"role": "assistant", "content": content("qzxanswerzq")},
                ]
                try:
                    text = self.render(probe)[0]
                except RecordError:
                    return False
                return text.count("qzxpartprobezq") == 1 and "'type'" not in text and '"type"' not in text

            self._parts = (renders(lambda t: t), renders(lambda t: [{"type": "text", "text": t}]))
        return self._parts

    def arguments_forms(self) -> tuple[bool, bool]:
        """Return whether the template takes tool call arguments as a mapping, and as a JSON string (learned once)."""
        if self._forms is None:
            self._forms = arguments_forms(lambda messages, tools: self.render(messages, tools=tools)[0])
        return self._forms

    def leaves_out_tools(self) -> bool:
        """Return whether the template leaves a conversation's ``tools`` list out of the text (learned once)."""
        if not self._tools:
            self._tools.append(renders_tools(lambda messages, tools: self.render(messages, tools=tools)[0]))
        return self._tools[0] is False

    def message(self, role: str, text: str) -> ChatMessage:
        strings, parts = self.content_mode()
        return {"role": role, "content": text if strings or not parts else [{"type": "text", "text": text}]}

    def prepare(self, sample: Sample) -> list[ChatMessage]:
        """Return the sample's messages as the template gets them (content parts joined or kept, nulls dropped).

        As ``apply_chat_template`` does before rendering, every key of a message whose value is null is
        dropped, ``content`` included (``"content": null`` on a tool call renders as a missing content);
        nulls nested deeper (inside tool calls, say) are passed as they are.
        """
        strings, parts = self.content_mode()
        messages = []
        for i, m in enumerate(sample.messages or []):
            message = {k: v for k, v in m.items() if v is not None}
            content = message.get("content")
            if isinstance(content, list):
                if self.images:
                    content = [{"type": "image"} if IMAGE_KEY in p else p for p in content]
                    message["content"] = content
                kinds = [p.get("type") for p in content]
                bad = next((k for k in kinds if k != "text" and not (self.images and k == "image")), None)
                if bad is not None:
                    why = "is not supported yet" if bad in _NON_TEXT_PARTS else "is unknown"
                    fix = ("; pass ", Opt("processor"), " DIR to pack images") if bad in ("image", "image_url") else ()
                    raise RecordError(
                        "unsupported_content_part",
                        f"message {i} has a content part of type '{bad}', which {why}; only text parts are packed",
                        *fix,
                    )
                if any(not isinstance(p.get("text"), str) for p in content if p.get("type") != "image"):
                    raise RecordError("wrong_type", f"message {i}: every text part needs a string 'text'")
                if not parts:
                    message["content"] = "\n".join(p["text"] for p in content if p.get("type") != "image")
            elif isinstance(content, str) and parts and not strings:
                # A template that only iterates parts (vision-language models): a string is one text part.
                message["content"] = [{"type": "text", "text": content}]
            if message.get("tool_calls"):
                check_calls(message, i)
                message = conform_arguments(message, i, self.arguments_forms())
            messages.append(message)
        check_tool_results(messages)
        return messages

    def text(self, sample: Sample) -> str:
        """Return the text of a conversation exactly as ``spans`` renders it for encoding.

        Tool calls are checked where the trained spans are known (``rendered``), not here.
        """
        return self._whole(self.prepare(sample), sample.tools, self._kwargs(sample))[0]

    def _whole(
        self, messages: list[ChatMessage], tools: list[Any] | None, kwargs: TemplateKwargs, spans: bool = False
    ) -> tuple[str, list[tuple[int, int]]]:
        """Render a record's conversation; a template error names the message it fails on (template_errors)."""
        try:
            return self.render(messages, spans=spans, tools=tools, kwargs=kwargs)
        except RecordError as err:
            if err.reason != "template_error":
                raise
            raise located(err, messages, lambda prefix: self.render(prefix, tools=tools, kwargs=kwargs)[0]) from err

    def _kwargs(self, sample: Sample) -> TemplateKwargs:
        # A record's own chat_template_kwargs override the run's.
        return self.template_kwargs | (sample.template_kwargs or {})

    def spans(self, sample: Sample, train_on: str) -> tuple[str, list[tuple[int, int]]]:
        """Return the rendered conversation and the character spans to train on (``--train-on``)."""
        made = self.rendered(sample, train_on)
        return made.text, made.spans

    def rendered(self, sample: Sample, train_on: str) -> Rendered:
        """Return the rendered conversation, its trained spans, and how many trained turns lose their reasoning.

        Refuses (``tool_calls_not_rendered``) a conversation whose calls the rendering leaves out of their
        answers (``packcli.tokenize.templates.agentic``).
        """
        messages = self.prepare(sample)
        kwargs = self._kwargs(sample)
        tools = sample.tools
        assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        train_on = resolve_train_on(sample, train_on)
        if train_on != "all" and not assistant_at:
            raise RecordError("no_assistant_turn", "the conversation has no assistant message to train on")
        which = trained_turns(sample, train_on)
        # --train-on all trains the whole text but the answers marked "train": false (or "weight": 0).
        masked = [i for i in assistant_at if i not in set(which)] if train_on == "all" else []
        trained_at = which if train_on != "all" else masked
        found: list[tuple[int, int]] = []
        if self.has_generation_blocks:
            text, blocks = self._whole(messages, tools, kwargs, spans=True)
            if (train_on != "all" or masked) and len(blocks) != len(assistant_at):
                raise RecordError(
                    "template_spans_mismatch",
                    f"the template marked {len(blocks)} generation blocks for {len(assistant_at)} assistant "
                    "messages; put exactly one {% generation %} block around each assistant message",
                )
            if train_on != "all" or masked:
                by_turn = dict(zip(assistant_at, blocks, strict=True))
                found = [by_turn[i] for i in trained_at]
        else:
            text, _ = self._whole(messages, tools, kwargs)
            if trained_at:
                try:
                    shape = self.shape(kwargs)
                    found = assistant_spans(self.renderer(tools, kwargs), messages, text, trained_at, shape)
                except RecordError as err:
                    raise with_twin(err, self.source) from err
        spans = found
        if train_on == "all":
            spans = _outside(found, len(text)) if masked else [(0, len(text))]
        # Each trained turn's own span where one span a turn was found; else (a tool's output cut out of
        # an answer, --train-on all) every trained span.
        own = train_on != "all" and len(found) == len(trained_at)
        trained = {i: [span] for i, span in zip(which, found, strict=True)} if own else {i: spans for i in which}

        def again(changed: list[ChatMessage]) -> str:
            return self.render(changed, tools=tools, kwargs=kwargs)[0]

        if self.split_markers:
            check_whole_markers(text, spans, self.split_markers)
        if any(m.get("tool_calls") for m in messages):
            check_calls_rendered(messages, text, again, trained)
        with_reasoning, left = reasoning_left_out(messages, text, again, which)
        empty = empty_thinks(messages, text, trained if own else {}) if THINK_CLOSE in text else 0
        reasoning = Reasoning.of(with_reasoning, left, which, empty) if with_reasoning or empty else None
        return Rendered(text, spans, reasoning)


@dataclass(frozen=True)
class Rendered:
    """A rendered conversation: its text, the character spans trained, and its trained turns' reasoning
    (None when none has any)."""

    text: str
    spans: list[tuple[int, int]]
    reasoning: Reasoning | None


def check_whole_markers(text: str, spans: list[tuple[int, int]], markers: tuple[str, ...]) -> None:
    """Refuse spans that start or end inside a marker the tokenizer splits: a fragment of it would be trained.

    (A marker that is one token is trained whole or not at all, whatever the span; one of several tokens
    would be cut.) Only the text around each span's ends is searched.
    """
    width = max(map(len, markers))
    for edge in {x for span in spans for x in span}:
        window = text[max(0, edge - width) : edge + width]
        base = max(0, edge - width)
        for marker in markers:
            at = window.find(marker)
            while at >= 0:
                if base + at < edge < base + at + len(marker):
                    raise RecordError(
                        "template_spans_not_found",
                        f"the trained text would start or end inside the marker {marker!r}, which the tokenizer "
                        "splits into several tokens (a fragment of it would be trained); use the tokenizer of the "
                        "template's model, or a chat template with {% generation %} blocks",
                    )
                at = window.find(marker, at + 1)


def _outside(spans: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """Return the parts of [0, n) that no span covers."""
    out, at = [], 0
    for a, b in sorted(spans):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < n:
        out.append((at, n))
    return out


def resolve_train_on(sample: Sample, train_on: str) -> str:
    """Return what ``--train-on auto`` means for this sample (completion for prompt/completion records)."""
    if train_on == "auto":
        return "completion" if sample.prompt_len is not None else "assistant"
    return train_on


def trained_turns(sample: Sample, train_on: str) -> list[int]:
    """Return the indices of the assistant messages that ``--train-on`` trains (a piece says its own).

    A message's own mark (``"train"``/``"weight"``, in ``sample.message_train``) overrides the rule for
    that message: false (0) never trains it, true (1) trains it even where the rule would not.
    """
    messages = sample.messages or []
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if sample.trained_turns is not None:
        return [i for i in sample.trained_turns if i in set(assistant_at)]
    train_on = resolve_train_on(sample, train_on)
    if train_on == "last_assistant":
        chosen = assistant_at[-1:]
    elif train_on == "completion":
        first = sample.prompt_len if sample.prompt_len is not None else (assistant_at[-1] if assistant_at else 0)
        chosen = [i for i in assistant_at if i >= first]
    else:
        chosen = assistant_at
    marks = sample.message_train
    if marks is None:
        return chosen
    by_rule = set(chosen)
    return [i for i in assistant_at if (i in by_rule if marks[i] is None else marks[i])]
