"""Bad input, interrupted runs, nothing lost: every failure handled, every record accounted for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from packcli.cli import app
from packcli.errors import RecordError
from packcli.io.sources import RawBatch
from packcli.output import write
from packcli.records.formats import DEFAULT_FIELDS
from packcli.tokenize.batches import worker
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

from .conftest import make_conversations, one_error_line, read_rows, write_jsonl

SKIP = "or pass --on-error skip to skip bad records"
GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}


def accounted(summary: dict[str, Any]) -> None:
    assert summary["records_read"] == summary["packed"] + sum(summary["dropped"].values())


BAD_RECORDS: list[tuple[str, str, str]] = [
    # (raw JSON line, reason, words in the one-line error)
    ('{"messages": [{"role": "user", "content": "hi"}', "invalid_json", "invalid JSON"),
    ('{"text": "wrong format for this file"}', "missing_field", "no field 'messages'"),
    ('{"messages": [{"role": "user", "content": 3}]}', "wrong_type", "must be a string"),
    ('{"messages": "not a list"}', "wrong_type", "must be a list of messages"),
    ('{"messages": null}', "wrong_type", "is null"),
    (
        '{"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]}',
        "unknown_role",
        "unknown role 'wizard'",
    ),
    ('{"messages": [{"role": "user", "content": null}]}', "wrong_type", "missing or null"),
    ("[1, 2, 3]", "not_an_object", "not a JSON object"),
]


@pytest.mark.parametrize(
    ("raw", "reason", "words"), BAD_RECORDS, ids=[b[1] + str(i) for i, b in enumerate(BAD_RECORDS)]
)
def test_bad_record_fails_with_one_line_or_is_skipped(
    raw: str, reason: str, words: str, pack: Any, tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(GOOD) + "\n" + raw + "\n" + json.dumps(GOOD) + "\n")
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", expect=1)
    line = one_error_line(result)
    assert line.startswith(f"Error: {data} line 2: ") and words in line and "--on-error skip" in line
    assert not (tmp_path / "out").exists()

    rejects = tmp_path / "rejects.jsonl"
    result = pack(
        data, "--max-len", "64", "-o", tmp_path / "out", "--on-error", "skip", "--json", "-q", "--rejects", rejects
    )
    summary = json.loads(result.stdout)
    assert summary["dropped"] == {reason: 1} and summary["packed"] == 2
    accounted(summary)
    [reject] = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert (reject["sample_index"], reject["position"], reject["reason"]) == (1, 2, reason)
    assert reject["record"] == raw


NO_BRACE = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]'
CUT = '{"messages": [{"role": "user", "content": "hel'


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        # the end, not the newline
        (NO_BRACE + "\n", f"Expecting ',' delimiter at column {len(NO_BRACE) + 1}, found the end of the line"),
        (CUT + "\n", f"Unterminated string starting at column {CUT.rindex(chr(34)) + 1}, found '\"hel'"),
        (NO_BRACE + "}}", f"Extra data at column {len(NO_BRACE) + 2}, found '}}'"),  # the file's last line, whole
    ],
    ids=["no-brace", "cut-in-a-string", "extra-data-at-the-end-of-the-file"],
)
def test_invalid_json_names_the_column_in_the_record(bad: str, problem: str, pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(GOOD) + "\n" + bad)
    line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "out", expect=1))
    assert line == (
        f"Error: {data} line 2: invalid JSON ({problem}); fix the record, or pass --on-error skip to skip bad records"
    )


@pytest.mark.parametrize(
    ("cut", "problem"),
    [
        (CUT, f"Unterminated string starting at column {CUT.rindex(chr(34)) + 1}"),
        (NO_BRACE, f"Expecting ',' delimiter at column {len(NO_BRACE) + 1}"),
        (CUT + "\\", f"Unterminated string starting at column {CUT.rindex(chr(34)) + 1}"),  # cut in an escape
    ],
    ids=["in-a-string", "before-its-brace", "in-an-escape"],
)
def test_a_jsonl_file_cut_in_its_last_line_says_the_file_looks_cut(
    cut: str, problem: str, pack: Any, tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n" + cut)
    line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "out", expect=1))
    assert line == (
        f"Error: {data} line 3: the file looks cut (a truncated copy?): its last line ends inside the record "
        f"({problem}); copy the file again, or pass --on-error skip to skip bad records"
    )
    summary = json.loads(
        pack(data, "--max-len", "64", "-o", tmp_path / "o", "--on-error", "skip", "--json", "-q").stdout
    )
    assert summary["packed"] == 2 and summary["dropped"] == {"truncated_file": 1}
    accounted(summary)


def test_a_jsonl_file_of_one_line_cut_says_so_too(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(CUT)  # no record parses: the error comes from finding the records' format
    line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "out", expect=1))
    assert line.startswith(f"Error: {data} line 1: the file looks cut (a truncated copy?)")
    assert line.endswith("; copy the file again, or pass --on-error skip to skip bad records")


FIRST_LINE_BAD = [
    # (file, text, the error's place and what it found): a first line that is no JSON, then records
    # whose format the sniff cannot tell (it named their fields, "(a)", not the line).
    (
        "d.jsonl",
        'id,text,a\n{"a": 1}\n{"a": 2}\n',
        "line 1: invalid JSON (Expecting value at column 1, found 'id,text,a')",
    ),
    (
        "d.jsonl",
        '# exported 2024-01-01 from the labelling tool, version 3\n{"a": 1}\n',  # quoted up to 30 characters
        "line 1: invalid JSON (Expecting value at column 1, found '# exported 2024-01-01 from the...')",
    ),
    (
        "d.json",
        '[{a: 1}, {"a": 2}]',
        "record 1: invalid JSON (Expecting property name enclosed in double quotes at "
        "byte 2 of the file, found 'a: 1}')",
    ),
]


@pytest.mark.parametrize(("name", "text", "problem"), FIRST_LINE_BAD, ids=["jsonl-header", "jsonl-note", "json"])
def test_a_first_line_that_is_not_json_is_named_with_what_it_holds(
    name: str, text: str, problem: str, pack: Any, tmp_path: Path
) -> None:
    data = tmp_path / name
    data.write_text(text)
    line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "out", expect=1))
    assert line == f"Error: {data} {problem}; fix the record, or pass --on-error skip to skip bad records"
    assert not (tmp_path / "out").exists()


def test_policy_drops_never_fail_and_are_counted(pack: Any, tmp_path: Path) -> None:
    records = [
        GOOD,
        {"messages": []},
        {"messages": [{"role": "user", "content": "no answer"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
        GOOD,
    ]
    result = pack(write_jsonl(tmp_path / "d.jsonl", records), "--max-len", "64", "-o", tmp_path / "o", "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["dropped"] == {"empty_conversation": 1, "no_assistant_turn": 2}
    assert summary["packed"] == 2
    accounted(summary)
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["counts"]["dropped"] == summary["dropped"]


def test_invalid_utf8(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"text": "caf\xe9"}\n')
    line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "o", expect=1))
    assert f"{data} line 2: byte" in line and "not UTF-8" in line
    summary = json.loads(
        pack(data, "--max-len", "64", "-o", tmp_path / "o", "--on-error", "skip", "--json", "-q").stdout
    )
    assert summary["dropped"] == {"invalid_utf8": 1}


def test_truncated_json_array_recovers_complete_records(pack: Any, tmp_path: Path) -> None:
    text = json.dumps([GOOD, GOOD, GOOD])
    data = tmp_path / "cut.json"
    data.write_text(text[: len(text) - 30])  # cut inside the third record
    line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "o", expect=1))
    assert f"{data} record 3:" in line and "cut off" in line and line.endswith("; copy the file again, " + SKIP)
    summary = json.loads(
        pack(data, "--max-len", "64", "-o", tmp_path / "o", "--on-error", "skip", "--json", "-q").stdout
    )
    assert summary["packed"] == 2 and summary["dropped"] == {"truncated_file": 1}
    accounted(summary)


def test_a_broken_element_of_a_json_array_is_one_bad_record(pack: Any, tmp_path: Path) -> None:
    good = json.dumps(GOOD)
    data = tmp_path / "broken.json"
    data.write_text(f'[{good}, {{"a": tru}}, {good}, {good}]')
    at = len(f'[{good}, {{"a": '.encode())
    line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "o", expect=1))
    assert line.startswith(
        f"Error: {data} record 2: invalid JSON (Expecting value at byte {at} of the file, found 'tru}}')"
    )
    summary = json.loads(
        pack(data, "--max-len", "64", "-o", tmp_path / "o", "--on-error", "skip", "--json", "-q").stdout
    )
    # The records after it are read, not lost uncounted.
    assert (summary["records_read"], summary["packed"], summary["dropped"]) == (4, 3, {"invalid_json": 1})
    accounted(summary)


UNICODE = {"messages": [{"role": "user", "content": "café 数据"}, {"role": "assistant", "content": "très bien"}]}
ARRAY = json.dumps([UNICODE, GOOD], ensure_ascii=False)
ARRAY_AT = len(ARRAY.encode())  # the byte after the first array


@pytest.mark.parametrize("chunk", [None, 64])  # 64: the offset is counted across the text already let go
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            ARRAY + "\n" + ARRAY + "\n",  # cat a.json b.json
            f"the file has data after its closing ] (at byte {ARRAY_AT + 1}, after record 2): concatenated JSON "
            "arrays? merge them into one array or convert to JSON lines",
        ),
        (
            ARRAY + " this is not JSON",
            f"the file has data after its closing ] (at byte {ARRAY_AT + 1}, after record 2): concatenated JSON "
            "arrays? merge them into one array or convert to JSON lines",
        ),
        (
            ARRAY[:-1] + " " + json.dumps(GOOD) + "]",
            f"record 2 of the JSON array is followed by '{{\"messages\": [{{\"role' at byte {ARRAY_AT}, not by ',' or "
            "']'; fix the file (a missing ','?)",
        ),
    ],
    ids=["two-arrays", "garbage-after", "no-comma"],
)
def test_json_array_with_more_than_one_array_is_one_line_not_a_loss(
    text: str, problem: str, chunk: int | None, pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packcli.io.readers import jsonl

    if chunk:
        monkeypatch.setattr(jsonl, "CHUNK", chunk)
    data = tmp_path / "all.json"
    data.write_text(text, encoding="utf-8")
    for policy in ("fail", "skip"):  # not a bad record: the file's records cannot all be told apart
        line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "o", "--on-error", policy, expect=1))
        assert line == f"Error: {data}: {problem}"
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        (json.dumps(GOOD, indent=2) + "\n", None),  # json.dump(record, f, indent=2)
        (json.dumps(GOOD, indent=2) + "\n" + json.dumps(GOOD, indent=2) + "\n", None),  # jq without -c
        (json.dumps(GOOD, indent=2) + "\n", 64),  # the object is longer than what is looked at
    ],
    ids=["one-object", "objects", "longer-than-a-chunk"],
)
def test_json_object_over_several_lines_says_what_a_json_file_must_be(
    text: str, chunk: int | None, pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packcli.io.readers import jsonl

    if chunk:
        monkeypatch.setattr(jsonl, "CHUNK", chunk)
    data = tmp_path / "one.json"
    data.write_text(text)
    line = one_error_line(pack(data, "--max-len", "64", "-o", tmp_path / "o", expect=1))
    assert line == (
        f"Error: {data}: the file starts with a JSON object spread over several lines; a .json file must be an "
        "array of records or JSON lines (one record per line): put the records in [ ] or write each on one line"
    )
    data.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")  # the same records as JSON lines
    summary = json.loads(pack(data, "--max-len", "64", "-o", tmp_path / "o", "--json", "-q").stdout)
    assert summary["packed"] == 2


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda d: (d / "empty.jsonl").write_text(""), "empty.jsonl: the file is empty; remove it from the inputs"),
        (lambda d: (d / "blank.jsonl").write_text("\n\n"), "blank.jsonl: the file is empty; remove it from the inputs"),
        (lambda d: (d / "data.txt").write_text("x"), "data.txt: unsupported file type '.txt'; use one of"),
        (lambda d: None, "missing.jsonl: no such file or directory; check the path"),
        (lambda d: (d / "empty.json").write_text("[]"), "empty.json: the JSON array is empty"),
    ],
    ids=["empty", "blank-lines", "extension", "missing", "empty-array"],
)
def test_unusable_files(setup: Any, expected: str, pack: Any, tmp_path: Path) -> None:
    setup(tmp_path)
    name = expected.split(":")[0]
    line = one_error_line(pack(tmp_path / name, "-o", tmp_path / "o", expect=1))
    assert line.startswith(f"Error: {tmp_path / name}: ") and expected.split(": ", 1)[1] in line


def test_mixed_file_types_and_formats_are_each_detected(pack: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "a.jsonl", [GOOD, GOOD])
    pq.write_table(
        pa.Table.from_pylist([{"text": "plain text one"}, {"text": "plain text two"}]), tmp_path / "b.parquet"
    )
    result = pack(tmp_path / "a.jsonl", tmp_path / "b.parquet", "--max-len", "64", "-o", tmp_path / "o", "--json", "-q")
    assert json.loads(result.stdout)["packed"] == 4
    inputs = json.loads((tmp_path / "o" / "manifest.json").read_text())["inputs"]
    assert [(Path(i["path"]).name, i["format"]) for i in inputs] == [("a.jsonl", "messages"), ("b.parquet", "text")]


def test_unknown_format_file(pack: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}, {"question": "q", "id": 2}])
    line = one_error_line(pack(tmp_path / "odd.jsonl", "-o", tmp_path / "o", expect=1))
    # The fields seen, and the field sets the formats read, so that the fix (--field) is plain.
    assert line == (
        f"Error: {tmp_path / 'odd.jsonl'}: cannot tell the record format from the fields of its first records "
        "(question, answer, id); a record needs messages, conversations, prompt+completion, instruction+output, "
        "chosen+rejected, input_ids or text; pass --format, or --field to name the fields"
    )
    renamed = one_error_line(
        pack(tmp_path / "odd.jsonl", "--field", "text=body", "-o", tmp_path / "o", "--on-error", "fail", expect=1)
    )
    assert "; a record needs messages, conversations, prompt+completion, instruction+output, " in renamed
    assert "input_ids or body; pass --format" in renamed


def test_max_len_smaller_than_the_template(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    line = one_error_line(pack(chat_jsonl, "--max-len", "5", "-o", tmp_path / "o", expect=1))
    assert "no sample left to pack: all 60 tokenized samples are longer than --max-len 5" in line


def test_bad_flags_exit_2_with_one_line(pack: Any, chat_jsonl: Path, tmp_path: Path, capsys: Any) -> None:
    from packcli.cli import main

    for argv, words in [
        (
            ["pack", str(chat_jsonl), "--overflow", "cut"],
            "--overflow must be one of drop, truncate, split, error, not 'cut'",
        ),
        (["pack", str(chat_jsonl), "--max-len", "1"], "--max-len must be between 2 and"),
        (["pack", str(chat_jsonl), "--bogus"], "No such option: --bogus"),
        (["pack", str(chat_jsonl), "--field", "nonsense"], "--field takes NAME=FIELD"),
        (["pack", str(chat_jsonl), "--field", "speaker=x"], "unknown field name(s) speaker"),
        (["pack", str(chat_jsonl), "--config", str(tmp_path / "none.toml")], "no such config file"),
        (
            ["pack", str(chat_jsonl), "--limit", "99999999999999999999"],
            "--limit must be between 1 and 4611686018427387904",
        ),
        (
            ["pack", str(chat_jsonl), "--truncate-side", "left"],
            "--truncate-side applies to --overflow truncate or split only (this run uses drop); pass --overflow "
            "truncate",
        ),
        (
            ["pack", str(chat_jsonl), "--overflow", "truncate", "--min-piece", "8"],
            "--min-piece applies to --overflow split only (this run uses truncate)",
        ),
        (
            ["pack", str(chat_jsonl), "--template-kwarg", "budget=1e999"],
            "template keyword argument 'budget' holds a number JSON cannot write (inf)",
        ),
        (
            ["pack", str(chat_jsonl), "--template-kwarg", "n=1" + "0" * 5000],
            "--template-kwarg n: the value is an integer of more than 4300 digits; quote it to pass it as a string",
        ),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "-o", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")])
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("Error: ") and words in err[0], (argv, err)


def test_tokenizer_not_found_and_template_that_raises(
    pack: Any, chat_jsonl: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = one_error_line(pack(chat_jsonl, "--tokenizer", "someone/not-a-model", "-o", tmp_path / "o", expect=1))
    assert "cannot load tokenizer 'someone/not-a-model'" in line and "pass its directory" in line
    line = one_error_line(pack(chat_jsonl, "--tokenizer", str(tmp_path / "nope"), "-o", tmp_path / "o", expect=1))
    assert "no such directory; check the path" in line

    template = tmp_path / "t.jinja"
    template.write_text("{{ raise_exception('this template only takes one turn') }}")
    line = one_error_line(pack(chat_jsonl, "--chat-template", template, "-o", tmp_path / "o", expect=1))
    assert f"{chat_jsonl} line 1: the chat template raised on message 0 (" in line  # the first message refused
    assert "): this template only takes one turn" in line
    summary = json.loads(
        pack(
            chat_jsonl,
            "--chat-template",
            template,
            "-o",
            tmp_path / "o",
            "--on-error",
            "skip",
            "--json",
            "-q",
            expect=1,
        ).stdout
        or "{}"
    )
    assert summary == {}  # nothing left to pack is an error even in skip mode


NO_TOKENIZER_FILES = (
    "the directory holds no tokenizer files (none of tokenizer.json, tokenizer_config.json, vocab.json, "
    "merges.txt, vocab.txt, *.model, *.tiktoken; it holds config.json, model.safetensors)"
)


def model_without_tokenizer(tmp_path: Path) -> Path:
    """A model's directory as a user may pass it for the tokenizer: its config.json and weights only."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\0")
    return model


