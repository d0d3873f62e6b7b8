"""Hard cases of agent traces: each a one-line error naming the record and the fix, or a counted skip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import one_error_line, trl_templates, write_jsonl

CALL = {"id": "call_1", "type": "function", "function": {"name": "search_notes", "arguments": '{"q": "x"}'}}


def _trace(call: dict[str, Any], result: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "use search_notes to find x"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            result or {"role": "tool", "content": "found", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "done"},
        ]
    }


CASES = {
    "arguments that are not JSON": (
        _trace({**CALL, "function": {"name": "search_notes", "arguments": "q=x{"}}),
        "tool_call_invalid",
        "message 1: the arguments of tool call 0 ('search_notes') are not valid JSON",
    ),
    "arguments that are JSON but no object": (
        _trace({**CALL, "function": {"name": "search_notes", "arguments": "[1, 2]"}}),
        "tool_call_invalid",
        "message 1: the arguments of tool call 0 ('search_notes') are not a JSON object",
    ),
    "a call with no name": (
        _trace({**CALL, "function": {"arguments": '{"q": "x"}'}}),
        "tool_call_invalid",
        "message 1: tool call 0 has no function name; give it function.name",
    ),
    "a result whose id matches no call": (
        _trace(CALL, {"role": "tool", "content": "found", "tool_call_id": "call_9"}),
        "tool_result_unmatched",
        "message 2 is the result of call 'call_9', but the calls it answers are 'call_1'",
    ),
    "tools as a string of invalid JSON": (
        {**_trace(CALL), "tools": '[{"type": "function", '},
        None,
        "field 'tools' must be a list of function schemas; it is a string that is not valid JSON",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_trace_is_refused_in_one_line_or_counted(case: str, tmp_path: Path, pack: Any) -> None:
    record, reason, words = CASES[case]
    good = _trace(CALL)
    data = write_jsonl(tmp_path / "d.jsonl", [good, record])
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--max-len", "1024", expect=1))
    assert f"d.jsonl line 2: {words}" in line, line
    assert not (tmp_path / "out").exists()
    summary = json.loads(
        pack(data, "-o", tmp_path / "out", "--max-len", "1024", "--on-error", "skip", "--json", "-q").stdout
    )
    assert summary["packed"] == 1 and sum(summary["dropped"].values()) == 1
    if reason is not None:
        assert summary["dropped"] == {reason: 1}


TOOLS = [{"type": "function", "function": {"name": "search_notes", "description": "Search.", "parameters": {}}}]


def test_a_tools_list_the_template_leaves_out_is_counted_and_warned(tmp_path: Path, pack: Any) -> None:
    """packcli's default template renders calls but no tools list: the records are packed, counted, warned."""
    plain = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    data = write_jsonl(tmp_path / "d.jsonl", [{**_trace(CALL), "tools": TOOLS}] * 2 + [plain])
    result = pack(data, "-o", tmp_path / "out", "--max-len", "1024", "--json")
    summary = json.loads(result.stdout)
    assert summary["packed"] == 3 and summary["tools_left_out"] == 2
    warning = (
        "the chat template leaves the tools list out of the tokens: 2 conversations carry tools the model will "
        "not see, and their calls are trained without the functions' definitions; pass a template that renders "
        "tools (--chat-template)"
    )
    assert warning in summary["warnings"] and f"Warning: {warning}" in result.stderr
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["tools_left_out"] == 2
    qwen = pack(data, "-o", tmp_path / "q", "--max-len", "1024", "--chat-template", trl_templates() / "qwen3.jinja")
    assert "tools list" not in qwen.stderr
    assert "tools_left_out" not in json.loads((tmp_path / "q" / "manifest.json").read_text())


def test_the_tools_probe_agrees_with_rendering_with_and_without_tools() -> None:
    """Over trl's templates, the probe's verdict is the comparison's: a template leaves tools out exactly
    when a conversation renders the same with them as without."""
    from packcli.tokenize.templates.chat_template import ChatTemplate

    verdicts = {}
    for path in sorted(trl_templates().glob("*.jinja")):
        specials = {"bos_token": "<s>", "eos_token": "</s>"}
        template = ChatTemplate(path.read_text(encoding="utf-8"), str(path), specials, set())
        messages = [{"role": "user", "content": "hi"}]
        same = template.render(messages, tools=TOOLS)[0] == template.render(messages)[0]
        verdicts[path.name] = template.leaves_out_tools()
        assert verdicts[path.name] == same, path.name
    assert verdicts["qwen3.jinja"] is False and verdicts["deepseekv3.jinja"] is True
