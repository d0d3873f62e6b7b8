"""Preference data (DPO, reward models) and KTO: formats, exact tokens, pairs kept whole, accounting."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.contract import IGNORE_INDEX
from packcli.tokenize.templates.choice import builtin_template

from .conftest import one_error_line, read_rows, trl_templates, write_jsonl

WORDS = ["pairs", "stay", "together", "café", "naïve", "rows", "🙂", "tokens", "chosen", "rejected", "loss", "42"]


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."


def preference_records(n: int, seed: int = 0, system: bool = True) -> list[dict[str, Any]]:
    """Conversational preference records: a prompt (system, user, sometimes an earlier exchange) and two answers."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        prompt = [{"role": "system", "content": _text(rng, 2, 6)}] if system and i % 3 == 0 else []
        if i % 4 == 1:
            prompt += [
                {"role": "user", "content": _text(rng, 2, 8)},
                {"role": "assistant", "content": _text(rng, 2, 8)},
            ]
        prompt.append({"role": "user", "content": _text(rng, 3, 20)})
        chosen = [{"role": "assistant", "content": _text(rng, 3, 40)}]
        rejected = [{"role": "assistant", "content": _text(rng, 1, 25)}]
        records.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return records


def string_records(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "prompt": _text(rng, 2, 12) + " Answer:",
            "chosen": " " + _text(rng, 2, 20),
            "rejected": " " + _text(rng, 1, 9),
        }
        for _ in range(n)
    ]


def kto_records(n: int, seed: int = 2) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "prompt": [{"role": "user", "content": _text(rng, 2, 12)}],
            "completion": [{"role": "assistant", "content": _text(rng, 2, 20)}],
            "label": i % 3 != 0,
        }
        for i in range(n)
    ]


def _samples(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """Every sample of an output by (sample_index, piece_index): ids, labels, role, row and place in the row."""
    samples = {}
    for r, row in enumerate(read_rows(out)):
        start = 0
        for k, (n, index, piece, role) in enumerate(
            zip(row["seq_lengths"], row["sample_index"], row["piece_index"], row["sample_role"], strict=True)
        ):
            samples[(index, piece)] = {
                "ids": row["input_ids"][start : start + n],
                "labels": row["labels"][start : start + n],
                "positions": row["position_ids"][start : start + n],
                "role": role,
                "row": r,
                "segment": k,
            }
            start += n
    return samples


def _manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())


# -- tokens and labels are exactly the template's ----------------------------------------------------


@pytest.mark.parametrize("template", ["chatml", "qwen2_5_training", "llama3_training"])
def test_ids_and_labels_equal_apply_chat_template(
    template: str, tmp_path: Path, pack: Any, model_tokenizer: tuple[str, Any]
) -> None:
    """Each chosen and rejected sample is apply_chat_template(prompt + completion), labels its assistant mask
    on the completion (templates with generation blocks: packcli's ChatML and TRL's training templates)."""
    name, tokenizer = model_tokenizer
    records = preference_records(24, seed=5)
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    if template == "chatml":
        text = builtin_template("chatml")
        args = ["--chat-template", "chatml"]
    else:
        text = (trl_templates() / f"{template}.jinja").read_text()
        args = ["--chat-template", trl_templates() / f"{template}.jinja"]
    pack(data, "--tokenizer", name, *args, "--max-len", 1024, "-o", tmp_path / "out")
    samples = _samples(tmp_path / "out")
    assert len(samples) == 2 * len(records)
    for i, record in enumerate(records):
        for piece, field, role in ((0, "chosen", 1), (1, "rejected", 2)):
            messages = record["prompt"] + record[field]
            masked = tokenizer.apply_chat_template(
                messages, chat_template=text, return_dict=True, return_assistant_tokens_mask=True
            )
            ids, mask = masked["input_ids"], masked["assistant_masks"]
            sample = samples[(i, piece)]
            assert sample["role"] == role
            assert sample["ids"] == ids, (template, i, field)
            # The assistant mask on the completion only: the prompt's earlier answers are context.
            prompt_ids = tokenizer.apply_chat_template(record["prompt"], chat_template=text, return_dict=True)
            n_prompt = len(prompt_ids["input_ids"])
            assert ids[:n_prompt] == prompt_ids["input_ids"]
            want = [t if m and k >= n_prompt else IGNORE_INDEX for k, (t, m) in enumerate(zip(ids, mask, strict=True))]
            want[0] = IGNORE_INDEX
            assert any(t != IGNORE_INDEX for t in want)
            assert sample["labels"] == want, (template, i, field)
            trained = tokenizer.decode([t for t in sample["labels"] if t != IGNORE_INDEX])
            assert record[field][0]["content"] in trained
            for turn in record["prompt"]:
                if turn["role"] == "assistant":
                    assert turn["content"] not in trained