def test_a_model_directory_without_its_tokenizer_names_the_files_looked_for(
    pack: Any, chat_jsonl: Path, tmp_path: Path
) -> None:
    """A model's directory (config.json and weights, no tokenizer file) is one line wherever a tokenizer
    is loaded, naming the directory, the files looked for and the fix (not transformers' "Couldn't
    instantiate the backend tokenizer from one of: ;"); load_rows: tests/test_training_checks.py)."""
    import packcli

    model = model_without_tokenizer(tmp_path)
    fix = "pass the directory or Hub name of the model's tokenizer as --tokenizer, or save the tokenizer into "
    fix += "this directory with tokenizer.save_pretrained"
    expected = f"Error: cannot load tokenizer '{model}': {NO_TOKENIZER_FILES}; {fix}"
    assert one_error_line(pack(chat_jsonl, "--tokenizer", model, "-o", tmp_path / "o", expect=1)) == expected
    stats = CliRunner().invoke(
        app, ["stats", str(chat_jsonl), "--max-len", "64", "--tokenizer", str(model), "--no-cache"]
    )
    assert (stats.exit_code, one_error_line(stats)) == (1, expected)
    assert not (tmp_path / "o").exists()

    with pytest.raises(packcli.TokenizerError) as error:
        packcli.pack(chat_jsonl, 64, tmp_path / "o", tokenizer=str(model), cache=False)
    assert str(error.value) == expected.removeprefix("Error: ").replace("--tokenizer", "tokenizer")

    # --processor DIR: the run's tokenizer is the processor directory's.
    (model / "preprocessor_config.json").write_text('{"processor_class": "Qwen2VLProcessor"}')
    line = one_error_line(pack(chat_jsonl, "--processor", model, "-o", tmp_path / "o", expect=1))
    assert line == (
        f"Error: cannot load the tokenizer of processor '{model}': "
        + NO_TOKENIZER_FILES.replace("model.safetensors", "model.safetensors, preprocessor_config.json")
        + "; save the processor with processor.save_pretrained (which writes its tokenizer too) and pass that "
        "directory as --processor"
    )


