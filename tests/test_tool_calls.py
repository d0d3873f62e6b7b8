"""Tool calls: the default template trains them with the answer; a template that drops them is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from packcli.contract import IGNORE_INDEX
from packcli.tokenize.encoders.tokenizer import load_tokenizer
from packcli.tokenize.templates.choice import builtin_template

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
        assert line.endswith(
            "calls.jsonl line 2: message 1 calls 'get_weather', but the chat template leaves 'get_weather' out of "
            "its trained answer (the answer would be trained without its call); pass a --chat-template that renders "
            "tool_calls; fix the record, or pass --on-error skip to skip bad records"
        ), line
        return
    summary = json.loads(pack(*argv, "--json", "-q").stdout)
    # The call without content fails ChatML itself (it adds content to its end marker); the others render
    # without their calls and are refused.
    assert summary["dropped"] == {"tool_calls_not_rendered": 2, "template_error": 1} and summary["samples"] == 1


# -- the call itself, not a name anywhere -----------------------------------------------------------------


def _named_in_text() -> list[dict[str, Any]]:
    """A call with text before it, whose function the user names (as people write: "use search_notes")."""
    call = {"type": "function", "function": {"name": "search_notes", "arguments": {"query": "tides"}}}
    return [
        {"role": "user", "content": "Use search_notes with the query tides, please."},
        {"role": "assistant", "content": "I will search.", "tool_calls": [call]},
        {"role": "tool", "content": "High tide at 6."},
        {"role": "assistant", "content": "High tide is at 6."},
    ]


def _trl_template(name: str) -> str:
    from .conftest import trl_templates

    return str(trl_templates() / f"{name}.jinja")


@pytest.mark.parametrize("template", ["chatml", "deepseek_r1_distill"])
def test_a_name_in_the_users_text_does_not_pass_for_the_call(pack: Any, tmp_path: Path, template: str) -> None:
    """ChatML renders no calls; DeepSeek-R1-Distill drops a call whose content is not null: both refused."""
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    data = write_jsonl(tmp_path / "named.jsonl", [{"messages": _named_in_text()}] * 3 + [{"messages": plain}])
    chosen = template if template == "chatml" else _trl_template(template)
    argv = [data, "--max-len", "512", "--chat-template", chosen, "-o", tmp_path / "out"]
    line = one_error_line(pack(*argv, expect=1))
    assert "named.jsonl line 1: message 1 calls 'search_notes', but the chat template leaves 'search_notes' out" in line
    summary = json.loads(pack(*argv, "--on-error", "skip", "--json", "-q").stdout)
    assert summary["dropped"] == {"tool_calls_not_rendered": 3} and summary["packed"] == 1


def test_the_default_template_packs_the_named_call(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "named.jsonl", [{"messages": _named_in_text()}])
    summary = json.loads(pack(data, "--max-len", "512", "-o", tmp_path / "out", "--json", "-q").stdout)
    assert summary["packed"] == 1 and summary["dropped"] == {}


def _weather(arguments: Any, content: str | None = None) -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "content": "18"},
        {"role": "assistant", "content": "It is 18 C."},
    ]


def test_arguments_as_an_object_or_a_string_reach_the_template_in_its_form(pack: Any, tmp_path: Path) -> None:
    """DeepSeek-V3's template writes a string as given (a mapping fails there): an object is passed as JSON text.

    Both records then pack to the same tokens, those of apply_chat_template with the arguments as a string.
    """
    as_object = _weather({"city": "Paris", "unit": "C"}, "Let me check.")
    as_text = _weather(json.dumps({"city": "Paris", "unit": "C"}), "Let me check.")
    data = write_jsonl(tmp_path / "args.jsonl", [{"messages": as_object}, {"messages": as_text}])
    template = _trl_template("deepseekv3")
    pack(data, "--max-len", "512", "--chat-template", template, "-o", tmp_path / "out", "-q")
    tokenizer = load_tokenizer(None)
    made = tokenizer.apply_chat_template(
        as_text, chat_template=Path(template).read_text(), tokenize=True, return_dict=True
    )
    want = list(made["input_ids"])
    rows = read_rows(tmp_path / "out")
    got = {}
    for row in rows:
        start = 0
        for length, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
            got[index] = row["input_ids"][start : start + length]
            start += length
    assert got == {0: want, 1: want}


def test_arguments_that_are_not_json_for_a_template_that_takes_objects(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "args.jsonl", [{"messages": _weather("{city: Paris}")}])
    line = one_error_line(pack(data, "--chat-template", _trl_template("qwen2_5"), "-o", tmp_path / "out", expect=1))
    assert line.endswith(
        "args.jsonl line 1: message 1: the arguments of tool call 0 ('get_weather') are not valid JSON (Expecting "
        "property name enclosed in double quotes: line 1 column 2 (char 1)); write them as a JSON object; fix the "
        "record, or pass --on-error skip to skip bad records"
    ), line


def test_tools_as_a_json_string_and_a_bad_one(pack: Any, tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    good = {"messages": _weather({"city": "Paris"}), "tools": json.dumps(tools)}
    data = write_jsonl(tmp_path / "tools.jsonl", [good, {**good, "tools": "[{"}])
    line = one_error_line(pack(data, "-o", tmp_path / "out", expect=1))
    assert line.endswith(
        "tools.jsonl line 2: field 'tools' must be a list of function schemas; it is a string that is not valid "
        "JSON (Expecting property name enclosed in double quotes at character 2); fix the record, or pass "
        "--on-error skip to skip bad records"
    ), line
    summary = json.loads(pack(data, "-o", tmp_path / "out", "--on-error", "skip", "--json", "-q").stdout)
    assert summary["packed"] == 1 and summary["dropped"] == {"wrong_type": 1}


def test_sharegpt_function_call_and_observation_turns_are_calls_and_results(pack: Any, tmp_path: Path) -> None:
    """LLaMA-Factory's format packs to the tokens of the same conversation written as messages."""
    calls = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]
    sharegpt = [
        {"from": "human", "value": "Weather and time in Paris?"},
        {"from": "function_call", "value": json.dumps(calls)},
        {"from": "observation", "value": "18"},
        {"from": "observation", "value": "noon"},
        {"from": "gpt", "value": "18 C at noon."},
    ]
    messages = [
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": c} for c in calls]},
        {"role": "tool", "content": "18"},
        {"role": "tool", "content": "noon"},
        {"role": "assistant", "content": "18 C at noon."},
    ]
    for name, record in (("a", {"conversations": sharegpt}), ("b", {"messages": messages})):
        write_jsonl(tmp_path / f"{name}.jsonl", [record])
        pack(tmp_path / f"{name}.jsonl", "--max-len", "512", "-o", tmp_path / f"out-{name}", "-q")
    a, b = read_rows(tmp_path / "out-a"), read_rows(tmp_path / "out-b")
    assert a[0]["input_ids"] == b[0]["input_ids"] and a[0]["labels"] == b[0]["labels"]
    bad = write_jsonl(
        tmp_path / "bad.jsonl", [{"conversations": [sharegpt[0], {"from": "function_call", "value": "x"}]}]
    )
    line = one_error_line(pack(bad, "-o", tmp_path / "out-bad", expect=1))
    assert line.endswith(
        "bad.jsonl line 1: message 1 of 'conversations': a function_call turn must hold a JSON object with 'name' "
        "and 'arguments' (or a list of them); fix the record, or pass --on-error skip to skip bad records"
    ), line


