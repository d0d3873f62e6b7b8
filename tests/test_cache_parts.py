"""Cache parts: each input tokenized once, reused by runs that add inputs, swap mixture sources or resume.

The store a run assembles from parts must equal, byte for byte in its shards and rejects, the store a
cold run makes; what was reused and what was tokenized is in the summary (``cache_parts``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import packcli
from packcli.contract import file_sha256
from packcli.store import parts

from .conftest import make_conversations, write_jsonl

SMALL_PARTS = 512  # records per part in these tests (two batches of 256)


@pytest.fixture(autouse=True)
def _small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts, "PART_RECORDS", SMALL_PARTS)


def chats(n: int, seed: int) -> list[dict[str, Any]]:
    return [{"messages": m} for m in make_conversations(n, seed=seed, max_turns=2, max_words=12)]


def shards(out: Path) -> dict[str, str]:
    found = {p.name: file_sha256(p) for p in sorted(out.glob("shard-*.parquet"))}
    assert found
    return found


def run(pack: Any, out: Path, *args: Any, cache: Path) -> dict[str, Any]:
    result = pack(*args, "--max-len", "512", "-o", out, "--cache-dir", cache, "--json", "-q")
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


def test_a_store_of_many_parts_writes_what_one_part_writes(
    pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two inputs, the first with bad lines (rejects numbered across parts and inputs) and --fix-turns changes.
    records = chats(1300, seed=1)
    lines = [json.dumps(r) for r in records]
    lines[700] = "{not json"  # in the second part of the first input
    lines[1100] = json.dumps({"messages": [{"role": "user", "content": "a question"}]})  # no answer
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join(lines) + "\n")
    second = write_jsonl(tmp_path / "second.jsonl", chats(700, seed=2))
    outs = {}
    for name, size in (("one", 1 << 20), ("many", SMALL_PARTS)):
        monkeypatch.setattr(parts, "PART_RECORDS", size)
        out = tmp_path / name
        summary = run(
            pack, out, first, second, "--on-error", "skip", "--rejects", tmp_path / f"{name}.rejects.jsonl",
            cache=tmp_path / f"cache-{name}",
        )  # fmt: skip
        outs[name] = (out, summary)
    (one, one_summary), (many, many_summary) = outs["one"], outs["many"]
    assert shards(one) == shards(many)
    rejected = (tmp_path / "one.rejects.jsonl").read_text()
    assert rejected == (tmp_path / "many.rejects.jsonl").read_text()
    assert [json.loads(line)["sample_index"] for line in rejected.splitlines()] == [700, 1100]
    assert all(json.loads(line)["source"] == str(first) for line in rejected.splitlines())
    for key in ("records_read", "packed", "dropped", "tokens", "trainable_tokens", "rows"):
        assert one_summary[key] == many_summary[key], key
    assert one_summary["cache_parts"] == {
        "parts_reused": 0, "parts_made": 2, "records_reused": 0, "records_tokenized": 2000,
    }  # fmt: skip
    # 1300 records in parts of 512 (3), 700 in 2
    assert many_summary["cache_parts"]["parts_made"] == 5


def test_an_added_input_is_the_only_one_tokenized(pack: Any, tmp_path: Path) -> None:
    files = [write_jsonl(tmp_path / f"in{k}.jsonl", chats(300, seed=10 + k)) for k in range(5)]
    cache = tmp_path / "cache"
    first = run(pack, tmp_path / "a", *files[:2], *files[3:], cache=cache)
    assert first["cache_parts"]["records_tokenized"] == 1200
    # The new input goes in the middle: the inputs after it move on by its records.
    second = run(pack, tmp_path / "b", *files, cache=cache)
    assert second["cache"] == "miss"
    assert second["cache_parts"] == {
        "parts_reused": 4, "parts_made": 1, "records_reused": 1200, "records_tokenized": 300,
    }  # fmt: skip
    cold = run(pack, tmp_path / "cold", *files, cache=tmp_path / "cold-cache")
    assert shards(tmp_path / "b") == shards(tmp_path / "cold")
    timing = ("cache_parts", "seconds", "stage_seconds", "tokens_per_second", "output")
    assert {k: v for k, v in second.items() if k not in timing} == {k: v for k, v in cold.items() if k not in timing}
    third = run(pack, tmp_path / "c", *files, cache=cache)
    assert third["cache"] == "hit" and "cache_parts" not in third


def test_a_swapped_mix_source_is_the_only_one_tokenized(pack: Any, tmp_path: Path) -> None:
    a, b, c = (write_jsonl(tmp_path / f"{n}.jsonl", chats(400, seed=s)) for n, s in (("a", 1), ("b", 2), ("c", 3)))
    cache = tmp_path / "cache"
    run(pack, tmp_path / "ab", "--mix", f"{a}=0.5", "--mix", f"{b}=0.5", cache=cache)
    swapped = run(pack, tmp_path / "ac", "--mix", f"{a}=0.5", "--mix", f"{c}=0.5", cache=cache)
    assert swapped["cache_parts"]["records_reused"] == 400 and swapped["cache_parts"]["records_tokenized"] == 400
    run(pack, tmp_path / "cold", "--mix", f"{a}=0.5", "--mix", f"{c}=0.5", cache=tmp_path / "cold-cache")
    assert shards(tmp_path / "ac") == shards(tmp_path / "cold")


def test_a_damaged_part_is_made_again_and_the_others_reused(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", chats(1200, seed=5))
    cache = tmp_path / "cache"
    first = run(pack, tmp_path / "a", data, cache=cache)
    assert first["cache_parts"]["parts_made"] == 3
    metas = {p: json.loads((p / "meta.json").read_text()) for p in cache.iterdir() if (p / "meta.json").exists()}
    (entry,) = [p for p, m in metas.items() if "part" not in m]
    (second,) = [p for p, m in metas.items() if m.get("part", {}).get("index") == 1]
    os.truncate(second / "labels.bin", 4)  # the entry's segment too: a hard link
    result = run(pack, tmp_path / "b", data, cache=cache)
    assert result["cache"] == "rebuilt" and len(result["warnings"]) == 2
    assert result["warnings"][1].startswith(f"the cache part of {data} is damaged ({second}/labels.bin: has 4 bytes")
    assert result["cache_parts"] == {
        "parts_reused": 2, "parts_made": 1, "records_reused": 688, "records_tokenized": 512,
    }  # fmt: skip  # each part is keyed by the bytes through its end: the part after it is found
    assert shards(tmp_path / "b") == shards(tmp_path / "a")
    assert entry.is_dir()


# A pack in a child process, with parts of SMALL_PARTS records, killed (SIGKILL) at a chosen point:
# after the Nth batch is stored, after the Nth part is committed, or while the entry is assembled.
KILLED = f"""
import os, signal, sys
from packcli.store import parts
from packcli.tokenize.batches import building
parts.PART_RECORDS = {SMALL_PARTS}
point, nth = sys.argv[1], int(sys.argv[2])
seen = [0]

