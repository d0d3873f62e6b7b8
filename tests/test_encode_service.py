"""The layout where the main process encodes for the workers (``PACKCLI_ENCODE=main``) writes the same bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from packcli.contract import file_sha256
from packcli.tokenize import encode_service

from .conftest import make_conversations, one_error_line, write_jsonl


def _records(n: int) -> list[dict[str, Any]]:
    convs = make_conversations(n, seed=3, max_turns=5, max_words=120)
    records: list[dict[str, Any]] = []
    for k, messages in enumerate(convs):
        if k % 7 == 3:
            records.append({"prompt": messages[0]["content"], "completion": messages[-1]["content"]})
        elif k % 11 == 5:
            records.append({"text": " ".join(m["content"] for m in messages)})
        elif k % 13 == 6:
            records.append({"messages": [{"role": "user", "content": "x"}]})  # no answer: a counted reject
        else:
            records.append({"messages": messages})
    records.append({"messages": [{"role": "user", "content": "long " * 3000}, *convs[0][1:2]]})
    return records


@pytest.mark.parametrize("overflow", ["split", "drop"])
def test_the_main_process_encoding_writes_the_same_bytes(
    pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overflow: str
) -> None:
    data = write_jsonl(tmp_path / "data.jsonl", _records(700))
    encoded: list[int] = []
    answer = encode_service.EncodeService._answer

    def counted(self: Any, group: list[Any], add_special: bool) -> None:
        encoded.append(sum(len(items) for _, _, items in group))
        answer(self, group, add_special)

    monkeypatch.setattr(encode_service.EncodeService, "_answer", counted)
    outs = {}
    for layout in ("workers", "main"):
        monkeypatch.setenv(encode_service.LAYOUT_ENV, layout)
        out = tmp_path / layout
        argv = [data, "--max-len", "1024", "--overflow", overflow, "--on-error", "skip", "--num-proc", "2"]
        result = pack(*argv, "--no-cache", "-o", out, "--rejects", tmp_path / f"{layout}.rejects", "--json", "-q")
        outs[layout] = (out, json.loads(result.stdout))
        if layout == "workers":
            assert not encoded  # the default layout never starts the service
    (a, sa), (b, sb) = outs["workers"], outs["main"]
    # Every sample kept went through the service (a split record's pieces are encoded again one by one).
    assert sum(encoded) >= sa["samples"] > 400
    names = sorted(p.name for p in a.iterdir() if p.suffix == ".parquet")
    assert names and names == sorted(p.name for p in b.iterdir() if p.suffix == ".parquet")
    assert [file_sha256(a / n) for n in names] == [file_sha256(b / n) for n in names]
    assert sa["dropped"] == sb["dropped"] and sa["dropped"]
    assert (tmp_path / "workers.rejects").read_bytes() == (tmp_path / "main.rejects").read_bytes()


def test_one_worker_runs_in_process_without_the_service(
    pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "data.jsonl", [{"messages": m} for m in make_conversations(20)])
    started: list[int] = []
    monkeypatch.setattr(encode_service.EncodeService, "start", lambda self: started.append(1))
    monkeypatch.setenv(encode_service.LAYOUT_ENV, "main")
    pack(data, "--max-len", "1024", "--num-proc", "1", "--no-cache", "-o", tmp_path / "o", "-q")
    assert not started


def test_a_bad_record_stops_the_run_and_the_service(pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records: list[Any] = [{"messages": m} for m in make_conversations(600)]
    records[450] = {"messages": [{"role": "user", "content": 5}]}
    data = write_jsonl(tmp_path / "data.jsonl", records)
    closed: list[int] = []
    close = encode_service.EncodeService.close

    def counted(self: Any) -> None:
        closed.append(1)
        close(self)

    monkeypatch.setattr(encode_service.EncodeService, "close", counted)
    monkeypatch.setenv(encode_service.LAYOUT_ENV, "main")
    result = pack(data, "--max-len", "1024", "--num-proc", "2", "--no-cache", "-o", tmp_path / "o", expect=None)
    assert result.exit_code != 0
    assert "line 451" in result.stderr and "Traceback" not in result.stderr
    assert closed == [1]


def test_a_failed_encode_in_the_main_process_fails_the_run_instead_of_hanging(
    pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "data.jsonl", [{"messages": m} for m in make_conversations(600)])

    def broken(self: Any, group: list[Any], add_special: bool) -> None:
        raise MemoryError("no memory left")

    monkeypatch.setattr(encode_service.EncodeService, "_answer", broken)
    monkeypatch.setenv(encode_service.LAYOUT_ENV, "main")
    result = pack(data, "--max-len", "1024", "--num-proc", "2", "--no-cache", "-o", tmp_path / "o", expect=None)
    assert result.exit_code != 0
    line = one_error_line(result)
    assert "could not encode a batch (MemoryError: no memory left)" in line and "PACKCLI_ENCODE" in line
