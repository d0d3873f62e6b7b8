"""Mixtures (--mix PATH=SHARE, PATH=Nx): token shares, whole-record repeats, same bytes, re-mixing from the cache."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.report.verify import verify_output

from .conftest import make_conversations, one_error_line, read_rows, write_jsonl


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A source of short conversations, one of long ones, and a cache shared by the module's runs."""
    root = tmp_path_factory.mktemp("mix")
    short = [{"messages": m} for m in make_conversations(60, seed=1, max_turns=2, max_words=15)]
    long = [{"messages": m} for m in make_conversations(20, seed=2, max_turns=4, max_words=80)]
    return {
        "short": write_jsonl(root / "short.jsonl", short),
        "long": write_jsonl(root / "long.jsonl", long),
        "cache": root / "cache",
        "root": root,
    }


def run(pack: Any, sources: dict[str, Path], out: Path, *args: Any, expect: int = 0, cache: Path | None = None) -> Any:
    cache = cache or sources["cache"]
    result = pack(*args, "--max-len", "1024", "-o", out, "--cache-dir", cache, "--json", "-q", expect=expect)
    return json.loads(result.stdout) if expect == 0 else result


def per_source(rows: list[dict[str, Any]]) -> tuple[Counter[int], Counter[tuple[int, int]]]:
    """Tokens per source, and copies per (source, sample_index), from the shards' columns."""
    tokens: Counter[int] = Counter()
    copies: Counter[tuple[int, int]] = Counter()
    for row in rows:
        assert len(row["source"]) == len(row["sample_index"])
        for src, index, n in zip(row["source"], row["sample_index"], row["seq_lengths"], strict=True):
            if index < 0:  # a --pad-to-max padding segment
                assert src == -1
                continue
            tokens[src] += n
            copies[(src, index)] += 1
    return tokens, copies