def counted(real):
    def call(*args, **kwargs):
        out = real(*args, **kwargs)
        seen[0] += 1
        if seen[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    return call

if point == "batch":
    building.StoreBuilder.take = counted(building.StoreBuilder.take)
elif point == "part":
    building.StoreBuilder.finish = counted(building.StoreBuilder.finish)
else:
    real_add = parts._add_part
    parts._add_part = counted(real_add)
from packcli.cli import main
main(sys.argv[3:])
"""


@pytest.mark.parametrize(
    ("point", "nth", "reused"),
    [
        ("batch", 3, 512),  # in the second part: the first is kept
        ("batch", 1, 0),  # in the first part: nothing is kept
        ("part", 2, 1024),  # after the second of four parts
        ("part", 4, 1800),  # after the last part, before the entry is assembled
        ("assemble", 2, 1800),  # while the entry is assembled: every part is kept
    ],
)
def test_a_killed_pack_resumes_from_its_finished_parts(
    point: str, nth: int, reused: int, pack: Any, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", chats(1800, seed=7))
    cache = tmp_path / "cache"
    argv = ["pack", str(data), "--max-len", "512", "-o", str(tmp_path / "killed"), "--cache-dir", str(cache)]
    env = {**os.environ, "PYTHONPATH": str(Path(packcli.__file__).parents[1])}
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, point, str(nth), *argv, "--num-proc", "1", "-q"],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    assert not (tmp_path / "killed").exists()
    resumed = run(pack, tmp_path / "resumed", data, cache=cache)
    assert resumed["cache"] == "miss" and resumed["cache_parts"]["records_reused"] == reused
    assert resumed["cache_parts"]["records_tokenized"] == 1800 - reused
    run(pack, tmp_path / "cold", data, cache=tmp_path / "cold-cache")
    assert shards(tmp_path / "resumed") == shards(tmp_path / "cold")
    # nothing half made is left: no temporary directory, every part and entry whole
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]


# A pack in a child process that stops after committing its first part, until told to go on.
PAUSED = f"""
import os
import sys
from packcli.store import parts
from packcli.tokenize.batches import building
parts.PART_RECORDS = {SMALL_PARTS}
real = building.StoreBuilder.finish
def finish(self, *args, **kwargs):
    out = real(self, *args, **kwargs)
    os.write(1, ("committed " + out.path.name + "\\n").encode())  # fd 1: pack redirects sys.stdout
    sys.stdin.readline()
    return out
building.StoreBuilder.finish = finish
from packcli.cli import main
main(sys.argv[1:])
"""


def test_prune_never_removes_a_part_a_running_pack_holds(pack: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    data = write_jsonl(tmp_path / "d.jsonl", chats(1100, seed=9))
    cache = tmp_path / "cache"
    argv = ["pack", str(data), "--max-len", "512", "-o", str(tmp_path / "out"), "--cache-dir", str(cache)]
    env = {**os.environ, "PYTHONPATH": str(Path(packcli.__file__).parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSED, *argv, "--num-proc", "1", "--json", "-q"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        first = child.stdout.readline().split()[1]
        pruned = json.loads(
            CliRunner().invoke(app, ["cache", "prune", "--max-size", "0", "--json", "--cache-dir", str(cache)]).stdout
        )
        assert pruned["in_use"] == [first] and (cache / first / "meta.json").exists()
        for _ in range(2):  # the two other parts
            child.stdin.write("\n")
            child.stdin.flush()
            child.stdout.readline()
        child.stdin.write("\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=120)
    finally:
        child.kill()
    summary = json.loads(out)
    assert summary["cache_parts"]["parts_made"] == 3 and summary["records_read"] == 1100
    run(pack, tmp_path / "cold", data, cache=tmp_path / "cold-cache")
    assert shards(tmp_path / "out") == shards(tmp_path / "cold")


def test_dedup_and_the_eval_split_work_across_reused_parts(pack: Any, tmp_path: Path) -> None:
    """--dedup exact finds a record's copy in another input whose parts were reused, and the eval split
    holds out the same records, as in a cold run."""
    a_records = chats(700, seed=21)
    a = write_jsonl(tmp_path / "a.jsonl", a_records)
    b = write_jsonl(tmp_path / "b.jsonl", chats(300, seed=22) + a_records[100:160])  # 60 copies of a's records
    cache = tmp_path / "cache"
    run(pack, tmp_path / "first", a, cache=cache)  # a's parts made
    flags = ("--dedup", "exact", "--eval-fraction", "0.1", "--seed", "3")
    again = run(pack, tmp_path / "again", a, b, *flags, cache=cache)
    cold = run(pack, tmp_path / "cold", a, b, *flags, cache=tmp_path / "cold-cache")
    assert again["cache_parts"]["records_reused"] == 700 and again["cache_parts"]["records_tokenized"] == 360
    assert again["dedup"] == cold["dedup"] and again["dedup"]["duplicates"] == 60
    assert again["eval"] == cold["eval"] and again["eval"]["records"] > 0
    assert shards(tmp_path / "again") == shards(tmp_path / "cold")
    assert shards(tmp_path / "again" / "eval") == shards(tmp_path / "cold" / "eval")


def _lines(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_a_file_that_grew_keeps_its_parts_before_the_end(pack: Any, tmp_path: Path) -> None:
    # Each part of a JSON lines file is keyed by the bytes through its end: records appended leave the
    # parts before the last one as they were.
    data = tmp_path / "grows.jsonl"
    data.write_text(_lines(chats(1300, seed=7)))  # parts of 512, 512 and 276 records
    cache = tmp_path / "cache"
    first = run(pack, tmp_path / "a", data, cache=cache)
    assert first["cache_parts"]["parts_made"] == 3
    with open(data, "a", encoding="utf-8") as fh:
        fh.write("\n" + _lines(chats(400, seed=8)))  # a blank line too: it is in the last part's bytes
    grown = run(pack, tmp_path / "b", data, cache=cache)
    assert grown["cache"] == "miss"
    assert grown["cache_parts"] == {
        "parts_reused": 2, "parts_made": 2, "records_reused": 1024, "records_tokenized": 676,
    }  # fmt: skip  # the last part had 276 records: with the 400 appended, 512 and 164
    run(pack, tmp_path / "cold", data, "--no-cache", cache=cache)
    assert shards(tmp_path / "b") == shards(tmp_path / "cold")


def test_an_edit_keeps_the_parts_before_it(pack: Any, tmp_path: Path) -> None:
    records = chats(1600, seed=9)
    data = tmp_path / "edited.jsonl"
    data.write_text(_lines(records))
    cache = tmp_path / "cache"
    assert run(pack, tmp_path / "a", data, cache=cache)["cache_parts"]["parts_made"] == 4
    records[700] = {"messages": [{"role": "user", "content": "changed"}, {"role": "assistant", "content": "so it is"}]}
    data.write_text(_lines(records))  # in the second part: the first is the same, the ones after it not
    edited = run(pack, tmp_path / "b", data, cache=cache)
    assert edited["cache_parts"] == {
        "parts_reused": 1, "parts_made": 3, "records_reused": 512, "records_tokenized": 1088,
    }  # fmt: skip
    run(pack, tmp_path / "cold", data, "--no-cache", cache=cache)
    assert shards(tmp_path / "b") == shards(tmp_path / "cold")


def test_a_copy_of_a_cached_file_finds_its_entry_once_read(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", chats(1100, seed=11))
    cache = tmp_path / "cache"
    run(pack, tmp_path / "a", data, cache=cache)
    copy = tmp_path / "elsewhere" / "copy.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(data.read_bytes())
    # Its hash is not known by its path and stamp: it is read once, and its parts are found as it is
    # read, then the entry of the same contents.
    again = run(pack, tmp_path / "b", copy, cache=cache)
    assert again["cache"] == "hit" and again["warnings"] == []
    assert shards(tmp_path / "b") == shards(tmp_path / "a")


def test_copies_and_files_that_begin_alike_share_their_parts(pack: Any, tmp_path: Path) -> None:
    # Parts of the same bytes are one cache part, whatever file they are in; two files that begin
    # alike share the parts of what they share, and nothing else.
    base = chats(1100, seed=12)
    one = tmp_path / "one.jsonl"
    one.write_text(_lines(base))
    copy = tmp_path / "one-copy.jsonl"
    copy.write_text(_lines(base))
    other = tmp_path / "other.jsonl"
    other.write_text(_lines(base[:600] + chats(300, seed=13)))
    cache = tmp_path / "cache"
    inputs = (one, copy, other)
    first = run(pack, tmp_path / "a", *inputs, cache=cache)
    run(pack, tmp_path / "cold", *inputs, "--no-cache", cache=cache)
    assert shards(tmp_path / "a") == shards(tmp_path / "cold")
    assert first["records_read"] == 2 * 1100 + 900
    stores = [json.loads((p / "meta.json").read_text()) for p in cache.iterdir() if (p / "meta.json").exists()]
    # The entry; one's three parts (512, 512, 76 records), the copy's the same; other's second (88 + 300).
    assert sorted(m["part"]["records"] for m in stores if "part" in m) == [76, 388, 512, 512]
    assert sum("part" not in m for m in stores) == 1


def _write(path: Path, records: list[dict[str, Any]], row_group: int = 300) -> Path:
    """``records`` in a file of the kind its name says (Parquet in row groups of ``row_group`` records)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if path.suffix == ".json":
        path.write_text(json.dumps(records))
        return path
    if path.suffix == ".csv":
        flat = [{"prompt": r["messages"][0]["content"], "completion": r["messages"][1]["content"]} for r in records]
        pacsv.write_csv(pa.Table.from_pylist(flat), path)
        return path
    table = pa.Table.from_pylist(records)
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=row_group)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=row_group)
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".arrow", ".json"])
def test_a_parquet_csv_arrow_or_json_input_in_parts_writes_what_one_part_writes(
    pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    # Cut into parts by its records as it is read (their hash through each part keys it): the same shards
    # as one part, and a rerun finds every part by the file's stamp, or by its records once read.
    data = _write(tmp_path / f"d{suffix}", chats(1300, seed=6))
    outs = {}
    for name, size in (("one", 1 << 20), ("many", SMALL_PARTS)):
        monkeypatch.setattr(parts, "PART_RECORDS", size)
        outs[name] = run(pack, tmp_path / name, data, cache=tmp_path / f"cache-{name}")
    assert shards(tmp_path / "one") == shards(tmp_path / "many")
    assert outs["one"]["cache_parts"]["parts_made"] == 1
    assert outs["many"]["cache_parts"]["parts_made"] >= 3  # 1300 records in parts of at least 512
    assert outs["many"]["records_read"] == outs["one"]["records_read"] == 1300
    cache = tmp_path / "cache-many"
    (cache / "input-hashes.json").unlink()  # the memo lost, and the entry: the parts found once read
    for entry in cache.iterdir():
        if (entry / "meta.json").exists() and "part" not in json.loads((entry / "meta.json").read_text()):
            shutil.rmtree(entry)
    again = run(pack, tmp_path / "again", data, cache=tmp_path / "cache-many")
    assert again["cache_parts"]["records_tokenized"] == 0
    assert shards(tmp_path / "again") == shards(tmp_path / "one")


def test_a_parquet_file_written_again_with_more_records_keeps_its_parts(pack: Any, tmp_path: Path) -> None:
    # Other bytes (other row groups), the same first records: the parts of those are found by their records.
    records = chats(1600, seed=7)
    data = _write(tmp_path / "d.parquet", records[:1200], row_group=300)
    cache = tmp_path / "cache"
    first = run(pack, tmp_path / "a", data, cache=cache)
    assert first["cache_parts"]["records_tokenized"] == 1200
    _write(data, records, row_group=700)
    grown = run(pack, tmp_path / "b", data, cache=cache)
    assert grown["cache_parts"] == {
        "parts_reused": 2, "parts_made": 2, "records_reused": 1024, "records_tokenized": 576,
    }  # fmt: skip  # parts of 512: the third part of the first file ended with it, at 1200
    run(pack, tmp_path / "cold", data, cache=tmp_path / "cold-cache")
    assert shards(tmp_path / "b") == shards(tmp_path / "cold")