def test_templates_without_generation_blocks_train_as_sft_does(
    tmp_path: Path, pack: Any, model_tokenizer: tuple[str, Any]
) -> None:
    """With a template without generation blocks (Qwen2.5's), each sample is the same record packed as
    prompt/completion SFT: the same ids (apply_chat_template's) and the labels of the same span rule."""
    name, tokenizer = model_tokenizer
    template = trl_templates() / "qwen2_5.jinja"
    records = preference_records(12, seed=6)
    pack(
        write_jsonl(tmp_path / "pref.jsonl", records),
        "--tokenizer",
        name,
        "--chat-template",
        template,
        "--max-len",
        1024,
        "-o",
        tmp_path / "out",
    )
    samples = _samples(tmp_path / "out")
    for piece, field in ((0, "chosen"), (1, "rejected")):
        sft = [{"prompt": r["prompt"], "completion": r[field]} for r in records]
        out = tmp_path / f"sft-{field}"
        pack(
            write_jsonl(tmp_path / f"{field}.jsonl", sft),
            "--tokenizer",
            name,
            "--chat-template",
            template,
            "--max-len",
            1024,
            "-o",
            out,
        )
        for row in read_rows(out):
            start = 0
            for n, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
                ids, labels = row["input_ids"][start : start + n], row["labels"][start : start + n]
                assert samples[(index, piece)]["ids"] == ids
                assert samples[(index, piece)]["labels"] == labels
                messages = records[index]["prompt"] + records[index][field]
                assert (
                    ids
                    == tokenizer.apply_chat_template(messages, chat_template=template.read_text(), return_dict=True)[
                        "input_ids"
                    ]
                )
                start += n


def test_string_pairs_are_encoded_like_prompt_completion(tmp_path: Path, pack: Any, base_tokenizer: Any) -> None:
    records = string_records(30)
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    pack(data, "--max-len", 512, "-o", tmp_path / "out")
    samples = _samples(tmp_path / "out")
    eos = base_tokenizer.eos_token_id
    for i, record in enumerate(records):
        for piece, field in ((0, "chosen"), (1, "rejected")):
            enc = base_tokenizer(record["prompt"] + record[field], return_offsets_mapping=True)
            ids = [*enc["input_ids"], eos]
            assert samples[(i, piece)]["ids"] == ids
            # Trained: every token overlapping the completion's characters, and the EOS.
            start = len(record["prompt"])
            want = [
                t if b > start else IGNORE_INDEX
                for t, (a, b) in zip(ids, [*enc["offset_mapping"], (0, 10**9)], strict=True)
            ]
            want[0] = IGNORE_INDEX
            assert samples[(i, piece)]["labels"] == want
    # The same strings as prompt/completion SFT records give the same ids and labels.
    sft = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in records]
    pack(write_jsonl(tmp_path / "sft.jsonl", sft), "--max-len", 512, "-o", tmp_path / "sft")
    sft_rows = read_rows(tmp_path / "sft")
    by_index = {}
    for row in sft_rows:
        start = 0
        for n, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
            by_index[index] = (row["input_ids"][start : start + n], row["labels"][start : start + n])
            start += n
    for i in range(len(records)):
        assert by_index[i] == (samples[(i, 0)]["ids"], samples[(i, 0)]["labels"])


