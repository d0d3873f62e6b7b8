"""The check that no other message's text is trained, for templates without ``{% generation %}`` blocks.

A plain conversation costs one rendering beyond the conversation itself: the answers perturbed and the
other messages marked at once. Templates that render another message's text inside an answer are still
caught, whether they always do (seen in that one rendering) or only for some text (the marks change what
the template renders, so the answers and the other messages are found in renderings of their own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packcli.errors import RecordError
from packcli.records.formats import Sample
from packcli.tokenize.templates.chat_template import ChatTemplate

# ChatML without generation blocks: the answers are located in the rendering.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ChatML that repeats the question inside the answer's turn, before its end marker.
ECHO = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.role == 'assistant' and loop.index0 > 0 %} (re: {{ messages[loop.index0 - 1].content }})"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same, but only for a question that asks to be quoted: the marks in the question change the branch.
ECHO_SOME = ECHO.replace("loop.index0 > 0", "loop.index0 > 0 and 'quote me' in messages[loop.index0 - 1].content")

CONVERSATION = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is packing?"},
    {"role": "assistant", "content": "Putting several samples into one row."},
    {"role": "user", "content": "Why does it help?"},
    {"role": "assistant", "content": "Rows carry no padding, so no compute is wasted."},
    {"role": "user", "content": "Is a sample ever split?"},
    {"role": "assistant", "content": "Never: a sample that does not fit starts a new row."},
]


def _template(text: str) -> ChatTemplate:
    chat = ChatTemplate(text, "test.jinja", {}, set())
    chat.shape()  # learned once per template, from probe conversations: not counted below
    return chat


def _counting(chat: ChatTemplate, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the renderings of the template from now on."""
    calls = [0]
    render = chat.render

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return render(*args, **kwargs)

    monkeypatch.setattr(chat, "render", counted)
    return calls


def _spans(chat: ChatTemplate, messages: list[dict[str, Any]], train_on: str = "assistant") -> list[str]:
    text, spans = chat.spans(Sample("chat", messages=messages), train_on)
    return [text[a:b] for a, b in spans]


@pytest.mark.parametrize("answers", [1, 3])
def test_a_plain_conversation_costs_one_rendering_beyond_its_own(monkeypatch: pytest.MonkeyPatch, answers: int) -> None:
    chat = _template(CHATML)
    messages = CONVERSATION[: 1 + 2 * answers]
    calls = _counting(chat, monkeypatch)
    trained = _spans(chat, messages)
    assert calls[0] == 2  # the conversation, then the answers and the other messages at once
    assert trained == [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]


def test_a_template_that_renders_the_question_inside_the_answer_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    chat = _template(ECHO)
    calls = _counting(chat, monkeypatch)
    with pytest.raises(RecordError, match="another message's text is rendered inside it") as caught:
        _spans(chat, CONVERSATION)
    assert caught.value.reason == "template_spans_not_found"
    assert calls[0] >= 3  # seen in the shared rendering; the ones after it try to cut the question out
    # With --train-on all every token is trained, the question's repeat too: nothing to check.
    assert _spans(chat, CONVERSATION, "all") == [chat.text(Sample("chat", messages=CONVERSATION))]


def test_a_template_that_renders_some_questions_inside_the_answer_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The marks change the template's branch: the shared rendering is set aside, never trusted."""
    chat = _template(ECHO_SOME)
    # No question asks to be quoted: nothing is rendered twice, and the cheap path finds the answers.
    assert _spans(chat, CONVERSATION) == [m["content"] + "<|im_end|>" for m in CONVERSATION if m["role"] == "assistant"]
    quoting = [dict(m) for m in CONVERSATION]
    quoting[3]["content"] = "Why does it help? Please quote me."
    calls = _counting(chat, monkeypatch)
    with pytest.raises(RecordError, match="message 3 is rendered inside it") as caught:
        _spans(chat, quoting)
    assert caught.value.reason == "template_spans_not_found"
    assert calls[0] > 2  # more than the cheap path's renderings


# -- a marker the tokenizer splits is trained whole or not at all ----------------------------------------


def test_a_span_that_cuts_a_split_marker_is_refused(pack: Any, tmp_path: Path) -> None:
    """A generation block that ends inside <|im_end|> (several tokens of the default tokenizer) would train a
    fragment of it: refused as template_spans_not_found, counted with --on-error skip."""
    from .conftest import one_error_line, write_jsonl

    cut = (
        "{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant\n{% generation %}"
        "{{ m.content }}<|im_{% endgeneration %}end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>\n{% endif %}{% endfor %}"
    )
    whole = cut.replace("<|im_{% endgeneration %}end|>", "<|im_end|>{% endgeneration %}")
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION[1:3]}])
    for name, text in (("cut", cut), ("whole", whole)):
        (tmp_path / f"{name}.jinja").write_text(text)
    line = one_error_line(pack(data, "--chat-template", tmp_path / "cut.jinja", "-o", tmp_path / "o1", expect=1))
    assert line.endswith(
        "chat.jsonl line 1: the trained text would start or end inside the marker '<|im_end|>', which the "
        "tokenizer splits into several tokens (a fragment of it would be trained); use the tokenizer of the "
        "template's model, or a chat template with {% generation %} blocks; fix the record, or pass --on-error "
        "skip to skip bad records"
    ), line
    pack(data, "--chat-template", tmp_path / "whole.jinja", "-o", tmp_path / "o2", "-q")


def test_a_header_prefix_never_ends_inside_a_marker() -> None:
    """Qwen3 with enable_thinking=false: its generation prompt ends "<think>\\n\\n</think>\\n\\n"; in history a
    call's turn starts "<tool_call>". The header's prefix "...assistant\\n<t" must not be taken for its end."""
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

    from .conftest import trl_templates

    kwargs = EncodeOptions.kwargs_items({"enable_thinking": False})
    encoder = Encoder(None, str(trl_templates() / "qwen3.jinja"), EncodeOptions(template_kwargs=kwargs))
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "18 C"},
        {"role": "assistant", "content": "18 C."},
    ]
    text, spans = encoder.chat.spans(Sample("chat", messages=messages), "assistant")
    assert text[spans[0][0] :].startswith("<tool_call>\n{")
    assert text[: spans[0][0]].endswith("<|im_start|>assistant\n")
