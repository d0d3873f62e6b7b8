"""The eval split (--eval-fraction, --eval-records): whole records held out per source into OUT/eval/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from packcli.config import PackConfig
from packcli.errors import InputError
from packcli.plan.holdout import split_counts
from packcli.report.verify import verify_output
from packcli.run.options import holdout_options

from .conftest import make_conversations, one_error_line, read_rows, write_jsonl


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """30 short conversations, 11 long ones, and a cache shared by the module's runs."""
    root = tmp_path_factory.mktemp("eval")
    short = [{"messages": m} for m in make_conversations(30, seed=1, max_turns=2, max_words=15)]
    long = [{"messages": m} for m in make_conversations(11, seed=2, max_turns=4, max_words=80)]
    return {
        "short": write_jsonl(root / "short.jsonl", short),
        "long": write_jsonl(root / "long.jsonl", long),
        "cache": root / "cache",
    }


def run(
    pack: Any, sources: dict[str, Path], out: Path, *args: Any, expect: int = 0, max_len: int = 1024, cache: Any = None
) -> Any:
    cache = cache or sources["cache"]
    result = pack(*args, "--max-len", max_len, "-o", out, "--cache-dir", cache, "--json", "-q", expect=expect)
    return json.loads(result.stdout) if expect == 0 else result


def indices(out: Path) -> list[tuple[int, int]]:
    """(sample_index, piece_index) of every sample in the shards of ``out``."""
    return [
        (i, p) for row in read_rows(out) for i, p in zip(row["sample_index"], row["piece_index"], strict=True) if i >= 0
    ]


