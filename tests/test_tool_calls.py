"""Tool calls: the default template trains them with the answer; a template that drops them is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from packcli.contract import IGNORE_INDEX
from packcli.tokenize.templates import builtin_template
from packcli.tokenize.tokenizer import load_tokenizer

from .conftest import one_error_line, read_rows, write_jsonl


def _conversations() -> list[list[dict[str, Any]]]:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}
    text_args = {"type": "function", "function": {"name": "lookup", "arguments": '{"q": "naïve café"}'}}
    return [
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "18"},
            {"role": "assistant", "content": "It is 18 C."},
        ],
        [  # no content at all, two calls, the arguments once as a JSON string
            {"role": "user", "content": "Both?"},
            {"role": "assistant", "tool_calls": [call, text_args]},
            {"role": "tool", "content": "18"},
            {"role": "tool", "content": "found"},
            {"role": "assistant", "content": "Done."},
        ],
        [  # text before the call
            {"role": "user", "content": "Check."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [text_args]},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "It is ok."},
        ],
    ]


def test_the_default_template_trains_each_call_with_its_answer_exactly(pack: Any, tmp_path: Path) -> None:
    convs = _conversations()
    data = write_jsonl(tmp_path / "calls.jsonl", [{"messages": m} for m in convs])
    pack(data, "--max-len", "1024", "-o", tmp_path / "out", "-q")
    tokenizer = load_tokenizer(None)
    template = builtin_template("deepseek")
    seen = 0
    for row in read_rows(tmp_path / "out"):
        start = 0
        for length, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
            ref = tokenizer.apply_chat_template(
                convs[index],
                chat_template=template,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            ids = row["input_ids"][start : start + length]
            assert ids == list(ref["input_ids"])
            expected = [t if m else IGNORE_INDEX for t, m in zip(ref["input_ids"], ref["assistant_masks"], strict=True)]
            expected[0] = IGNORE_INDEX
            labels = row["labels"][start : start + length]
            assert labels == expected
            trained = tokenizer.decode([t for t in labels if t != IGNORE_INDEX])
            # The calls are trained, as DeepSeek-V3 writes them; the tools' outputs are not.
            assert "get_weather" in trained or "lookup" in trained
            assert trained.count("<｜tool▁calls▁begin｜>") == 1
            assert "```json" in trained and "<｜tool▁output▁begin｜>" not in trained
            if index == 0:
                assert '{"city": "Paris", "unit": "C"}' in trained
            if index == 1:
                assert '{"q": "naïve café"}' in trained  # a string of arguments is written as given
            start += length
            seen += 1
    assert seen == len(convs)


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_template_that_renders_no_tool_calls_is_refused(pack: Any, tmp_path: Path, on_error: str) -> None:
    records: list[dict[str, Any]] = [{"messages": m} for m in _conversations()]
    records.insert(0, {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]})
    data = write_jsonl(tmp_path / "calls.jsonl", records)
    argv = [data, "--max-len", "1024", "--chat-template", "chatml", "-o", tmp_path / "out", "--on-error", on_error]
    if on_error == "fail":
        line = one_error_line(pack(*argv, expect=1))
        assert "calls.jsonl line 2: message 1 calls 'get_weather'" in line
        assert "renders no tool calls" in line and "--chat-template" in line
        return
    summary = json.loads(pack(*argv, "--json", "-q").stdout)
    # The call without content fails ChatML itself (it adds content to its end marker); the others render
    # without their calls and are refused.
    assert summary["dropped"] == {"tool_calls_not_rendered": 2, "template_error": 1} and summary["samples"] == 1
