"""The typed summary, manifest, store metadata and rejects entries: read back, they write the same JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import packcli
from packcli.cli import app
from packcli.output.manifest import manifest_text, read_checked_manifest
from packcli.results import DamagedResult, Manifest, RejectEntry, RunSummary, StoreMade, StoreMeta, StoreSource
from tests.conftest import make_conversations, one_error_line, write_jsonl


@pytest.fixture
def split_run(pack: Any, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """A run whose summary and manifest have the optional keys: split, turns_fixed, rejects_file, a reject."""
    records: list[Any] = [{"messages": m} for m in make_conversations(30, seed=4, max_turns=3, max_words=40)]
    records += [{"messages": [{"role": "user", "content": "no answer"}]}, "not a conversation"]
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    out = tmp_path / "out"
    flags = ["--max-len", "48", "--overflow", "split", "--fix-turns", "--on-error", "skip"]
    result = pack(data, "-o", out, *flags, "--rejects", out / "rejects.jsonl", "--json")
    return json.loads(result.stdout), out


def test_a_real_runs_summary_and_manifest_read_back_to_the_same_json(
    split_run: tuple[dict[str, Any], Path], cache_dir: Path
) -> None:
    summary, out = split_run
    typed = RunSummary.from_dict(summary)
    assert typed.split is not None and typed.split.exchanges_cut is not None and typed.turns_fixed is not None
    assert list(typed.to_dict().items()) == list(summary.items())  # the same keys, values and order
    text = (out / "manifest.json").read_text(encoding="utf-8")
    manifest = Manifest.from_dict(json.loads(text))
    assert manifest.rejects_file == "rejects.jsonl" and manifest.counts is not None and manifest.lost == typed.lost
    assert manifest_text(manifest) == text  # byte for byte
    assert read_checked_manifest(out) == manifest
    lines = (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == sum(summary["dropped"].values()) == 2
    for line in lines:
        assert json.dumps(RejectEntry.from_dict(json.loads(line)).to_dict(), ensure_ascii=False) == line
    # the run's entry and the cache part it was assembled from
    metas = [json.loads(path.read_text()) for path in cache_dir.glob("*/meta.json")]
    assert sorted("part" in meta for meta in metas) == [False, True]
    for meta in metas:
        typed_meta = StoreMeta.from_dict(meta)
        assert typed_meta.to_dict() == meta
        assert isinstance(typed_meta.sources[0], StoreSource) and isinstance(typed_meta.made, StoreMade)


def test_a_stores_meta_writes_no_in_memory_field_and_refuses_a_source_that_lacks_a_key() -> None:
    meta = {
        "tokenizer": {"name": "t"}, "pad_id": 0, "records_read": 1, "dropped": {}, "source_starts": [0],
        "sources": [{"path": "a.jsonl", "kind": "jsonl", "format": None, "unit": "line"}],
        "segments": [], "files": {}, "meta_sha256": "", "made": {"packcli_version": "0.7.0", "time": 1.5},
    }  # fmt: skip
    typed = StoreMeta.from_dict(meta)
    assert typed.sources[0].format is None and typed.made is not None and typed.made.parts is None
    renamed = dataclasses.replace(typed, original_paths=["b.jsonl"], mix_source_of_input=[0])
    assert renamed.to_dict() == typed.to_dict() == meta  # a null format written; the in-memory fields never
    del meta["sources"][0]["unit"]
    with pytest.raises(DamagedResult, match=r"a source of meta\.json lacks unit"):
        StoreMeta.from_dict(meta)


def test_the_library_result_holds_the_typed_summary(tmp_path: Path) -> None:
    records = [{"messages": m} for m in make_conversations(12, seed=2, max_turns=2, max_words=20)]
    result = packcli.pack(records, max_len=128, output=tmp_path / "o", cache_dir=tmp_path / "c", num_proc=1)
    assert isinstance(result.summary, RunSummary)
    assert (result.rows, result.records_read, result.fill) == (result.summary.rows, 12, result.summary.fill)
    assert result.summary["cache"] == result.summary.cache == "miss"  # read by key, as before
    assert result.shards == [tmp_path / "o" / s["file"] for s in _shards(tmp_path / "o")] != []
    assert "rows=" in repr(result) and "summary" not in repr(result)


def _shards(out: Path) -> list[dict[str, Any]]:
    return list(json.loads((out / "manifest.json").read_text())["shards"])


def test_a_damaged_manifest_is_one_line_naming_what_is_wrong(
    split_run: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    _, out = split_run
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["lost"] = ["not", "an", "object"]
    path.write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["stats", str(out)])
    assert result.exit_code == 1
    assert one_error_line(result) == f"Error: {path}: lost is not a JSON object; the manifest is damaged, pack again"
    with pytest.raises(DamagedResult, match=r"^a shard entry lacks sha256$"):
        Manifest.from_dict({"max_len": 8, "shards": [{"file": "a", "rows": 1, "tokens": 8}]})
    with pytest.raises(DamagedResult, match=r"^the summary lacks lost$"):
        RunSummary.from_dict({k: v for k, v in split_run[0].items() if k != "lost"})