def test_a_tool_result_without_a_call_is_refused_or_dropped_by_fix_turns(pack: Any, tmp_path: Path) -> None:
    orphan = [
        {"role": "user", "content": "Hi"},
        {"role": "tool", "content": "stray output"},
        {"role": "assistant", "content": "Hello."},
    ]
    data = write_jsonl(tmp_path / "orphan.jsonl", [{"messages": orphan}])
    line = one_error_line(pack(data, "-o", tmp_path / "out", expect=1))
    assert line.endswith(
        "orphan.jsonl line 1: message 1 is a tool result, but no assistant message (its call) comes before it; "
        "fix the record, or pass --fix-turns to drop such results; fix the record, or pass --on-error skip to "
        "skip bad records"
    ), line
    summary = json.loads(pack(data, "-o", tmp_path / "out", "--fix-turns", "--json", "-q").stdout)
    assert summary["packed"] == 1 and summary["turns_fixed"]["orphan_tool_result_dropped"] == 1


def test_a_call_in_an_untrained_answer_must_still_be_rendered(pack: Any, tmp_path: Path) -> None:
    """--train-on last_assistant: the call is context, so it must be in the rendering (anywhere it differs)."""
    data = write_jsonl(tmp_path / "named.jsonl", [{"messages": _named_in_text()}])
    argv = [data, "--max-len", "512", "--train-on", "last_assistant", "--json", "-q"]
    summary = json.loads(pack(*argv, "-o", tmp_path / "out").stdout)
    assert summary["packed"] == 1
    line = one_error_line(pack(*argv[:-2], "--chat-template", "chatml", "-o", tmp_path / "o2", expect=1))
    assert "message 1 calls 'search_notes', but the chat template leaves 'search_notes' out of the rendering" in line


def test_a_template_that_lists_the_tools_but_renders_no_call_is_refused(pack: Any, tmp_path: Path) -> None:
    """The function's name is in the system prompt (the tools' schemas), not in the answer: refused."""
    template = tmp_path / "tools_listed.jinja"
    template.write_text(
        "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
        "{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant\n{% generation %}"
        "{{ m.content or '' }}<|im_end|>{% endgeneration %}\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>\n{% endif %}{% endfor %}"
    )
    tools = [{"type": "function", "function": {"name": "search_notes", "parameters": {"type": "object"}}}]
    data = write_jsonl(tmp_path / "listed.jsonl", [{"messages": _named_in_text(), "tools": tools}])
    line = one_error_line(pack(data, "--chat-template", template, "-o", tmp_path / "out", expect=1))
    assert "line 1: message 1 calls 'search_notes', but the chat template leaves 'search_notes' out" in line