def test_implicit_prompt_gives_the_explicit_form(tmp_path: Path, pack: Any) -> None:
    records = preference_records(20, seed=7)
    implicit = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in records]
    pack(write_jsonl(tmp_path / "a.jsonl", records), "--max-len", 1024, "-o", tmp_path / "a", "--seed", 3)
    pack(write_jsonl(tmp_path / "b.jsonl", implicit), "--max-len", 1024, "-o", tmp_path / "b", "--seed", 3)
    assert read_rows(tmp_path / "a") == read_rows(tmp_path / "b")
    assert _manifest(tmp_path / "b")["inputs"][0]["format"] == "preference"


# -- pairs stay together -------------------------------------------------------------------------------


def test_pairs_are_never_apart(tmp_path: Path, pack: Any) -> None:
    records = preference_records(300, seed=11)
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    pack(data, "--max-len", 384, "-o", tmp_path / "out", "--json")
    rows = read_rows(tmp_path / "out")
    assert max(len(r["seq_lengths"]) for r in rows) >= 6, "rows should hold several pairs"
    seen = set()
    for row in rows:
        index, piece, role = row["sample_index"], row["piece_index"], row["sample_role"]
        assert len(index) % 2 == 0
        for k in range(0, len(index), 2):
            # chosen then its rejected, adjacent, in the same row
            assert (piece[k], piece[k + 1], role[k], role[k + 1]) == (0, 1, 1, 2)
            assert index[k] == index[k + 1]
            seen.add(index[k])
        assert index == sorted(index)
        assert sum(row["seq_lengths"]) == len(row["input_ids"]) <= 384
    manifest = _manifest(tmp_path / "out")
    assert seen == set(range(len(records)))
    assert manifest["task"] == "preference"
    assert manifest["options"]["task"] == "preference"
    assert manifest["sample_roles"]["1"] == "chosen"
    assert manifest["counts"]["samples"] == 2 * len(records) == 2 * manifest["counts"]["packed"]
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


def test_ffd_packs_each_pair_as_one_item(tmp_path: Path, pack: Any) -> None:
    """The rows are FFD's over the pairs' summed lengths, and the bounds are computed on those items."""
    import numpy as np

    from packcli.plan import packing

    records = preference_records(200, seed=13)
    pack(write_jsonl(tmp_path / "pref.jsonl", records), "--max-len", 300, "-o", tmp_path / "out")
    samples = _samples(tmp_path / "out")
    items = np.array([len(samples[(i, 0)]["ids"]) + len(samples[(i, 1)]["ids"]) for i in range(len(records))])
    bins = packing.plan_rows(items, 300, "ffd")
    manifest = _manifest(tmp_path / "out")
    assert manifest["rows"] == int(bins.max()) + 1
    assert manifest["lower_bound_l2"] == packing.lower_bound_l2(items, 300)
    together = {frozenset(np.flatnonzero(bins == b).tolist()) for b in range(int(bins.max()) + 1)}
    rows = {}
    for (index, _), s in samples.items():
        rows.setdefault(s["row"], set()).add(index)
    assert {frozenset(v) for v in rows.values()} == together


def test_too_long_pairs_drop_whole_and_are_counted(tmp_path: Path, pack: Any) -> None:
    records = preference_records(60, seed=17)
    records[5]["chosen"][0]["content"] = "long " * 600
    records[9]["rejected"][0]["content"] = "long " * 600
    records[20]["prompt"][-1]["content"] = "long " * 600
    bad = dict(records[30])
    del bad["rejected"]
    records[30] = bad  # a bad record: counted under --on-error skip
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    result = pack(
        data,
        "--max-len",
        512,
        "-o",
        tmp_path / "out",
        "--on-error",
        "skip",
        "--rejects",
        tmp_path / "r.jsonl",
        "--json",
    )
    summary = json.loads(result.stdout)
    assert summary["dropped"] == {"too_long": 3, "missing_field": 1}
    assert summary["records_read"] == len(records) == summary["packed"] + sum(summary["dropped"].values())
    assert summary["samples"] == 2 * summary["packed"]
    samples = _samples(tmp_path / "out")
    assert {i for i, _ in samples} == set(range(len(records))) - {5, 9, 20, 30}
    rejects = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted((r["sample_index"], r["reason"]) for r in rejects) == [
        (5, "too_long"),
        (5, "too_long"),
        (9, "too_long"),
        (9, "too_long"),
        (20, "too_long"),
        (20, "too_long"),
        (30, "missing_field"),
    ]
    assert CliRunner().invoke(app, ["verify", str(tmp_path / "out")]).exit_code == 0


