"""Hard cases of agent traces: each a one-line error naming the record and the fix, or a counted skip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import one_error_line, write_jsonl

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