def test_token_shares_are_met_within_one_record(pack: Any, sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = run(pack, sources, out, "--mix", f"{sources['short']}=0.7", "--mix", f"{sources['long']}=0.3")
    rows = read_rows(out)
    tokens, copies = per_source(rows)
    total = sum(tokens.values())
    longest = max(n for row in rows for n in row["seq_lengths"])
    for m, share in enumerate((0.7, 0.3)):
        assert abs(tokens[m] - share * total) <= longest, (tokens, total, longest)
    mix = summary["mix"]
    assert [s["realised"]["tokens"] for s in mix["sources"]] == [tokens[0], tokens[1]]
    # Shares only: the largest output that repeats nothing, so the scarcer source (short, for 0.7) is used whole.
    assert mix["repeats"] == 0 and max(copies.values()) == 1
    assert mix["sources"][0]["left_out"]["records"] == 0 and mix["sources"][0]["realised"]["records"] == 60
    left = mix["sources"][1]["left_out"]["records"]
    assert left > 0 and summary["packed"] + left == summary["records_read"] == 80
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mix"]["sources"][1]["name"] == str(sources["long"])
    assert "source" in manifest["columns"] and verify_output(out).ok


def test_2x_gives_every_record_exactly_twice_never_in_one_row(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    summary = run(
        pack, sources, out, "--mix", f"{sources['short']}=2x", "--mix", f"{sources['long']}=1x", "--pad-to-max"
    )
    rows = read_rows(out)
    _, copies = per_source(rows)
    assert {n for (src, _), n in copies.items() if src == 0} == {2} and len([k for k in copies if k[0] == 0]) == 60
    assert {n for (src, _), n in copies.items() if src == 1} == {1}
    for row in rows:  # a row never holds two copies of a record
        real = [i for i in row["sample_index"] if i >= 0]
        assert len(real) == len(set(real))
    mix = summary["mix"]
    assert mix["repeats"] == 60 and mix["repeats_in_same_row"] == 0 and summary["samples"] == 140
    assert [s["epochs"] for s in mix["sources"]] == [2.0, 1.0]
    assert verify_output(out).ok


def test_same_seed_same_bytes_and_a_new_recipe_is_a_cache_hit(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    recipe = ["--mix", f"{sources['short']}=0.5", "--mix", f"{sources['long']}=0.5", "--seed", "3"]
    first = run(pack, sources, tmp_path / "a", *recipe, cache=tmp_path / "own-cache")
    again = run(pack, sources, tmp_path / "b", *recipe, cache=tmp_path / "own-cache")
    assert first["cache"] == "miss" and again["cache"] == "hit"
    shards = sorted(p.name for p in (tmp_path / "a").glob("shard-*"))
    assert shards and all((tmp_path / "a" / s).read_bytes() == (tmp_path / "b" / s).read_bytes() for s in shards)
    # Another weight re-packs from the cache: no tokenization, and another output.
    remix = ["--mix", f"{sources['short']}=0.2", "--mix", f"{sources['long']}=0.8", "--seed", "3"]
    other = run(pack, sources, tmp_path / "c", *remix, cache=tmp_path / "own-cache")
    assert other["cache"] == "hit" and other["stage_seconds"]["tokenize"] == 0.0
    assert [s["requested_share"] for s in other["mix"]["sources"]] == [0.2, 0.8]
    assert other["mix"]["sources"][1]["realised"]["records"] == 20  # long is now the scarce one: whole
    # Another seed samples other records of the source that is cut.
    seeded = run(pack, sources, tmp_path / "d", *recipe[:-1], "4", cache=tmp_path / "own-cache")
    kept = [{i for r in read_rows(tmp_path / x) for i, s in zip(r["sample_index"], r["source"], strict=True) if s == 1}
            for x in ("a", "d")]  # fmt: skip
    assert kept[0] != kept[1] and seeded["cache"] == "hit"


def test_a_preset_sources_list_is_the_same_recipe(pack: Any, sources: dict[str, Path], tmp_path: Path) -> None:
    preset = sources["root"] / "recipe.yaml"
    preset.write_text("sources:\n  - {path: short.jsonl, share: 0.6}\n  - {path: long.jsonl, share: 0.4}\n")
    run(pack, sources, tmp_path / "a", "--config", preset)
    run(pack, sources, tmp_path / "b", "--mix", f"{sources['short']}=0.6", "--mix", f"{sources['long']}=0.4")
    a, b = (
        pq.read_table(tmp_path / "a" / "shard-00000-of-00001.parquet"),
        pq.read_table(tmp_path / "b" / "shard-00000-of-00001.parquet"),
    )
    assert a.equals(b)


@pytest.mark.parametrize(
    ("weights", "words"),
    [
        (("0.5", "0.4"), "--mix shares sum to 0.9; they must sum to 1 (or give a source as Nx)"),
        (("2x", "1"), "--mix shares sum to 1 beside Nx sources; with Nx sources the shares must sum to less than 1"),
        (("0.5", "half"), "--mix takes PATH=SHARE (e.g. chat.jsonl=0.7) or PATH=Nx (e.g. code/=2x), not"),
        (("0x", "1"), "the epochs must be above 0"),
        (("1.5", "0.5"), "the share must be above 0 and at most 1"),
    ],
)
def test_a_bad_recipe_is_one_line_naming_mix(
    pack: Any, sources: dict[str, Path], tmp_path: Path, weights: tuple[str, str], words: str
) -> None:
    args = ["--mix", f"{sources['short']}={weights[0]}", "--mix", f"{sources['long']}={weights[1]}"]
    result = run(pack, sources, tmp_path / "out", *args, expect=2)
    assert words in one_error_line(result)
    assert not (tmp_path / "out").exists()


def test_mix_and_inputs_together_are_refused(pack: Any, sources: dict[str, Path], tmp_path: Path) -> None:
    result = run(pack, sources, tmp_path / "out", str(sources["short"]), "--mix", f"{sources['long']}=1", expect=2)
    assert "--mix names the inputs" in one_error_line(result)


def test_dedup_exact_drops_repeated_content_across_inputs(pack: Any, tmp_path: Path) -> None:
    chats = [{"messages": m} for m in make_conversations(12, seed=5, max_turns=2, max_words=12)]
    first = [*chats[:8]]
    first[5] = chats[0]  # a repeat within an input
    first[7] = chats[3]
    same = {"prompt": "2 + 2?", "completion": "4."}
    # Repeats of the first input's records as other bytes (no spaces), and a pair with its keys reordered.
    second = [chats[1], chats[9], {"messages": chats[2]["messages"]}]
    a = write_jsonl(tmp_path / "a.jsonl", first)
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n" for r in second))
    c = write_jsonl(tmp_path / "c.jsonl", [same, dict(reversed(list(same.items())))])
    out, rejects = tmp_path / "out", tmp_path / "rejects.jsonl"
    args = [a, b, c, "--max-len", "1024", "-o", out, "--json", "-q", "--dedup", "exact", "--rejects", rejects]
    summary = json.loads(pack(*args).stdout)
    assert summary["dedup"]["by_source"] == {str(a): 2, str(b): 2, str(c): 1}
    assert summary["dropped"] == {"duplicate": 5} and summary["packed"] == 13 - 5
    kept = sorted(i for row in read_rows(out) for i in row["sample_index"])
    assert kept == [0, 1, 2, 3, 4, 6, 9, 11]
    entries = [json.loads(line) for line in rejects.read_text().splitlines()]
    named = {e["sample_index"]: e["detail"] for e in entries if e["reason"] == "duplicate"}
    assert named == {
        5: f"the same content as {a} line 1 (sample_index 0)",
        7: f"the same content as {a} line 4 (sample_index 3)",
        8: f"the same content as {a} line 2 (sample_index 1)",
        10: f"the same content as {a} line 3 (sample_index 2)",
        12: f"the same content as {c} line 1 (sample_index 11)",
    }
    # Without --dedup every record is packed (from the same cache entry: the keys are in the store).
    again = json.loads(pack(a, b, c, "--max-len", "1024", "-o", tmp_path / "all", "--json", "-q").stdout)
    assert again["packed"] == 13 and again["cache"] == "hit" and "dedup" not in again
    assert verify_output(out).ok
    # Without the cache the keys are made only for --dedup exact (a JSON dump and a hash a record): the same
    # records dropped, and without it the same shards as with the keys.
    bare_args = [a, b, c, "--max-len", "1024", "--json", "-q", "--dedup", "exact", "--no-cache"]
    bare = json.loads(pack(*bare_args, "-o", tmp_path / "bare").stdout)
    assert bare["dropped"] == {"duplicate": 5} and _shards(tmp_path / "bare") == _shards(out)
    pack(a, b, c, "--max-len", "1024", "-o", tmp_path / "all-bare", "-q", "--no-cache")
    assert _shards(tmp_path / "all-bare") == _shards(tmp_path / "all")


def test_a_run_that_keeps_no_store_and_drops_no_duplicates_makes_no_content_keys(tmp_path: Path) -> None:
    from packcli.config import PackConfig
    from packcli.run.options import tokenize_options
    from packcli.run.tokenized import tokenized_inputs

    data = write_jsonl(tmp_path / "a.jsonl", [{"messages": m} for m in make_conversations(6, seed=2)])
    given = {"inputs": (str(data),), "output": str(tmp_path / "o"), "max_len": 1024}
    assert not tokenize_options(PackConfig(**given, dry_run=True)).content_keys
    assert tokenize_options(PackConfig(**given, cache_dir=str(tmp_path / "c"))).content_keys  # --dedup may come later
    with tokenized_inputs(PackConfig(**given, cache=False)) as bare:
        assert bare.store.content_key is None
    with tokenized_inputs(PackConfig(**given, cache=False, dedup="exact")) as keyed:
        assert keyed.store.content_key is not None and len(keyed.store.content_key) == len(keyed.store.lengths)


def _shards(out: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(out.glob("shard-*"))]


def test_verify_checks_the_source_column_against_the_manifest(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run(pack, sources, out, "--mix", f"{sources['short']}=0.5", "--mix", f"{sources['long']}=0.5")
    assert verify_output(out).ok
    manifest = json.loads((out / "manifest.json").read_text())
    first, second = manifest["mix"]["sources"]
    first["sample_index"], second["sample_index"] = second["sample_index"], first["sample_index"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = [p.message for p in verify_output(out).problems]
    assert len(problems) == 1 and "have source values that are not the manifest's mix source" in problems[0]


def test_a_source_may_be_a_directory_and_an_input_belongs_to_one_source(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    write_jsonl(code / "a.jsonl", [{"messages": m} for m in make_conversations(6, seed=7, max_turns=1)])
    write_jsonl(code / "b.jsonl", [{"messages": m} for m in make_conversations(6, seed=8, max_turns=1)])
    out = tmp_path / "out"
    summary = run(pack, sources, out, "--mix", f"{sources['short']}=0.5", "--mix", f"{code}/=0.5")
    second = summary["mix"]["sources"][1]
    assert second["name"] == f"{code}/" and len(second["inputs"]) == 2 and len(second["sample_index"]) == 2
    assert second["available"]["records"] == 12 and verify_output(out).ok
    clash = run(pack, sources, tmp_path / "o2", "--mix", f"{code}=0.5", "--mix", f"{code / 'a.jsonl'}=0.5", expect=2)
    assert "both hold" in one_error_line(clash) and "give each input to one source" in one_error_line(clash)


def test_the_library_takes_the_recipe(sources: dict[str, Path], tmp_path: Path) -> None:
    import packcli

    recipe = [f"{sources['short']}=0.5", f"{sources['long']}=2x"]
    result = packcli.pack(None, 1024, tmp_path / "out", mix=recipe, cache_dir=sources["cache"], num_proc=1)
    long = result.summary["mix"]["sources"][1]
    assert long["repeats"] == 20 and long["realised"]["samples"] == 40
    # With an Nx source the shares are of the whole: short is 0.5 of it, repeated as often as needed.
    short = result.summary["mix"]["sources"][0]
    assert short["target"] == long["available"]["tokens"] * 2 and short["repeats"] > 0
    assert packcli.verify(result.output).ok
    with pytest.raises(packcli.UsageError, match=r"^mix shares sum to 0\.9; they must sum to 1"):
        packcli.pack(None, mix=[f"{sources['short']}=0.5", f"{sources['long']}=0.4"], output=tmp_path / "o2")


def test_repeats_are_parted_with_several_ranks(pack: Any, sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    recipe = ["--mix", f"{sources['short']}=2x", "--mix", f"{sources['long']}=0.3", "--max-len", "512"]
    summary = pack(*recipe, "--world-size", "4", "--rank-remainder", "pad", "-o", out, "--json", "-q")
    mix = json.loads(summary.stdout)["mix"]
    assert mix["repeats"] == 60 and mix["repeats_in_same_row"] == 0
    for row in read_rows(out):
        assert len(row["sample_index"]) == len(set(row["sample_index"]))
    assert verify_output(out).ok


def test_the_content_key_is_the_canonical_json_of_the_normalised_sample() -> None:
    """The key hashes the sample's fields but the roles it renamed, as sorted JSON: records of every
    format, with tools, template arguments and training marks, and preference pairs as their members."""
    import dataclasses
    import hashlib

    from packcli.records.dedup import content_key
    from packcli.records.formats import DEFAULT_FIELDS, detect_format, normalize
    from packcli.records.preference import normalize_members

    def reference(sample: Any) -> bytes:
        members = getattr(sample, "samples", None)
        bodies = [dataclasses.asdict(m) for m in (members if members is not None else [sample])]
        for body in bodies:
            body.pop("renamed")
        body = bodies if members is not None else bodies[0]
        text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    fields = dict(DEFAULT_FIELDS)
    chat = {
        "messages": [
            {"role": "user", "content": "héllo, world: 1"},
            {"role": "assistant", "content": "hi", "train": False},
            {"role": "user", "content": [{"type": "text", "text": "more"}]},
            {"role": "assistant", "content": "ok"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [1, 2]}}}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    records = [
        chat,
        {"prompt": "p", "completion": "c"},
        {"instruction": "i", "input": "x", "output": "o"},
        {"text": "plain text"},
        {"input_ids": [1, 2, 3], "labels": [-100, 2, 3]},
    ]
    keys = set()
    for record in records:
        sample = normalize(record, str(detect_format(record, fields)), fields)
        assert content_key(sample) == reference(sample)
        keys.add(content_key(sample))
    pair = {"prompt": "p", "chosen": "a", "rejected": "b"}
    members = normalize_members(pair, str(detect_format(pair, fields)), fields)
    assert content_key(members) == reference(members)
    assert len(keys | {content_key(members)}) == len(records) + 1


def test_the_content_key_is_the_same_whether_orjson_or_json_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """orjson writes the key's JSON where it writes json's bytes; a body it would write otherwise (a float: 1e-05
    is 0.00001 to orjson) or cannot write (bytes, a lone surrogate, an integer past 64 bits, deep nesting) is
    written by json, so a key is the same with orjson or without it."""
    import orjson

    from packcli.records import dedup

    def reference(body: Any) -> bytes:
        text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=dedup._bytes_key)
        return text.encode("utf-8", "surrogatepass")

    every_char = "".join(chr(c) for c in range(0x300)) + "\u2028\u2029\ufeff\uffff\U0001f600\U0010ffff"
    deep: Any = "leaf"
    for _ in range(300):
        deep = [deep]
    written_alike = [
        {"kind": "chat", "messages": [{"role": "user", "content": every_char}], "message_train": (True, None, False)},
        {"é": 1, "e": 2, "\U0001f600": 3, "\uffff": 4, "Z": {"b": [1, {"y": None, "x": True}], "a": ()}},
        [2**63 - 1, -(2**63), 2**64 - 1, 0, -1],
    ]
    not_alike = [
        {"weight": 1e-05, "big": 1e16},  # orjson: 0.00001 and 1e16; json: 1e-05 and 1e+16
        {"image": b"\x89PNG"},
        {"text": "a lone \ud800 surrogate"},
        {"n": 2**64, "m": -(2**63) - 1},
        {1: "an integer key"},
        deep,
    ]
    for body in written_alike:
        assert dedup._written_alike(body)
        assert orjson.dumps(body, option=orjson.OPT_SORT_KEYS) == reference(body)
        assert dedup.canonical_json(body) == reference(body)
    for body in not_alike:
        assert dedup.canonical_json(body) == reference(body)
    assert not dedup._written_alike(not_alike[0])
    assert orjson.dumps(not_alike[0], option=orjson.OPT_SORT_KEYS) != reference(not_alike[0])
    keys = [dedup.canonical_json(body) for body in written_alike + not_alike]
    monkeypatch.setattr(dedup, "orjson", None)
    assert [dedup.canonical_json(body) for body in written_alike + not_alike] == keys


# -- the mixture report: one loss fraction of what was read, the sources' warnings, eval, padding saved -------


def _stats(out: Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["stats", str(out), "--json"])
    assert result.exit_code == 0, result.stderr
    return dict(json.loads(result.stdout))


def _with_long(sources: dict[str, Path], tmp_path: Path) -> Path:
    """The short source with 4 records over --max-len 1024 appended: a loss the mix cannot hide."""
    lines = sources["short"].read_text().splitlines()
    long = [
        json.dumps({"messages": [{"role": "user", "content": "w " * 1500}, {"role": "assistant", "content": "ok"}]})
    ]
    path = tmp_path / "short_and_long.jsonl"
    path.write_text("\n".join(lines + long * 4) + "\n")
    return path


def test_lost_tokens_are_a_fraction_of_every_token_read_whatever_the_mix_keeps(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    data = _with_long(sources, tmp_path)
    mixed = run(pack, sources, tmp_path / "m", "--mix", f"{data}=0.9", "--mix", f"{sources['long']}=0.1")
    alone = run(pack, sources, tmp_path / "a", data, sources["long"])
    lost = mixed["lost"]
    assert lost["tokens"] == alone["lost"]["tokens"] > 0 and lost["records"] == alone["lost"]["records"] == 4
    # the same inputs read, the same tokens lost: the same fraction, though the mix packs a fraction of them
    assert lost["tokens_fraction"] == alone["lost"]["tokens_fraction"]
    assert lost["records_fraction"] == round(4 / mixed["records_read"], 6)
    assert mixed["tokens"] < alone["tokens"] / 2
    # throughput is of what was read (tokenized or from the cache), not of the mixed output
    read = alone["tokens"] + lost["tokens"]
    assert mixed["tokens_per_second"] == pytest.approx(read / mixed["seconds"]["total"], rel=0.01)


def test_a_share_that_leaves_most_of_its_source_out_or_repeats_it_is_a_warning(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    short, long = sources["short"], sources["long"]
    left = run(pack, sources, tmp_path / "left", "--mix", f"{short}=0.9", "--mix", f"{long}=0.1")
    words = [w for w in left["warnings"] if w.startswith(f"--mix {short}: the shares leave out ")]
    assert len(words) == 0  # the short source is the scarce one: used whole
    words = [w for w in left["warnings"] if w.startswith(f"--mix {long}: the shares leave out ")]
    assert len(words) == 1 and "give this source as Nx (1x keeps all of it)" in words[0]
    left_out = left["mix"]["sources"][1]["left_out"]["records"]
    assert f"({left_out:,} of {left['mix']['sources'][1]['available']['records']:,} records)" in words[0]
    repeated = run(pack, sources, tmp_path / "rep", "--mix", f"{short}=2x", "--mix", f"{long}=0.9")
    epochs = repeated["mix"]["sources"][1]["epochs"]
    assert epochs > 1
    words = [w for w in repeated["warnings"] if w.startswith(f"--mix {long}: the shares repeat this source ")]
    assert len(words) == 1 and f"{epochs:.2f} times" in words[0]


def test_a_share_over_mix_max_epochs_is_refused_unless_allowed(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    recipe = ["--mix", f"{sources['short']}=4x", "--mix", f"{sources['long']}=0.9"]
    result = run(pack, sources, tmp_path / "no", *recipe, expect=2)
    line = one_error_line(result)
    assert line.startswith(f"Error: --mix {sources['long']}: the shares repeat this source ")
    assert "more than --mix-max-epochs 10; lower its share, give it as Nx, or raise --mix-max-epochs" in line
    assert not (tmp_path / "no").exists()
    allowed = run(pack, sources, tmp_path / "yes", *recipe, "--mix-max-epochs", "1000")
    assert allowed["mix"]["sources"][1]["epochs"] > 10
    assert verify_output(tmp_path / "yes").ok


def test_the_eval_split_is_in_the_table_and_stats_and_a_warning_when_it_outweighs_training(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    recipe = ["--mix", f"{sources['short']}=0.9", "--mix", f"{sources['long']}=0.1", "--eval-fraction", "0.3"]
    summary = run(pack, sources, out, *recipe)
    held = summary["eval"]
    assert held["tokens"] > summary["tokens"]
    assert f"the eval split holds more tokens ({held['tokens']:,}) than the training rows ({summary['tokens']:,})" in (
        " ".join(summary["warnings"])
    )
    table = pack(*recipe, "--max-len", "1024", "-o", tmp_path / "again", "--cache-dir", sources["cache"])
    assert f"{held['records']:,} records, {held['tokens']:,} tokens, {held['rows']:,} rows" in table.stderr
    stats = _stats(out)
    assert stats["eval"]["tokens"] == held["tokens"] and stats["eval"]["rows"] == held["rows"]


def test_pack_and_stats_give_one_padding_saved_with_repeats(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    summary = run(pack, sources, out, "--mix", f"{sources['short']}=3x", "--mix", f"{sources['long']}=0.2")
    assert summary["mix"]["repeats"] > 0
    stats = _stats(out)
    saved = summary["padding_tokens_without_packing"] - summary["padding_tokens"]
    assert stats["padding_saved"] == saved
    assert stats["rows_without_packing"] == summary["rows_without_packing"] == stats["sequences"]