def test_output_not_writable(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = one_error_line(pack(chat_jsonl, "-o", blocker / "out", expect=1))
    assert "cannot create the output directory" in line


def _packed_once(pack: Any, data: Path, out: Path) -> dict[str, bytes]:
    pack(data, "--max-len", "256", "-o", out, "-q")
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_disk_full_and_interrupt_leave_previous_output(
    pack: Any, chat_jsonl: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    out = tmp_path / "out"
    before = _packed_once(pack, chat_jsonl, out)

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(write, "write_shard", disk_full)
    line = one_error_line(pack(chat_jsonl, "--max-len", "300", "-o", out, "--overwrite", expect=1))
    assert line == f"Error: {out}: cannot write a shard (No space left on device); free disk space or choose another -o"

    def interrupt(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(write, "write_shard", interrupt)
    line = one_error_line(pack(chat_jsonl, "--max-len", "300", "-o", out, "--overwrite", expect=130))
    assert "interrupted" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "chat.jsonl", "out"]  # no staging left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_leaves_nothing_that_looks_complete(sig: int, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "big.jsonl", [{"messages": m} for m in make_conversations(3000, seed=11)])
    out = tmp_path / "out"
    env = {**os.environ, "PACKCLI_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "packcli", "pack", str(data), "--max-len", "1024", "-o", str(out), "--num-proc", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 60
    while not any(p.name.startswith(".out.partial") for p in tmp_path.iterdir()) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "Error: interrupted; the previous output, if any, was left as it was"
    assert "Traceback" not in err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    cache = tmp_path / "cache"
    assert not cache.exists() or all(not p.name.startswith(".tmp") for p in cache.iterdir())


# -- fuzz ---------------------------------------------------------------------------------------------

_ENCODER: list[Encoder] = []

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
record_like = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(
            st.fixed_dictionaries(
                {}, optional={"role": st.sampled_from(["user", "assistant", "system", "x", 5]), "content": json_values}
            ),
            max_size=4,
        )
        | json_values,
        "text": json_values,
        "prompt": json_values,
        "completion": json_values,
        "input_ids": st.lists(st.integers(-5, 200_000), max_size=5) | json_values,
        "labels": json_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(
        st.one_of(
            st.binary(max_size=60),
            record_like.map(lambda r: json.dumps(r).encode()),
            json_values.map(lambda v: json.dumps(v).encode()),
        ),
        min_size=1,
        max_size=8,
    ),
    fmt=st.sampled_from([None, "messages", "text", "prompt_completion", "tokenized", "conversations", "alpaca"]),
)
def test_fuzz_no_record_raises(lines: list[bytes], fmt: str | None) -> None:
    if not _ENCODER:
        _ENCODER.append(Encoder(None, None, EncodeOptions()))
    context = worker.WorkerContext(_ENCODER[0], dict(DEFAULT_FIELDS))
    lines = [line.replace(b"\n", b" ") for line in lines]
    batch = RawBatch("fuzz.jsonl", 0, lines, list(range(1, len(lines) + 1)), raw_lines=True)
    result = worker.tokenize_batch(context, batch, fmt)
    assert len(result.sample_index) + len(result.rejects) == len(lines)
    assert sum(result.lengths) == len(result.ids) == len(result.labels)
    for reject in result.rejects:
        assert reject["reason"] and reject["detail"]
    assert all(isinstance(r, RecordError) is False for r in result.rejects)


def test_fuzz_whole_files_through_the_cli(pack: Any, tmp_path: Path) -> None:
    import random

    rng = random.Random(3)
    lines = []
    for i in range(200):
        choice = rng.random()
        if choice < 0.5:
            lines.append(json.dumps({"messages": make_conversations(1, seed=i, max_turns=2, max_words=10)[0]}).encode())
        elif choice < 0.7:
            lines.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))).replace(b"\n", b""))
        else:
            lines.append(
                json.dumps(
                    {
                        "messages": [
                            {"role": rng.choice(["user", "assistant", "bot"]), "content": rng.choice(["x", 1, None])}
                        ]
                    }
                ).encode()
            )
    data = tmp_path / "fuzz.jsonl"
    data.write_bytes(b"\n".join(line for line in lines if line.strip()) + b"\n")
    result = pack(
        data,
        "--max-len",
        "128",
        "-o",
        tmp_path / "o",
        "--on-error",
        "skip",
        "--json",
        "-q",
        "--rejects",
        tmp_path / "r.jsonl",
    )
    summary = json.loads(result.stdout)
    accounted(summary)
    rejects = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(rejects) == sum(summary["dropped"].values())
    packed = {i for row in read_rows(tmp_path / "o") for i in row["sample_index"]}
    assert len(packed) == summary["packed"]
    assert packed.isdisjoint(r["sample_index"] for r in rejects)
    assert packed | {r["sample_index"] for r in rejects} == set(range(summary["records_read"]))


