"""How often a run reads each input: the bytes read from the file, counted as the operating system hands
them over, on a cache miss, on a rerun that knows the file and on a hit.

Every read of an input by packcli's own code (the sniff, the hash, the record count, the tokenizing, the
check that it did not change) opens it with ``open``; the test counts what those opens read.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from packcli.io import fingerprint
from packcli.io.sources import InputSource
from packcli.owned import HASH_MEMO

from .conftest import make_conversations, write_jsonl

SNIFF_BLOCK = 1 << 18  # the most the sniff may read: the first blocks, to its first 50 records
INPUTS = (".jsonl", ".json", ".csv", ".parquet", ".arrow")  # the files whose reads are counted


class _CountingRaw(io.RawIOBase):
    """A raw file that adds the bytes it reads to a counter."""

    def __init__(self, path: str, counts: Counter[str]) -> None:
        self._file = io.FileIO(path, "rb")
        self._path = path
        self._counts = counts

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def fileno(self) -> int:
        return self._file.fileno()

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer) or 0
        self._counts[self._path] += n
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Count the bytes read through ``open`` from each file opened for reading in binary, by real path."""
    counts: Counter[str] = Counter()
    real_open = builtins.open

    def counting_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, os.PathLike)) and mode in ("rb", "br") and not args:
            path = os.path.realpath(file)
            if path.endswith(INPUTS) and not kwargs:
                return io.BufferedReader(_CountingRaw(path, counts), buffer_size=1 << 16)
            if path.endswith(INPUTS) and kwargs == {"buffering": 0}:  # a reader that seeks (Parquet, Arrow)
                return _CountingRaw(path, counts)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    yield counts


def _input(tmp_path: Path, n: int) -> Path:
    records = [{"messages": m} for m in make_conversations(n, seed=3, max_turns=2, max_words=40)]
    return write_jsonl(tmp_path / "data.jsonl", records)


def _summary(pack: Any, *args: Any) -> dict[str, Any]:
    *data, out = [a for a in args if not isinstance(a, str)]
    flags = [a for a in args if isinstance(a, str)]
    result = pack(*data, "--max-len", "512", "-o", out, "--overwrite", "--json", "-q", *flags)
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