def test_truncate_cuts_the_prompt_from_the_left_for_both(tmp_path: Path, pack: Any) -> None:
    records = preference_records(40, seed=19, system=False)
    records[3]["prompt"][-1]["content"] = "context " * 400  # a long prompt: cut from its start
    records[8]["chosen"][0]["content"] = "answer " * 1000  # long completions: no prompt cut is enough
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    pack(data, "--max-len", 4096, "-o", tmp_path / "whole")
    whole = _samples(tmp_path / "whole")
    n3 = len(whole[(3, 0)]["ids"]) + len(whole[(3, 1)]["ids"])
    max_len = n3 - 50
    assert len(whole[(8, 0)]["ids"]) > max_len
    result = pack(data, "--max-len", max_len, "-o", tmp_path / "cut", "--overflow", "truncate", "--json")
    summary = json.loads(result.stdout)
    assert summary["truncated"] == 1
    assert summary["dropped"] == {"too_long": 1}
    assert summary["records_read"] == summary["packed"] + 1
    cut = _samples(tmp_path / "cut")
    chosen, rejected = cut[(3, 0)], cut[(3, 1)]
    assert chosen["row"] == rejected["row"] and rejected["segment"] == chosen["segment"] + 1
    assert len(chosen["ids"]) + len(rejected["ids"]) <= max_len
    skip = len(whole[(3, 0)]["ids"]) - len(chosen["ids"])
    assert skip == len(whole[(3, 1)]["ids"]) - len(rejected["ids"]) == 25  # the same cut for both, the fewest
    for piece, sample in ((0, chosen), (1, rejected)):
        assert sample["ids"] == whole[(3, piece)]["ids"][skip:]
        assert sample["labels"][1:] == whole[(3, piece)]["labels"][skip + 1 :]
        assert sample["labels"][0] == IGNORE_INDEX
        trained = sum(t != IGNORE_INDEX for t in sample["labels"])
        assert trained == sum(t != IGNORE_INDEX for t in whole[(3, piece)]["labels"])  # no trained token lost
        assert sample["positions"] == list(range(len(sample["ids"])))
    assert (8, 0) not in cut and (8, 1) not in cut
    assert CliRunner().invoke(app, ["verify", str(tmp_path / "cut")]).exit_code == 0


# -- KTO -----------------------------------------------------------------------------------------------


def test_kto_roles_follow_the_label(tmp_path: Path, pack: Any, base_tokenizer: Any) -> None:
    records = kto_records(40)
    pack(write_jsonl(tmp_path / "kto.jsonl", records), "--max-len", 256, "-o", tmp_path / "out")
    samples = _samples(tmp_path / "out")
    assert set(samples) == {(i, 0) for i in range(len(records))}
    for i, record in enumerate(records):
        assert samples[(i, 0)]["role"] == (3 if record["label"] else 4)
        ids = base_tokenizer.apply_chat_template(
            record["prompt"] + record["completion"], chat_template=builtin_template("deepseek"), return_dict=True
        )["input_ids"]
        assert samples[(i, 0)]["ids"] == ids
    manifest = _manifest(tmp_path / "out")
    assert manifest["task"] == "kto"
    assert CliRunner().invoke(app, ["verify", str(tmp_path / "out")]).exit_code == 0
    # --task sft reads the same records as prompt/completion SFT: no role column, the same tokens.
    pack(tmp_path / "kto.jsonl", "--max-len", 256, "-o", tmp_path / "sft", "--task", "sft")
    assert "sample_role" not in pq.read_schema(next((tmp_path / "sft").glob("*.parquet"))).names
    assert _manifest(tmp_path / "sft")["task"] == "sft"