def test_eval_and_train_are_disjoint_whole_and_counted_per_source(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    summary = run(pack, sources, out, sources["short"], sources["long"], "--eval-fraction", "0.2")
    train = {i for i, _ in indices(out)}
    held = {i for i, _ in indices(out / "eval")}
    assert not train & held and train | held == set(range(41))
    # round(0.2 * 30) = 6, round(0.2 * 11) = 2; the inputs are read in order of their names: long is
    # sample_index 0..10, short 11..40
    ev = summary["eval"]
    assert ev["by_source"] == {str(sources["short"]): 6, str(sources["long"]): 2} and ev["records"] == 8
    assert len({i for i in held if i >= 11}) == 6 and len({i for i in held if i < 11}) == 2
    assert summary["records_read"] == summary["packed"] + sum(summary["dropped"].values()) + ev["records"]
    assert summary["packed"] == len(train) == 33 and ev["samples"] == len(held)
    eval_manifest = json.loads((out / "eval" / "manifest.json").read_text())
    main_manifest = json.loads((out / "manifest.json").read_text())
    assert set(eval_manifest) == set(main_manifest) - {"eval"}  # a full manifest, same keys
    assert eval_manifest["counts"]["records_read"] == eval_manifest["counts"]["packed"] == 8
    assert main_manifest["eval"] == ev and eval_manifest["tokens"] == ev["tokens"]
    assert verify_output(out).ok and verify_output(out / "eval").ok


def test_split_pieces_stay_on_one_side(pack: Any, sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = run(
        pack,
        sources,
        out,
        sources["short"],
        sources["long"],
        "--overflow",
        "split",
        "--eval-fraction",
        "0.3",
        max_len=256,
    )
    train, held = indices(out), indices(out / "eval")
    assert not {i for i, _ in train} & {i for i, _ in held}
    pieced = {i for i, p in held if p > 0}
    assert pieced, "the eval split should hold a split record"
    assert summary["eval"]["samples"] == len(held) > summary["eval"]["records"] == len({i for i, _ in held})
    assert verify_output(out / "eval").ok


def test_same_seed_same_bytes_other_seed_other_records_and_a_cache_hit(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    inputs = [sources["long"], sources["short"]]
    own = {"cache": tmp_path / "cache"}  # this test's own cache entry
    plain = run(pack, sources, tmp_path / "plain", *inputs, **own)
    first = run(pack, sources, tmp_path / "a", *inputs, "--eval-fraction", "0.25", "--seed", "1", **own)
    again = run(pack, sources, tmp_path / "b", *inputs, "--eval-fraction", "0.25", "--seed", "1", **own)
    assert plain["cache"] == "miss" and first["cache"] == again["cache"] == "hit"
    assert first["stage_seconds"]["tokenize"] == 0.0
    for sub in ("", "eval"):
        files = sorted(p.name for p in (tmp_path / "a" / sub).iterdir() if p.is_file())
        assert files == sorted(p.name for p in (tmp_path / "b" / sub).iterdir() if p.is_file())
        shards = [f for f in files if f.startswith("shard-")]
        assert shards and all(
            (tmp_path / "a" / sub / f).read_bytes() == (tmp_path / "b" / sub / f).read_bytes() for f in shards
        )
    other = run(pack, sources, tmp_path / "c", *inputs, "--eval-fraction", "0.25", "--seed", "2", **own)
    held = [{i for i, _ in indices(tmp_path / x / "eval")} for x in ("a", "c")]
    assert held[0] != held[1] and len(held[0]) == len(held[1]) and other["cache"] == "hit"


def test_eval_records_are_shared_in_proportion_and_held_out_before_the_mix(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    mix = ["--mix", f"{sources['short']}=0.5", "--mix", f"{sources['long']}=0.5"]
    summary = run(pack, sources, out, *mix, "--eval-records", "5")
    # 5 * 30/41 = 3.66 and 5 * 11/41 = 1.34: 3 and 1, the record left over to the larger fraction
    assert summary["eval"]["by_source"] == {f"{sources['short']}": 4, f"{sources['long']}": 1}
    left_out = summary["mix"]["records_left_out"]
    assert summary["records_read"] == summary["packed"] + sum(summary["dropped"].values()) + left_out + 5
    # the mix is of the training records only: the long source has 10 left
    assert summary["mix"]["sources"][1]["available"]["records"] == 10
    train = {i for i, _ in indices(out)}
    held = {i for i, _ in indices(out / "eval")}
    assert not train & held and len(held) == 5
    # The eval rows carry the source column as the training rows do: the eval loss per source.
    eval_rows = pq.read_table(next((out / "eval").glob("shard-*"))).to_pylist()
    by_source = {i: s for row in eval_rows for i, s in zip(row["sample_index"], row["source"], strict=True)}
    starts = {0: 0, 1: 0}
    for m, entry in enumerate(summary["mix"]["sources"]):
        for first, end in entry["sample_index"]:
            starts[m] += sum(first <= i < end for i in by_source)
            assert all(by_source[i] == m for i in by_source if first <= i < end)
    assert starts == {0: 4, 1: 1}
    eval_manifest = json.loads((out / "eval" / "manifest.json").read_text())
    assert [s["name"] for s in eval_manifest["mix"]["sources"]] == [s["name"] for s in summary["mix"]["sources"]]
    assert verify_output(out).ok and verify_output(out / "eval").ok
    # verify checks the eval's source column against its manifest: a wrong source is caught
    eval_manifest["mix"]["sources"].reverse()
    (out / "eval" / "manifest.json").write_text(json.dumps(eval_manifest))
    assert not verify_output(out / "eval").ok


def test_the_split_rule_per_source() -> None:
    def counts(have: list[int], **option: Any) -> list[int]:
        return split_counts(holdout_options(PackConfig(inputs=("x",), **option)), have)

    assert counts([1, 2, 3, 5, 100], eval_fraction=0.5) == [0, 1, 2, 3, 50]  # halves up; never all
    assert counts([2, 40], eval_fraction=0.01) == [1, 1]  # at least one from a source of 2 or more
    assert counts([3, 3, 3], eval_records=2) == [1, 1, 0]  # ties to the earlier source
    assert counts([1, 9], eval_records=8) == [0, 8]  # a source of one keeps it: its share goes to the other
    with pytest.raises(InputError, match="at most 8 can be held out"):
        counts([1, 9], eval_records=9)


def test_overwrite_replaces_eval_and_a_run_without_eval_removes_it(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run(pack, sources, out, sources["short"], "--eval-fraction", "0.5")
    first = {i for i, _ in indices(out / "eval")}
    run(pack, sources, out, sources["short"], "--eval-fraction", "0.1", "--overwrite")
    assert len({i for i, _ in indices(out / "eval")}) == 3 < len(first) == 15
    (out / "eval" / "notes.txt").write_text("mine")
    refused = run(pack, sources, out, sources["short"], "--overwrite", expect=2)
    assert "eval/notes.txt" in one_error_line(refused) and (out / "eval" / "notes.txt").exists()
    (out / "eval" / "notes.txt").unlink()
    summary = run(pack, sources, out, sources["short"], "--overwrite")
    assert "eval" not in summary and not (out / "eval").exists() and summary["packed"] == 30
    assert "eval" not in json.loads((out / "manifest.json").read_text())


def test_verify_fails_on_a_tampered_eval_shard(pack: Any, sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(pack, sources, out, sources["short"], "--eval-records", "4")
    shard = next((out / "eval").glob("shard-*"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert verify_output(out).ok and not verify_output(out / "eval").ok


def test_refusals_are_one_line_and_a_dry_run_writes_nothing(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    both = run(pack, sources, out, sources["short"], "--eval-fraction", "0.1", "--eval-records", "2", expect=2)
    assert "both given" in one_error_line(both)
    for bad in ("0", "1", "1.5"):
        assert "--eval-fraction" in one_error_line(
            run(pack, sources, out, sources["short"], "--eval-fraction", bad, expect=2)
        )
    assert "--eval-records" in one_error_line(
        run(pack, sources, out, sources["short"], "--eval-records", "0", expect=2)
    )
    too_many = run(pack, sources, out, sources["short"], "--eval-records", "30", expect=1)
    assert "at most 29 can be held out" in one_error_line(too_many)
    ray = run(pack, sources, out, sources["short"], "--eval-records", "3", "--engine", "ray", expect=2)
    assert "--engine local only" in one_error_line(ray)
    pairs = run(pack, sources, out, sources["short"], "--eval-records", "3", "--task", "preference", expect=2)
    assert "preference and KTO" in one_error_line(pairs)
    few = run(pack, sources, out, sources["short"], "--eval-records", "1", "--world-size", "2", expect=1)
    assert one_error_line(few).startswith("Error: the eval split (1 record): no sample left to pack")
    assert not out.exists()
    dry = run(pack, sources, out, sources["short"], "--eval-records", "3", "--dry-run")
    assert dry["eval"]["records"] == 3 and dry["packed"] == 27 and not out.exists()


def test_the_library_takes_the_eval_options(sources: dict[str, Path], tmp_path: Path) -> None:
    import packcli

    result = packcli.pack(
        sources["short"], 1024, tmp_path / "out", eval_fraction=0.2, cache_dir=sources["cache"], num_proc=1
    )
    assert result.summary["eval"]["records"] == 6 and packcli.verify(tmp_path / "out" / "eval").ok
    with pytest.raises(packcli.UsageError, match="both given"):
        packcli.pack(sources["short"], output=tmp_path / "o2", eval_fraction=0.2, eval_records=3)


def test_duplicates_reach_neither_side_and_stats_reads_the_eval_output(
    pack: Any, sources: dict[str, Path], tmp_path: Path
) -> None:
    from packcli.report.stats import output_stats

    records = [{"messages": m} for m in make_conversations(20, seed=5, max_turns=2, max_words=12)]
    data = write_jsonl(tmp_path / "dup.jsonl", records + records[:5])  # 20..24 repeat 0..4
    out = tmp_path / "out"
    summary = run(pack, sources, out, data, "--dedup", "exact", "--eval-fraction", "0.25")
    train = {i for i, _ in indices(out)}
    held = {i for i, _ in indices(out / "eval")}
    assert summary["dropped"] == {"duplicate": 5} and summary["eval"]["records"] == 5  # round(0.25 * 20)
    assert not train & held and train | held == set(range(20))
    stats = output_stats(out / "eval")
    assert stats["rows"] == summary["eval"]["rows"] and stats["records"] == 5
    assert stats["tokens"] == summary["eval"]["tokens"]