@pytest.mark.parametrize("parts", [True, False], ids=["cache-parts", "one-store"])
def test_each_input_is_read_once_on_a_miss_and_not_at_all_on_a_hit(
    pack: Any, tmp_path: Path, bytes_read: Counter[str], parts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file written in the last two seconds is hashed again by every run (a later write in the same
    # clock tick could keep its stamp): this one is taken as older, so that it is remembered.
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    data = _input(tmp_path, 3000)
    size = data.stat().st_size
    assert size > 4 * SNIFF_BLOCK  # so that a whole read stands out from the sniff's block
    path = os.path.realpath(data)
    # One store (no parts): --limit larger than the input, which makes the run tokenize one whole store.
    extra = () if parts else ("--limit", "1000000")

    miss = _summary(pack, data, tmp_path / "out1", *extra)
    assert miss["cache"] == "miss"
    # The sniff's first block, and one read that hashes the file as it tokenizes it (into cache parts, or
    # one store): the entry's key is known once it is read.
    assert bytes_read[path] <= size + SNIFF_BLOCK, (bytes_read[path], size)

    bytes_read.clear()
    hit = _summary(pack, data, tmp_path / "out2", *extra)
    assert hit["cache"] == "hit"
    assert bytes_read[path] == 0  # the file's stamp alone finds the entry: no byte of it is read

    bytes_read.clear()
    again = _summary(pack, data, tmp_path / "out3", *extra, "--train-on", "all")  # other tokens: a miss
    assert again["cache"] == "miss"
    # The file is known by its stamp: its hash, record count and format are remembered; one pass tokenizes it.
    assert bytes_read[path] <= size, (bytes_read[path], size)
    assert again["records_read"] == miss["records_read"] == 3000


def test_an_added_input_is_the_only_one_read_and_a_copy_is_read_once(
    pack: Any, tmp_path: Path, bytes_read: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    known = _input(tmp_path, 2000)
    added = write_jsonl(tmp_path / "added.jsonl", [{"messages": m} for m in make_conversations(1500, seed=4)])
    _summary(pack, known, tmp_path / "out1")
    bytes_read.clear()
    # The memo knows the first file by its stamp: its hash and its parts' ends. Its parts are found
    # without a byte of it read; the added file is read once (and its first block by the sniff).
    both = _summary(pack, known, added, tmp_path / "out2")
    assert both["cache_parts"]["records_reused"] == 2000 and both["cache_parts"]["records_tokenized"] == 1500
    assert bytes_read[os.path.realpath(known)] == 0
    assert bytes_read[os.path.realpath(added)] <= added.stat().st_size + SNIFF_BLOCK
    # A copy: not known by its path; read once, its parts and then its entry found by its contents.
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(known.read_bytes())
    bytes_read.clear()
    again = _summary(pack, copy, tmp_path / "out3")
    assert again["cache"] == "hit"
    assert bytes_read[os.path.realpath(copy)] <= copy.stat().st_size + SNIFF_BLOCK


def _tabular(tmp_path: Path, kind: str, n: int) -> Path:
    """``n`` chats (prompt and completion pairs in CSV) in a file of ``kind``, of incompressible words; a Parquet
    file in row groups of 300 records and pages of 32 KiB (as a sniff reads it: its first pages)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rng = random.Random(kind)

    def words(k: int) -> str:
        return " ".join(
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(k)
        )

    pairs = [(words(rng.randint(5, 60)), words(rng.randint(5, 60))) for _ in range(n)]
    path = tmp_path / f"data.{kind}"
    if kind == "csv":
        pacsv.write_csv(pa.table({"prompt": [p for p, _ in pairs], "completion": [c for _, c in pairs]}), path)
        return path
    records = [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": c}]} for p, c in pairs]
    if kind == "json":
        path.write_text(json.dumps(records))
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=300, data_page_size=1 << 15)
    else:
        table = pa.Table.from_pylist(records)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=500)
    return path


@pytest.mark.parametrize("kind", ["parquet", "csv", "arrow", "json"])
@pytest.mark.parametrize("flags", [(), ("--limit", "1000"), ("--no-cache",)], ids=["cache-parts", "limit", "no-cache"])
def test_a_parquet_csv_arrow_or_json_input_is_read_once_on_a_miss_and_not_at_all_on_a_hit(
    pack: Any,
    tmp_path: Path,
    bytes_read: Counter[str],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    flags: tuple[str, ...],
) -> None:
    # Hashed by the read that tokenizes it (Parquet and Arrow: in file order, the footer read first kept
    # until the hash comes to it), never before: at most its size and the sniff's first block.
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    data = _tabular(tmp_path, kind, 3000)
    size = data.stat().st_size
    assert size > 4 * SNIFF_BLOCK
    path = os.path.realpath(data)
    miss = _summary(pack, data, tmp_path / "out1", *flags)
    assert miss["cache"] == ("off" if "--no-cache" in flags else "miss")
    assert miss["records_read"] == (1000 if "--limit" in flags else 3000)
    assert 0 < bytes_read[path] <= size + SNIFF_BLOCK, (bytes_read[path], size)
    bytes_read.clear()
    again = _summary(pack, data, tmp_path / "out2", *flags)
    if "--no-cache" not in flags:
        assert again["cache"] == "hit"
        # Its stamp finds its hash, format and parts: no record of it is read. Every run reads a Parquet or
        # Arrow file's schema (its footer), to refuse packcli's own shards as inputs.
        assert bytes_read[path] == _schema_bytes(data), (bytes_read[path], _schema_bytes(data))
    assert _shards(tmp_path / "out1") == _shards(tmp_path / "out2")


def _schema_bytes(data: Path) -> int:
    """The bytes of a file's schema that every run reads: a Parquet file's footer and the 8 bytes after it
    (its length and magic), an Arrow file's footer, its length and magic; none of a text file."""
    tail = data.read_bytes()[-10:]
    if data.suffix == ".parquet":
        return 8 + int.from_bytes(tail[2:6], "little")
    if data.suffix == ".arrow":
        return 10 + int.from_bytes(tail[:4], "little")
    return 0


def test_a_json_file_of_json_lines_is_read_once(
    pack: Any, tmp_path: Path, bytes_read: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its first bytes tell that it holds no array: the JSON lines reader goes on from them, not from its start.
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    lines = _input(tmp_path, 3000)
    data = tmp_path / "lines.json"
    data.write_bytes(lines.read_bytes())
    assert data.stat().st_size > 4 * SNIFF_BLOCK
    made = _summary(pack, data, tmp_path / "out1")
    assert made["cache"] == "miss" and made["records_read"] == 3000
    assert bytes_read[os.path.realpath(data)] <= data.stat().st_size + SNIFF_BLOCK
    _summary(pack, lines, tmp_path / "out2", "--no-cache")
    assert _shards(tmp_path / "out1") == _shards(tmp_path / "out2")


def test_the_count_catches_a_second_read(pack: Any, tmp_path: Path, bytes_read: Counter[str]) -> None:
    data = _input(tmp_path, 200)
    with open(data, "rb") as fh:
        while fh.read(1000):
            pass
    with open(data, "rb") as fh:
        fh.read()
    assert bytes_read[os.path.realpath(data)] == 2 * data.stat().st_size


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 22])
def test_the_hash_counts_the_records_as_the_reader_counts_them(tmp_path: Path, chunk: int) -> None:
    # Blank lines of every kind of whitespace, a line of spaces across a chunk's edge, no final newline.
    pieces = [b"\n", b" \n", b"\t \n", b"\r\n", b'{"a": 1}\n', b"  x  \n", b"\x0b\n", b"y", b" ", b"\n\n"]
    rng = random.Random(chunk)
    for case in range(60):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        path = tmp_path / f"{case}.jsonl"
        path.write_bytes(data)
        digest, records = fingerprint._hash_file(path, count_lines=True, chunk_size=chunk)
        assert digest == hashlib.blake2b(data, digest_size=16).hexdigest()
        assert records == sum(1 for line in io.BytesIO(data) if line.strip()), data


def test_a_remembered_format_is_used_only_while_the_file_is_unchanged(
    pack: Any, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    data = _input(tmp_path, 50)
    _summary(pack, data, tmp_path / "out1")
    memo = cache_dir / HASH_MEMO
    entry = json.loads(memo.read_text())[os.path.realpath(data)]
    assert entry["records"] == 50
    assert list(entry["formats"].values()) == ["messages"]
    # The same path with other content (text records): its stamp changed, so it is sniffed again.
    write_jsonl(data, [{"text": f"record {i}"} for i in range(40)])
    again = _summary(pack, data, tmp_path / "out2")
    assert again["cache"] == "miss" and again["records_read"] == 40
    assert list(json.loads(memo.read_text())[os.path.realpath(data)]["formats"].values()) == ["text"]


def test_the_progress_of_a_file_read_for_the_first_time_has_an_estimated_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its records are not counted before it is read: the total is its size times the records a byte of
    # it held so far, and the records at the end. (Parts of 256 records: the first batches are sent
    # while most of the file is not read yet.)
    from packcli.config import PackConfig
    from packcli.run.pipeline import run_pack
    from packcli.store import parts

    monkeypatch.setattr(parts, "PART_RECORDS", 256)
    data = _input(tmp_path, 1500)
    seen: list[tuple[int, int | None]] = []

    def progress(stage: str, advance: int, total: int | None) -> None:
        if stage == "tokenize":
            seen.append((advance, total))

    config = PackConfig(
        inputs=(str(data),), output=str(tmp_path / "out"), max_len=512, cache_dir=str(tmp_path / "cache")
    )
    run_pack(config, progress)
    assert sum(advance for advance, _ in seen) == 1500
    totals = [total for _, total in seen]
    assert None not in totals and totals[-1] == 1500
    assert all(abs(total - 1500) <= 150 for total in totals), totals  # within 10% from the first batch
    assert totals[0] != 1500  # an estimate, not a count


def _shards(out: Path) -> dict[str, bytes]:
    found = {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}
    assert found
    return found


@pytest.mark.parametrize(
    "flags",
    [("--limit", "700"), ("--dry-run",), ("--no-cache",)],
    ids=["limit-cuts-the-file", "dry-run", "no-cache"],
)
def test_a_run_that_makes_one_whole_store_reads_each_input_once(
    pack: Any, tmp_path: Path, bytes_read: Counter[str], monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...]
) -> None:
    # Two inputs: with --limit 700 the first is cut by the limit (its rest is read for its hash alone) and
    # the second is read for its hash alone; the cache's key is of whole files all the same.
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    first = _input(tmp_path, 2000)
    second = write_jsonl(tmp_path / "second.jsonl", [{"messages": m} for m in make_conversations(1500, seed=4)])
    made = _summary(pack, first, second, tmp_path / "out1", *flags)
    assert made["cache"] == ("off" if "--no-cache" in flags else "miss")
    for data in (first, second):
        assert bytes_read[os.path.realpath(data)] <= data.stat().st_size + SNIFF_BLOCK, (data, bytes_read)
    assert made["records_read"] == (700 if "--limit" in flags else 3500)
    if "--dry-run" in flags:
        return
    # The same run with every hash taken first (the memo knows the files now, or the cache is off): the
    # same shards, and, with the cache, the entry the first run keyed once it had read the files.
    bytes_read.clear()
    again = _summary(pack, first, second, tmp_path / "out2", *flags)
    assert again["cache"] == ("off" if "--no-cache" in flags else "hit")
    if "--no-cache" not in flags:
        assert bytes_read[os.path.realpath(first)] == bytes_read[os.path.realpath(second)] == 0
    assert _shards(tmp_path / "out1") == _shards(tmp_path / "out2")


def test_a_copy_of_a_cached_input_finds_its_whole_store_once_read(
    pack: Any, tmp_path: Path, bytes_read: Counter[str], cache_dir: Path
) -> None:
    data = _input(tmp_path, 1500)
    _summary(pack, data, tmp_path / "out1", "--limit", "1000")
    entries = sorted(p.name for p in cache_dir.iterdir() if p.is_dir())
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(data.read_bytes())
    bytes_read.clear()
    again = _summary(pack, copy, tmp_path / "out2", "--limit", "1000")
    # Tokenized as it was read (its key not known before), then found under that key: the store just made
    # is let go, and the entry is not made twice.
    assert again["cache"] == "hit"
    assert bytes_read[os.path.realpath(copy)] <= copy.stat().st_size + SNIFF_BLOCK
    assert sorted(p.name for p in cache_dir.iterdir() if p.is_dir()) == entries
    assert not [p for p in cache_dir.rglob(".tmp-*")]
    assert _shards(tmp_path / "out1") == _shards(tmp_path / "out2")


@pytest.mark.parametrize("parts", [True, False], ids=["cache-parts", "one-store"])
def test_a_run_reads_and_writes_the_memo_a_few_times_whatever_its_inputs(
    pack: Any, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, parts: bool
) -> None:
    """The hash memo is read once a run and written once a step, not once an input (which is O(N^2) bytes
    of memo over thousands of inputs)."""
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    calls: Counter[str] = Counter()
    for name in ("_read_memo", "_write_memo"):
        real = getattr(fingerprint, name)

        def counted(path: Path | None, *args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += path is not None  # a read of the memo's file (without one, nothing is read)
            return _real(path, *args)

        monkeypatch.setattr(fingerprint, name, counted)
    inputs = [
        write_jsonl(tmp_path / f"in{i}.jsonl", [{"text": f"record {i} {j}"} for j in range(3)]) for i in range(30)
    ]
    extra = () if parts else ("--limit", "1000000")
    for n, state in enumerate(["miss", "hit"]):
        calls.clear()
        summary = _summary(pack, *inputs, tmp_path / f"out{n}", *extra)
        assert summary["cache"] == state and summary["records_read"] == 90
        # Read once, and once more to merge what it learned into what another run may have written meanwhile.
        assert calls["_read_memo"] <= 2 and calls["_write_memo"] <= 1, calls
    memo = json.loads((cache_dir / HASH_MEMO).read_text())
    assert {os.path.realpath(p) for p in inputs} <= set(memo)
    assert all(memo[os.path.realpath(p)]["records"] == 3 for p in inputs)


def test_a_saved_memo_keeps_what_another_run_wrote_meanwhile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    path = tmp_path / HASH_MEMO
    ours, theirs = (write_jsonl(tmp_path / f"{name}.jsonl", [{"text": name}]) for name in ("ours", "theirs"))
    memo = fingerprint.Memo.load(path)
    memo.fingerprint_and_count(InputSource(str(ours), "jsonl"))
    fingerprint.fingerprint(InputSource(str(theirs), "jsonl"), path)  # another run's, while this one runs
    memo.save()
    assert set(json.loads(path.read_text())) == {os.path.realpath(ours), os.path.realpath(theirs)}


@pytest.mark.parametrize("gap,keep", [(1 << 20, 1 << 26), (64, 4096)], ids=["as-set", "small-gap-and-keep"])
def test_a_file_read_in_any_order_is_hashed_in_file_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gap: int, keep: int
) -> None:
    # Whatever ranges a reader asks for, it gets the file's bytes, and finish gives the file's hash.
    from packcli.io.readers import inorder

    monkeypatch.setattr(inorder, "GAP", gap)
    monkeypatch.setattr(inorder, "KEEP", keep)
    rng = random.Random(7)
    data = rng.randbytes(200_000)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    for _ in range(100):
        with inorder.InOrderFile(str(path)) as fh:
            for _ in range(rng.randint(0, 12)):
                pos, n = rng.randrange(len(data) + 10), rng.randint(0, 70_000)
                fh.seek(pos)
                assert fh.read(n) == data[pos : pos + n]
            assert fh.finish() == fingerprint.file_blake2b(path)


@pytest.mark.parametrize("size", [3_000_000, 300_000], ids=["footer-far", "footer-within-a-gap"])
def test_a_footer_read_first_is_not_read_again(tmp_path: Path, size: int) -> None:
    # Parquet's and Arrow's readers: the footer (the file's tail), then the rest in file order. A tail far
    # ahead is kept until the hash comes to it; a tail within GAP of the start makes the bytes before it a
    # gap, hashed then and kept till the reader asks for them, piece by piece.
    from packcli.io.readers import inorder

    data = random.Random(8).randbytes(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    third = size // 3
    with inorder.InOrderFile(str(path)) as fh:
        for pos, n in ((size - 65536, 65536), (4, third), (0, 4), (4 + third, size - 65536 - 4 - third + 10)):
            fh.seek(pos)
            assert fh.read(n) == data[pos : pos + n]
        assert fh.finish() == fingerprint.file_blake2b(path)
        assert fh.read_bytes == len(data)