def test_task_kto_reads_csv_labels(tmp_path: Path, pack: Any) -> None:
    csv = tmp_path / "kto.csv"
    csv.write_text("prompt,completion,label\nSay hi, hi,true\nSay no, yes,False\n", encoding="utf-8")
    pack(csv, "-o", tmp_path / "out", "--task", "kto", "--max-len", 64)
    assert [r["sample_role"] for r in read_rows(tmp_path / "out")] in ([[3, 4]], [[4, 3]], [[3], [4]], [[4], [3]])
    assert _manifest(tmp_path / "out")["inputs"][0]["format"] == "kto"


def test_task_kto_needs_a_boolean_label(tmp_path: Path, pack: Any) -> None:
    records = [{"prompt": "Say hi", "completion": " hi", "label": "yes"}]
    data = write_jsonl(tmp_path / "kto.jsonl", records)
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--task", "kto", expect=1))
    assert "kto.jsonl line 1" in line and "'label' must be true or false" in line and "--on-error skip" in line


# -- what is refused, in one line ----------------------------------------------------------------------


def test_split_megatron_and_mixed_tasks_are_refused(tmp_path: Path, pack: Any) -> None:
    data = write_jsonl(tmp_path / "pref.jsonl", preference_records(5))
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--overflow", "split", expect=2))
    assert "--overflow split does not apply to preference data" in line and "--overflow truncate" in line
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--output-format", "megatron", expect=2))
    assert "megatron" in line and "parquet" in line
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"messages": [{"role": "user", "content": "a"}]}])
    line = one_error_line(pack(data, sft, "-o", tmp_path / "out", expect=1))
    assert "mix tasks" in line and "pref.jsonl is preference" in line and "sft.jsonl is sft" in line
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--task", "sft", expect=2))
    assert "pref.jsonl" in line and "--task preference" in line
    line = one_error_line(pack(sft, "-o", tmp_path / "out", "--task", "preference", expect=1))
    assert "sft.jsonl" in line and "prompt, chosen, rejected" in line


def test_bad_preference_records_name_the_record_and_the_fix(tmp_path: Path, pack: Any) -> None:
    good = preference_records(3)
    cases = [
        ({"prompt": "q", "chosen": "a", "rejected": None}, "field 'rejected' is null"),
        ({"prompt": "q", "chosen": "a", "rejected": [{"role": "assistant"}]}, "message 0 of 'rejected'"),
        ({"chosen": "a", "rejected": "b"}, "without a prompt must be whole conversations"),
        ({"chosen": good[0]["prompt"], "rejected": good[0]["prompt"]}, "do not differ after their shared messages"),
        ({"prompt": "q", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}, "both be strings"),
    ]
    for k, (bad, words) in enumerate(cases):
        data = write_jsonl(tmp_path / f"bad{k}.jsonl", [*good, bad])
        line = one_error_line(pack(data, "-o", tmp_path / "out", "--format", "preference", expect=1))
        assert f"bad{k}.jsonl line 4" in line and words in line and "--on-error skip" in line, line


def test_empty_rejected_completion_is_a_counted_drop(tmp_path: Path, pack: Any) -> None:
    records = string_records(10)
    records[4]["rejected"] = ""
    records[4]["prompt"] = ""
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    summary = json.loads(pack(data, "-o", tmp_path / "out", "--json").stdout)
    assert summary["dropped"] == {"empty": 1}
    assert summary["packed"] == 9 == summary["records_read"] - 1


# -- the read side -------------------------------------------------------------------------------------


def test_verify_finds_a_pair_broken_apart(tmp_path: Path, pack: Any) -> None:
    import hashlib

    data = write_jsonl(tmp_path / "pref.jsonl", preference_records(30))
    pack(data, "--max-len", 512, "-o", tmp_path / "out")
    shard = next((tmp_path / "out").glob("*.parquet"))
    table = pq.read_table(shard)
    roles = table.column("sample_role").to_pylist()
    roles[0] = [2, 1, *roles[0][2:]]  # rejected before chosen
    table = table.set_column(
        table.schema.get_field_index("sample_role"),
        "sample_role",
        pa.array(roles, table.schema.field("sample_role").type),
    )
    pq.write_table(table, shard, compression="zstd", use_dictionary=False)
    manifest = _manifest(tmp_path / "out")
    manifest["shards"][0]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "chosen sample not followed by its rejected sample" in result.stderr


