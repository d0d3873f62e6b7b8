"""The --rejects file is uniform: every entry has the record, reason, detail, source and position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import write_jsonl

KEYS = {
    "sample_index",
    "piece_index",
    "source",
    "position",
    "unit",
    "reason",
    "detail",
    "record",
    "record_truncated",
    "record_chars",
}


def test_every_reject_has_the_same_keys_and_its_record(tmp_path: Path, pack: Any) -> None:
    def chat(words: int) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok " * words}]}

    lines = write_jsonl(tmp_path / "a.jsonl", [chat(3), chat(70), chat(4), chat(5), chat(2)])
    with open(lines, "a", encoding="utf-8") as fh:
        fh.write('{"messages": [broken\n')  # line 6: bad JSON, dropped by the workers
    huge = chat(40_000)  # far over --max-len: ruled out before tokenizing; its record is a prefix
    array = tmp_path / "b.json"
    # Enough short records for more rows than --world-size, whatever the template's markers cost.
    array.write_text(json.dumps([chat(6), huge, chat(60), chat(3), *[chat(20)] * 9], ensure_ascii=False))
    rejects = tmp_path / "rejects.jsonl"
    summary = json.loads(
        pack(
            lines,
            array,
            "--max-len",
            "64",
            "--world-size",
            "4",
            "--on-error",
            "skip",
            "--rejects",
            rejects,
            "-o",
            tmp_path / "out",
            "--json",
            "-q",
        ).stdout
    )
    entries = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert len(entries) == sum(summary["dropped"].values()) >= 4
    assert {e["reason"] for e in entries} == {"invalid_json", "too_long", "world_size_remainder"}
    from packcli.owned import REJECT_KEYS

    assert REJECT_KEYS == KEYS  # what --rejects recognises as its own file is what it writes
    for entry in entries:
        assert set(entry) == KEYS, entry["reason"]
        assert entry["piece_index"] == 0  # no record was split
    by_index = {e["sample_index"]: e for e in entries}
    # JSON lines: the line as it was; a JSON array: the element as JSON text.
    line_records = lines.read_text().splitlines()
    for index in (1, 5):
        entry = by_index[index]
        assert (entry["source"], entry["unit"], entry["position"]) == (str(lines), "line", index + 1)
        assert entry["record"] == line_records[index] and not entry["record_truncated"]
    assert by_index[1]["reason"] == "too_long" and by_index[1]["detail"].endswith("tokens")
    entry = by_index[7]
    assert (entry["source"], entry["unit"], entry["position"], entry["reason"]) == (str(array), "record", 2, "too_long")
    text = json.dumps(huge, ensure_ascii=False)
    assert entry["record_truncated"] and entry["record_chars"] == len(text) and text.startswith(entry["record"])
    assert json.loads(by_index[8]["record"]) == chat(60)
    # Whatever the plan left out (too long after tokenizing, the world-size remainder) has its record.
    for entry in entries:
        if entry["reason"] == "world_size_remainder":
            assert json.loads(entry["record"])["messages"][0]["content"] == "hi"


def test_writing_the_rejects_file_never_touches_a_file_beside_it(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "word " * n} for n in (3, 400)])
    rejects = tmp_path / "r.jsonl"
    beside = tmp_path / "r.jsonl.tmp"  # a name a temporary file once had
    beside.write_text("the user's own\n")
    pack(data, "--max-len", 64, "-o", tmp_path / "out", "--rejects", rejects, "-q")
    assert [json.loads(line)["reason"] for line in rejects.read_text().splitlines()] == ["too_long"]
    assert beside.read_text() == "the user's own\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "cache", "out", "r.jsonl", "r.jsonl.tmp"]
