"""Reasoning accounted: the summary, stats and inspect count the trained turns whose reasoning the template
leaves out, and one warning names the template's behaviour and the option that trains each round."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from packcli.cli import app

from .conftest import read_rows, trl_templates, write_jsonl


def _trace() -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": "search_notes", "arguments": {"query": "tides"}}}
    return [
        {"role": "user", "content": "Use search_notes to find the tides."},
        {"role": "assistant", "content": "", "reasoning_content": "I need the tide table.", "tool_calls": [call]},
        {"role": "tool", "content": "High tide at 6."},
        {"role": "assistant", "content": "High tide is at 6.", "reasoning_content": "The tool says 6."},
        {"role": "user", "content": "And low tide?"},
        {"role": "assistant", "content": "About noon.", "reasoning_content": "Six hours after high tide."},
    ]


QWEN3_WARNING = (
    "Warning: the chat template leaves the reasoning of 8 of 12 trained assistant turns with reasoning (in 4 "
    "records) out of the tokens (it renders the reasoning of the last round only): those answers are trained "
    "without it; pass --expand-turns reasoning to train each round as the last one, or a template that keeps it"
)


def test_the_summary_stats_and_inspect_count_the_reasoning_left_out(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "trace.jsonl", [{"messages": _trace()}] * 4)
    out = tmp_path / "out"
    argv = [data, "--max-len", "1024", "--chat-template", trl_templates() / "qwen3.jinja", "-o", out]
    result = pack(*argv, "--json")
    summary = json.loads(result.stdout)
    counted = {"turns": 12, "turns_left_out": 8, "records_left_out": 4, "records_last_round_only": 4, "empty_think": 0}
    assert summary["reasoning"] == counted
    assert QWEN3_WARNING.removeprefix("Warning: ") in summary["warnings"]
    assert QWEN3_WARNING in result.stderr.splitlines()
    assert json.loads((out / "manifest.json").read_text())["reasoning"] == counted
    stats = CliRunner().invoke(app, ["stats", str(out), "--json"])
    assert stats.exit_code == 0 and json.loads(stats.stdout)["reasoning"] == counted
    shown = CliRunner().invoke(app, ["inspect", str(out)])
    assert "reasoning left out of the tokens (whole run): 8 of 12 turns (4 records)" in shown.stdout
    template = str(trl_templates() / "qwen3.jinja")
    raw = CliRunner().invoke(app, ["stats", str(data), "--max-len", "1024", "--chat-template", template, "--no-cache"])
    assert raw.exit_code == 0 and "8 of 12 turns (4 records)" in raw.stdout


def test_the_default_template_trains_every_rounds_reasoning(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "trace.jsonl", [{"messages": _trace()}])
    summary = json.loads(pack(data, "--max-len", "1024", "-o", tmp_path / "out", "--json").stdout)
    kept = {"turns": 3, "turns_left_out": 0, "records_left_out": 0, "records_last_round_only": 0, "empty_think": 0}
    assert summary["reasoning"] == kept
    assert not any("reasoning" in w for w in summary["warnings"])
    from packcli.tokenize.encoders.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    labels = read_rows(tmp_path / "out")[0]["labels"]
    trained = tokenizer.decode([t for t in labels if t != -100])
    for text in ("I need the tide table.", "The tool says 6.", "Six hours after high tide."):
        assert f"<think>\n{text}\n</think>\n\n" in trained


def test_data_without_reasoning_has_no_reasoning_key(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    summary = json.loads(pack(chat_jsonl, "-o", tmp_path / "out", "--json", "-q").stdout)
    assert "reasoning" not in summary
    assert "reasoning" not in json.loads((tmp_path / "out" / "manifest.json").read_text())


def test_reasoning_repeated_in_the_answer_is_still_counted() -> None:
    """Reasoning that the answer's text repeats is in the rendering either way: the count renders without it."""
    from packcli.records.formats import Sample
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

    trace = _trace()
    for m in trace:
        if m["role"] == "assistant" and m["content"]:
            m["reasoning_content"] = m["content"]  # the same text twice
    encoder = Encoder(None, str(trl_templates() / "qwen3.jinja"), EncodeOptions())
    made = encoder.chat.rendered(Sample("chat", messages=trace), "assistant")
    assert made.reasoning is not None
    # The call turn's reasoning is its own (left out: an earlier round); the report's repeats its answer
    # (left out too); the last round's is kept.
    assert (made.reasoning.turns, made.reasoning.left_out, made.reasoning.last_only) == (3, 2, True)