def test_stats_and_inspect_show_pairs(tmp_path: Path, pack: Any) -> None:
    records = preference_records(50)
    pack(write_jsonl(tmp_path / "pref.jsonl", records), "--max-len", 512, "-o", tmp_path / "out")
    stats = json.loads(CliRunner().invoke(app, ["stats", str(tmp_path / "out"), "--json"]).stdout)
    pref = stats["preference"]
    assert pref["pairs"] == 50 and pref["roles"] == {"chosen": 50, "rejected": 50}
    assert pref["pairs_per_row"]["max"] >= 2
    assert pref["padding_tokens_padded_pairs"] > 0
    assert stats["records"] == 50 and stats["samples"] == 100
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "out"), "--row", "0"])
    assert result.exit_code == 0
    assert "(chosen)" in result.stdout and "(rejected)" in result.stdout
    shown = json.loads(CliRunner().invoke(app, ["inspect", str(tmp_path / "out"), "--row", "0", "--json"]).stdout)
    assert [s["role"] for s in shown["segments"][:2]] == ["chosen", "rejected"]


@pytest.mark.parametrize("output_format", ["arrow", "mds"])
def test_other_output_formats_keep_the_roles(output_format: str, tmp_path: Path, pack: Any) -> None:
    data = write_jsonl(tmp_path / "pref.jsonl", preference_records(20))
    pack(data, "--max-len", 512, "-o", tmp_path / "out", "--output-format", output_format, "--pad-to-max")
    assert CliRunner().invoke(app, ["verify", str(tmp_path / "out")]).exit_code == 0
    from packcli.train.checks import load_rows

    rows = load_rows(tmp_path / "out")
    for row in rows:
        real = [r for r, i in zip(row["sample_role"], row["sample_index"], strict=True) if i >= 0]
        assert real == [1, 2] * (len(real) // 2)
        assert all(r == 0 for r, i in zip(row["sample_role"], row["sample_index"], strict=True) if i < 0)
    stats = json.loads(CliRunner().invoke(app, ["stats", str(tmp_path / "out"), "--json"]).stdout)
    assert stats["preference"]["pairs"] == 20


def test_overflow_error_names_the_pair(tmp_path: Path, pack: Any) -> None:
    records = preference_records(6)
    records[4]["chosen"][0]["content"] = "long " * 300
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--max-len", 256, "--overflow", "error", expect=1))
    assert "pref.jsonl line 5: the pair's samples have" in line and "more than --max-len 256" in line
    assert not (tmp_path / "out").exists()


def test_cache_hit_gives_the_same_shards(tmp_path: Path, pack: Any) -> None:
    data = write_jsonl(tmp_path / "pref.jsonl", preference_records(40))
    first = json.loads(pack(data, "-o", tmp_path / "a", "--max-len", 512, "--json").stdout)
    again = json.loads(pack(data, "-o", tmp_path / "b", "--max-len", 512, "--json").stdout)
    assert (first["cache"], again["cache"]) == ("miss", "hit")
    shards = sorted(p.name for p in (tmp_path / "a").glob("*.parquet"))
    for name in shards:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_raw_stats_plans_pairs_whole(tmp_path: Path, pack: Any, cache_dir: Path) -> None:
    records = preference_records(30)
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    args = ["stats", str(data), "--max-len", "400", "--json", "--cache-dir", str(cache_dir), "--num-proc", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout)["max_lens"][0]
    summary = json.loads(pack(data, "-o", tmp_path / "out", "--max-len", 400, "--json").stdout)
    assert line["policies"]["drop"]["records"] == summary["packed"]
    assert line["policies"]["drop"]["samples"] == summary["samples"] == 2 * summary["packed"]
    assert line["policies"]["split"]["applies"] is False
