"""--expand-turns: one sample per round, each the conversation up to that round's end, trained on it only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from packcli.cli import app
from packcli.contract import IGNORE_INDEX
from packcli.tokenize.encoders.tokenizer import load_tokenizer
from packcli.tokenize.templates.choice import builtin_template

from .conftest import one_error_line, read_rows, trl_templates, write_jsonl

REASONING = ("I need the tide table.", "The tool says 6.", "Six hours after high tide.")
ANSWERS = ("High tide is at 6.", "About noon.")


def _trace(k: int = 0) -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": "search_notes", "arguments": {"query": f"tides {k}"}}}
    return [
        {"role": "user", "content": f"Use search_notes to find the tides ({k})."},
        {"role": "assistant", "content": "", "reasoning_content": REASONING[0], "tool_calls": [call]},
        {"role": "tool", "content": "TOOL OUTPUT: high tide at 6."},
        {"role": "assistant", "content": ANSWERS[0], "reasoning_content": REASONING[1]},
        {"role": "user", "content": "And low tide?"},
        {"role": "assistant", "content": ANSWERS[1], "reasoning_content": REASONING[2]},
    ]


# The cuts of _trace: the first round ends with message 3, the second with message 5.
CUTS = ((4, (1, 3)), (6, (5,)))


def _samples(out: Path) -> dict[tuple[int, int], tuple[list[int], list[int]]]:
    found = {}
    for row in read_rows(out):
        start = 0
        for length, index, piece in zip(row["seq_lengths"], row["sample_index"], row["piece_index"], strict=True):
            found[(index, piece)] = (row["input_ids"][start : start + length], row["labels"][start : start + length])
            start += length
    return found


def test_each_round_is_trained_once_with_its_reasoning(pack: Any, tmp_path: Path) -> None:
    """Qwen3 renders the last round's reasoning only: expanded, every round is a last round."""
    template = trl_templates() / "qwen3.jinja"
    data = write_jsonl(tmp_path / "trace.jsonl", [{"messages": _trace(k)} for k in range(3)])
    argv = [data, "--max-len", "2048", "--chat-template", template, "--json", "-q"]
    whole = json.loads(pack(*argv, "-o", tmp_path / "whole").stdout)
    summary = json.loads(pack(*argv, "-o", tmp_path / "out", "--expand-turns", "reasoning").stdout)
    assert summary["reasoning"]["turns_left_out"] == 0 and whole["reasoning"]["turns_left_out"] == 6
    extra = summary["tokens"] - whole["tokens"]
    assert summary["expanded"] == {"records": 3, "samples": 6, "extra_tokens": extra} and extra > 0
    tokenizer = load_tokenizer(None)
    samples = _samples(tmp_path / "out")
    assert sorted(samples) == [(k, r) for k in range(3) for r in range(2)]
    trained_all = ""
    for (k, r), (ids, labels) in samples.items():
        cut = _trace(k)[: CUTS[r][0]]
        want = tokenizer.apply_chat_template(cut, chat_template=template.read_text(), tokenize=True, return_dict=True)
        assert ids == list(want["input_ids"])
        trained_all += tokenizer.decode([t for t in labels if t != IGNORE_INDEX]) + "\x00"
    for text in (*REASONING, *ANSWERS, "search_notes"):
        assert trained_all.count(text) == 3, text  # once per record, over all its samples
    assert "TOOL OUTPUT" not in trained_all and "find the tides" not in trained_all
    verify = CliRunner().invoke(app, ["verify", str(tmp_path / "out")])
    assert verify.exit_code == 0, verify.stdout


def test_masks_are_the_templates_restricted_to_the_last_round(pack: Any, tmp_path: Path) -> None:
    """With packcli's deepseek template (generation blocks), --expand-turns all: each cut's assistant mask,
    on its last round only."""
    data = write_jsonl(tmp_path / "trace.jsonl", [{"messages": _trace()}] * 2)
    summary = json.loads(
        pack(
            data, "--max-len", "2048", "--expand-turns", "all", "--dedup", "exact", "-o", tmp_path / "out", "--json"
        ).stdout
    )
    assert summary["expanded"]["records"] == 2 and summary["dropped"] == {"duplicate": 1}
    tokenizer = load_tokenizer(None)
    samples = _samples(tmp_path / "out")
    assert sorted(samples) == [(0, 0), (0, 1)]
    for (_, r), (ids, labels) in samples.items():
        cut, turns = CUTS[r]
        messages = _trace()[:cut]
        ref = tokenizer.apply_chat_template(
            messages, chat_template=builtin_template("deepseek"), tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True,
        )  # fmt: skip
        assert ids == list(ref["input_ids"])
        # The mask of the last round: the mask of the whole cut minus that of the cut before this round.
        head = messages[: turns[0]]
        before = len(
            tokenizer.apply_chat_template(
                head, chat_template=builtin_template("deepseek"), tokenize=True, return_dict=True
            )["input_ids"]
        )
        mask = [m and i >= before for i, m in enumerate(ref["assistant_masks"])]
        assert labels == [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]


def test_only_conversations_that_lose_reasoning_are_expanded(pack: Any, tmp_path: Path) -> None:
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}] * 2
    data = write_jsonl(tmp_path / "mixed.jsonl", [{"messages": _trace()}, {"messages": plain}])
    template = trl_templates() / "qwen3.jinja"
    argv = [data, "--max-len", "2048", "--chat-template", template, "--expand-turns", "reasoning"]
    summary = json.loads(pack(*argv, "-o", tmp_path / "out", "--json", "-q").stdout)
    assert summary["expanded"]["records"] == 1 and summary["samples"] == 3
    default = json.loads(pack(data, "--expand-turns", "reasoning", "-o", tmp_path / "d", "--json", "-q").stdout)
    assert default["expanded"] == {"records": 0, "samples": 0, "extra_tokens": 0}  # deepseek keeps it all


def test_options_it_cannot_be_used_with(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "trace.jsonl", [{"messages": _trace()}])
    line = one_error_line(pack(data, "--expand-turns", "all", "--overflow", "split", "-o", tmp_path / "o", expect=2))
    assert line == "Error: --expand-turns cannot be used with --overflow split (a round is one sample, never split)"
    line = one_error_line(pack(data, "--expand-turns", "all", "--train-on", "all", "-o", tmp_path / "o", expect=2))
    assert line == "Error: --expand-turns cannot be used with --train-on all (a round trains its own answers only)"
    bad = pack(data, "--expand-turns", "rounds", "-o", tmp_path / "o", expect=2)
    assert "--expand-turns must be one of off, reasoning, all" in bad.stderr