@pytest.mark.parametrize("num_proc", ["1", "2"])
@pytest.mark.parametrize("bad_line", [2, 300])  # in the first batch, or where the workers are running
def test_the_first_problem_in_input_order_is_reported_whatever_the_workers(
    num_proc: str, bad_line: int, tmp_path: Path, pack: Any
) -> None:
    """A bad record before an input that cannot be read further is the error, with any --num-proc."""
    import gzip

    data = tmp_path / "data"
    data.mkdir()
    good = [{"messages": m} for m in make_conversations(800, seed=5, max_turns=1, max_words=8)]
    lines = [json.dumps(r) for r in good[:700]]
    lines[bad_line - 1] = "{not json"
    (data / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    packed = gzip.compress("".join(json.dumps(r) + "\n" for r in good).encode())
    (data / "b.jsonl.gz").write_bytes(packed[: len(packed) // 2])  # readable at first, then damaged
    line = one_error_line(pack(data, "--max-len", "256", "-o", tmp_path / "out", "--num-proc", num_proc, expect=1))
    assert f"a.jsonl line {bad_line}: invalid JSON" in line, line


def _square(x: int) -> int:
    return x * x


def _jobs_then_unreadable(n: int) -> Any:
    from packcli.errors import InputError

    yield from ((i,) for i in range(n))
    raise InputError(f"b.jsonl.gz: cannot be read after job {n}")


@pytest.mark.parametrize("n_before", [0, 1, 2, 9])
@pytest.mark.parametrize("num_proc", [1, 2])
def test_pool_gives_every_result_before_the_read_error(n_before: int, num_proc: int) -> None:
    """The jobs read before an unreadable input are all run and given, in order, then its error."""
    import multiprocessing

    from packcli.errors import InputError
    from packcli.procs import pool

    got = []
    with pytest.raises(InputError, match=f"after job {n_before}"):
        for result in pool.map_ordered(_square, _jobs_then_unreadable(n_before), num_proc):
            got.append(result)
    assert got == [i * i for i in range(n_before)]
    assert not multiprocessing.active_children()


def test_pool_stops_its_workers_when_the_consumer_closes_it_early() -> None:
    import contextlib
    import multiprocessing

    from packcli.procs import pool

    with contextlib.closing(pool.map_ordered(_square, ((i,) for i in range(40)), 2)) as results:
        assert next(results) == 0
        assert len(multiprocessing.active_children()) == 2
    assert not multiprocessing.active_children()  # stopped by close(), not left to the garbage collector


def test_a_template_that_cannot_render_a_record_is_named_as_the_template_s_failure(
    tmp_path: Path, pack: Callable[..., Any]
) -> None:
    """ChatML has no tool-call rendering: a call turn without content fails in the template, and says so, naming
    the message and what it lacks."""
    data = tmp_path / "calls.jsonl"
    call = {"type": "function", "function": {"name": "search_notes", "arguments": '{"q": "x"}'}}
    turns = [
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "found"},
        {"role": "assistant", "content": "done"},
    ]
    data.write_text(json.dumps({"messages": turns}) + "\n")
    line = one_error_line(pack(data, "--chat-template", "chatml", "--no-cache", "-o", tmp_path / "o", expect=1))
    assert line.startswith(f"Error: {data} line 1: message 1 (assistant) has no content, which this chat template ")
    assert "needs (UndefinedError: " in line and 'give it a string content ("" beside a tool call)' in line
    assert "fix the record or use a chat template that renders it (--chat-template)" in line
    assert "the chat template raised" not in line
