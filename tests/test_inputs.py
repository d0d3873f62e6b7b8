"""The inputs users have: compressed files, stdin and FIFOs, cached Hub datasets offline, YAML presets, --limit."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard
from typer.testing import CliRunner

import packcli
from packcli.cli import app
from packcli.errors import InputError
from tests.conftest import make_conversations, one_error_line, write_jsonl

COMPRESS = {
    "gz": gzip.compress,
    "zst": lambda b: zstandard.ZstdCompressor().compress(b),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


def _records(n: int = 12) -> list[dict[str, Any]]:
    return [{"messages": m} for m in make_conversations(n, seed=3, max_turns=2, max_words=12)]


def _texts(records: list[dict[str, Any]]) -> dict[str, bytes]:
    """The same records as JSON lines, a JSON array, and CSV (prompt, completion)."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    rows = ["prompt,completion"]
    for r in records:
        user, answer = r["messages"][-2]["content"], r["messages"][-1]["content"]
        rows.append(",".join('"' + v.replace('"', '""') + '"' for v in (user, answer)))
    return {
        "jsonl": lines.encode(),
        "json": json.dumps(records, ensure_ascii=False, indent=1).encode(),
        "csv": ("\n".join(rows) + "\n").encode(),
    }


@pytest.mark.parametrize(("ext", "packed_kind"), [("gz", "jsonl"), ("zst", "csv"), ("bz2", "json"), ("xz", "jsonl")])
def test_every_text_format_reads_compressed_as_plain(
    tmp_path: Path, cache_dir: Path, ext: str, packed_kind: str
) -> None:
    """A .jsonl/.json/.csv compressed with gz, zst, bz2 or xz gives the very records of the plain file,
    and packs to the same tokens."""
    from packcli.io.readers import read_batches
    from packcli.io.sources import resolve_inputs

    for kind, data in _texts(_records()).items():
        plain = tmp_path / f"plain-{kind}" / f"d.{kind}"
        packed = tmp_path / f"packed-{kind}" / f"d.{kind}.{ext}"
        plain.parent.mkdir()
        packed.parent.mkdir()
        plain.write_bytes(data)
        packed.write_bytes(COMPRESS[ext](data))
        [source] = resolve_inputs([str(packed)])
        assert source.kind == kind
        read = [(b.items, b.positions) for b in read_batches(resolve_inputs([str(packed)]), batch_size=5)]
        assert read == [(b.items, b.positions) for b in read_batches(resolve_inputs([str(plain)]), batch_size=5)]
        assert sum(len(items) for items, _ in read) == 12
        if kind == packed_kind:
            a = packcli.pack(plain, 256, dry_run=True, cache_dir=cache_dir, num_proc=1)
            b = packcli.pack(packed, 256, dry_run=True, cache_dir=cache_dir, num_proc=1)
            assert (b.records_read, b.tokens, b.rows) == (a.records_read, a.tokens, a.rows)
            assert b.records_read == 12 and b.summary["cache"] == "miss"


def test_the_content_hash_is_of_the_compressed_bytes(tmp_path: Path) -> None:
    from packcli.io.fingerprint import fingerprint
    from packcli.io.sources import resolve_inputs

    data = _texts(_records())["jsonl"]
    fast, best = tmp_path / "a" / "d.jsonl.gz", tmp_path / "b" / "d.jsonl.gz"
    fast.parent.mkdir()
    best.parent.mkdir()
    fast.write_bytes(gzip.compress(data, compresslevel=1, mtime=0))
    best.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    assert fast.read_bytes() != best.read_bytes()
    [a], [b] = resolve_inputs([str(fast)]), resolve_inputs([str(best)])
    assert (a.kind, a.compression) == ("jsonl", "gzip")
    # Same records, other compressed bytes: another hash; the hash is BLAKE2b of the file's bytes (b2sum -l 128).
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(a) == hashlib.blake2b(fast.read_bytes(), digest_size=16).hexdigest()


def test_a_json_array_is_read_as_a_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With 64-character chunks, records that span chunks (escapes, multi-byte UTF-8, nesting) are whole,
    and the text held never grows with the file."""
    from packcli.io import readers
    from packcli.io.readers import jsonl
    from packcli.io.sources import InputSource

    records = [{"text": f'é"\\{i}' + "数据😀" * (i % 7), "n": [[i], {"a": "]}"}]} for i in range(300)]
    path = tmp_path / "d.json.xz"
    path.write_bytes(lzma.compress(json.dumps(records, ensure_ascii=False).encode()))
    monkeypatch.setattr(jsonl, "CHUNK", 64)
    held: list[int] = []
    more = jsonl._TextStream.more

    def watch(self: Any) -> bool:
        held.append(len(self.buf))
        return more(self)

    monkeypatch.setattr(jsonl._TextStream, "more", watch)
    batches = list(readers.read_batches([InputSource(str(path), "json", compression="xz")], batch_size=50))
    assert [r for b in batches for r in b.items] == records
    assert len(held) > 100 and max(held) < 64 * 4  # one record and a chunk or two, never the file


def test_csv_cells_with_newlines_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack: Any) -> None:
    """Quoted cells holding newlines (RFC 4180) are read whole however the file is cut into blocks."""
    import csv

    from packcli.io import readers
    from packcli.io.readers import tabular
    from packcli.io.sources import resolve_inputs

    answers = ["\n".join(f' "{i}" line {j}' for j in range(i % 9)) for i in range(120)]
    rows = [{"prompt": f"Question {i}:\nline two, with a comma", "completion": a} for i, a in enumerate(answers)]
    path = tmp_path / "d.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, ["prompt", "completion"])
        writer.writeheader()
        writer.writerows(rows)
    assert path.stat().st_size > 20 * 256
    monkeypatch.setattr(tabular, "CSV_BLOCK", 256)  # the file spans many blocks, cut inside quoted cells
    read = [r for b in readers.read_batches(resolve_inputs([str(path)]), batch_size=50) for r in b.items]
    assert read == rows
    result = pack(path, "--max-len", "256", "-o", tmp_path / "out", "--json")
    summary = json.loads(result.stdout)
    assert summary["records_read"] == 120 and summary["dropped"] == {}


def test_a_damaged_compressed_file_is_one_line_naming_it(tmp_path: Path, pack: Any) -> None:
    data = gzip.compress(_texts(_records())["jsonl"])
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    result = pack(cut, "--max-len", "256", "-o", tmp_path / "out", expect=1)
    assert result.stderr.count("\n") == 1
    assert "cut.jsonl.gz: cannot decompress: the gzip data is cut off" in result.stderr
    assert "check the file" in result.stderr
    zst = tmp_path / "bad.csv.zst"
    zst.write_bytes(b"not zstd at all")
    result = pack(zst, "--max-len", "256", "-o", tmp_path / "out", expect=1)
    assert "bad.csv.zst: cannot decompress" in result.stderr


# Every codec checks its data: zstd frames with a checksum, as the zstd tool writes them by default.
STRICT = {**COMPRESS, "zst": lambda b: zstandard.ZstdCompressor(write_checksum=True).compress(b)}


@pytest.mark.parametrize("ext", ["gz", "zst", "bz2", "xz"])
def test_a_cut_or_damaged_compressed_file_is_an_error_never_a_shorter_file(tmp_path: Path, pack: Any, ext: str) -> None:
    """Cut inside the second of two members (frames), cut mid-line inside the only one, a byte flipped,
    or followed by bytes of no member: one line naming the file, even with --on-error skip."""
    lines = _texts(_records(60))["jsonl"]
    first, second = STRICT[ext](lines[: len(lines) // 2]), STRICT[ext](lines[len(lines) // 2 :])
    whole = STRICT[ext](lines)
    # Over zstd's block size (128 KiB): cut at 2/3, the blocks before the cut decode (the lines before it
    # were read, the cut line was "invalid JSON", and --on-error skip packed the rest as the whole file).
    large = STRICT[ext](_texts(_records(1500))["jsonl"])
    damaged = bytearray(whole)
    damaged[len(damaged) // 2] ^= 0x55
    cases = {
        "two": (first + second[: len(second) // 2], "cut off (the file ends inside"),
        "one": (large[: len(large) * 2 // 3], "cut off (the file ends inside"),
        "flipped": (bytes(damaged), "damaged ("),
        "appended": (whole + b"not compressed\n", "holds bytes that are not"),
    }
    for name, (data, what) in cases.items():
        path = tmp_path / f"{name}.jsonl.{ext}"
        path.write_bytes(data)
        result = pack(path, "--max-len", "256", "-o", tmp_path / name, "--on-error", "skip", expect=1)
        line = one_error_line(result)
        assert line.startswith(f"Error: {path}: cannot decompress: ") and what in line, (name, line)
        assert not (tmp_path / name).exists()
    # A file of two whole members is all of their records.
    path = tmp_path / f"both.jsonl.{ext}"
    path.write_bytes(first + second)
    result = pack(path, "--max-len", "256", "-o", tmp_path / "both", "--json", "-q")
    assert json.loads(result.stdout)["records_read"] == 60


@pytest.mark.parametrize("ext", ["gz", "zst", "bz2", "xz"])
def test_every_member_of_a_compressed_file_is_read_exactly(ext: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members of all sizes (an empty one too), with reads and outputs bounded far below them."""
    import io
    import random

    from packcli.io.readers import compressed as readers

    monkeypatch.setattr(readers, "COMPRESSED_CHUNK", 1000)
    monkeypatch.setattr(readers, "MAX_OUTPUT", 4096)
    monkeypatch.setattr(readers, "ZSTD_FEED", 300)
    rng = random.Random(5)
    data = b"".join(b"x" * rng.randint(1, 3000) + rng.randbytes(rng.randint(0, 50)) for _ in range(300))
    parts = [data[:200_000], b"", data[200_000:200_100], data[200_100:], b"tail\n"]
    compressed = b"".join(STRICT[ext](p) for p in parts)
    name = {"gz": "gzip", "zst": "zstd"}.get(ext, ext)
    with io.BufferedReader(readers.Decompressed(io.BytesIO(compressed), name, "t")) as fh:
        assert fh.read() == data + b"tail\n"


def test_compressed_parquet_is_refused_with_the_fix(tmp_path: Path, pack: Any) -> None:
    (tmp_path / "d.parquet.gz").write_bytes(gzip.compress(b"x"))
    result = pack(tmp_path / "d.parquet.gz", "--max-len", "256", "-o", tmp_path / "out", expect=1)
    assert "only JSON, JSON lines and CSV are read compressed" in result.stderr


def test_a_directory_takes_its_compressed_files(tmp_path: Path, cache_dir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl.zst").write_bytes(COMPRESS["zst"](_texts(_records(5))["jsonl"]))
    (data / "b.json.bz2").write_bytes(bz2.compress(_texts(_records(7))["json"]))
    (data / "notes.txt.gz").write_bytes(gzip.compress(b"not data"))
    result = packcli.pack(data, 256, dry_run=True, cache_dir=cache_dir, num_proc=1)
    assert result.records_read == 12


def _invoke(argv: list[str], cache_dir: Path, **kwargs: Any) -> Any:
    return CliRunner().invoke(app, [*argv, "--cache-dir", str(cache_dir), "--num-proc", "1"], **kwargs)


def test_stdin_is_read_as_json_lines(tmp_path: Path, cache_dir: Path) -> None:
    lines = _texts(_records())["jsonl"].decode()
    out = tmp_path / "out"
    result = _invoke(["pack", "-", "--max-len", "256", "-o", str(out), "--json", "-q"], cache_dir, input=lines)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records_read"] == 12
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"][0]["path"] == "stdin"
    # The same bytes again: a cache hit (the hash is of the content, not of the copy's name).
    again = _invoke(["pack", "-", "--max-len", "256", "--dry-run", "--json", "-q"], cache_dir, input=lines)
    assert json.loads(again.stdout)["cache"] == "hit"
    other = _invoke(["pack", "-", "--max-len", "256", "--dry-run", "--json", "-q"], cache_dir, input=lines[:-1] + " ")
    assert json.loads(other.stdout)["cache"] == "miss"


def test_a_fifo_is_read_as_a_stream(tmp_path: Path, cache_dir: Path) -> None:
    fifo = tmp_path / "live.jsonl.gz"
    os.mkfifo(fifo)
    data = gzip.compress(_texts(_records())["jsonl"])

    def feed() -> None:
        with open(fifo, "wb") as fh:
            fh.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    result = _invoke(["pack", str(fifo), "--max-len", "256", "--dry-run", "--json", "-q"], cache_dir)
    writer.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records_read"] == 12

    # A pipe whose name has no type (what bash's <(...) passes, /dev/fd/63) is JSON lines, as stdin.
    bare = tmp_path / "63"
    os.mkfifo(bare)
    lines = _texts(_records(5))["jsonl"]
    writer = threading.Thread(target=lambda: bare.write_bytes(lines))
    writer.start()
    result = _invoke(["pack", str(bare), "--max-len", "256", "--dry-run", "--json", "-q"], cache_dir)
    writer.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records_read"] == 5


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_stops_a_run_waiting_for_a_fifo_writer(tmp_path: Path, sig: int) -> None:
    """Opening a FIFO that no program writes blocks in the kernel: the first SIGINT or SIGTERM still ends
    the run at once, with the exit code of an interrupt and one line, and leaves no copy of the stream."""
    fifo = tmp_path / "nobody.jsonl"
    os.mkfifo(fifo)
    env = {**os.environ, "PACKCLI_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "packcli", "pack", str(fifo), "--max-len", "64", "-o", str(tmp_path / "out")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        deadline = time.monotonic() + 120
        wchan = Path(f"/proc/{proc.pid}/wchan")
        while time.monotonic() < deadline and proc.poll() is None:
            if wchan.read_text() == "wait_for_partner":  # in open(), waiting for a writer
                break
            time.sleep(0.05)
        assert wchan.read_text() == "wait_for_partner"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "Error: interrupted; the previous output, if any, was left as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nobody.jsonl"]


def _cached_hub_dataset(home: Path, repo: str, records: list[dict[str, Any]]) -> None:
    """Lay out ``repo`` in a datasets cache as a dataset loaded once from the Hub leaves it."""
    import datasets

    built = datasets.Dataset.from_list(records)
    owner, name = repo.split("/")
    target = home / f"{owner}___{name}" / "default" / "0.0.0" / "0123abcd"
    target.mkdir(parents=True)
    import pyarrow as pa

    with (
        pa.OSFile(str(target / f"{name}-train.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, built.data.schema) as writer,
    ):
        writer.write_table(built.data.table)
    info = datasets.DatasetInfo(features=built.features, dataset_name=name, config_name="default")
    info.splits = datasets.SplitDict({"train": datasets.SplitInfo("train", num_examples=len(records))})
    info.write_to_directory(str(target))


def test_a_cached_hub_dataset_loads_offline(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import datasets.config

    hf = tmp_path / "hf-datasets"
    _cached_hub_dataset(hf, "acme/chats", _records())
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", hf)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = packcli.pack("acme/chats", 256, dry_run=True, cache_dir=cache_dir, num_proc=1)
    assert result.records_read == 12
    assert any("read from the local Hugging Face cache" in w for w in result.warnings)
    with pytest.raises(packcli.PackcliError, match=r"hub:acme/nothing\[train\]: .*not in the local cache"):
        packcli.pack("acme/nothing", 256, dry_run=True, cache_dir=cache_dir, num_proc=1, format="messages")


def test_the_hub_is_asked_at_the_port_hf_endpoint_names() -> None:
    # A mirror on a port of its own (or plain http) answers there, not at 443: asked there, it is online.
    from packcli.contract import _answers

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert _answers("0", f"http://127.0.0.1:{port}", 2.0)
    _answers.cache_clear()  # asked once a process: asked again
    assert not _answers("0", f"http://127.0.0.1:{port}", 2.0)  # closed now


def test_yaml_preset_names_inputs_and_fields(tmp_path: Path, cache_dir: Path) -> None:
    presets = tmp_path / "presets"
    presets.mkdir()
    write_jsonl(presets / "renamed.jsonl", [{"dialog": r["messages"]} for r in _records()])
    (presets / "sft.yaml").write_text(
        "# the training config's neighbour\ninputs:\n  - renamed.jsonl\nmax_len: 300\nfields:\n  messages: dialog\n"
    )
    result = _invoke(["pack", "--config", str(presets / "sft.yaml"), "--dry-run", "--json", "-q"], cache_dir)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["records_read"], summary["max_len"]) == (12, 300)
    # Inputs on the command line replace the preset's.
    other = write_jsonl(tmp_path / "other.jsonl", [{"dialog": r["messages"]} for r in _records(4)])
    result = _invoke(
        ["pack", str(other), "--config", str(presets / "sft.yaml"), "--dry-run", "--json", "-q"], cache_dir
    )
    assert json.loads(result.stdout)["records_read"] == 4


def test_a_preset_finds_its_tokenizer_directory_beside_it(tmp_path: Path, cache_dir: Path) -> None:
    import shutil

    from packcli.tokenize.encoders.tokenizer import default_tokenizer_dir

    presets = tmp_path / "presets"
    presets.mkdir()
    shutil.copytree(default_tokenizer_dir(), presets / "tok")
    write_jsonl(presets / "chat.jsonl", _records())
    (presets / "sft.yaml").write_text("inputs: [chat.jsonl]\ntokenizer: tok\nmax_len: 300\n")
    assert not Path("tok").exists()  # the current directory has no tok/: only the preset's can be meant
    result = _invoke(["pack", "--config", str(presets / "sft.yaml"), "--dry-run", "--json", "-q"], cache_dir)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records_read"] == 12


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_len: [1, 2\n", "not a valid YAML file"),
        ("inputs: 3\n", "'inputs' must be a path or a list of paths, not the number 3"),
        ("limit: 0\n", "'limit' must be between 1 and"),
        ("- a\n- b\n", "a preset must be an object"),
        pytest.param(
            "max_len: 1" + "0" * 5000 + "\n",
            "p.yml: holds an integer of more than 4300 digits; fix the preset",
            id="huge-integer",
        ),
    ],
)
def test_bad_yaml_preset_is_one_line(tmp_path: Path, cache_dir: Path, text: str, message: str) -> None:
    (tmp_path / "p.yml").write_text(text)
    data = write_jsonl(tmp_path / "d.jsonl", _records(2))
    result = _invoke(["pack", str(data), "--config", str(tmp_path / "p.yml"), "--dry-run"], cache_dir)
    assert result.exit_code == 2
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_limit_reads_the_first_records_and_says_so(tmp_path: Path, cache_dir: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", _records(5))
    b = write_jsonl(tmp_path / "b.jsonl", _records(9))
    out = tmp_path / "out"
    result = packcli.pack([str(a), str(b)], 256, out, limit=7, cache_dir=cache_dir, num_proc=1)
    assert result.records_read == 7
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["limit"] == 7 and manifest["counts"]["records_read"] == 7
    assert manifest["options"]["limit"] == 7
    assert sorted(i for row in result.dataset()["sample_index"] for i in row) == list(range(7))
    # The limited store is not what a run without --limit reads.
    full = packcli.pack([str(a), str(b)], 256, dry_run=True, cache_dir=cache_dir, num_proc=1)
    assert full.records_read == 14 and full.summary["cache"] == "miss"
    with pytest.raises(packcli.PackcliError, match="limit must be between 1 and"):
        packcli.pack(str(a), 256, dry_run=True, limit=0, cache_dir=cache_dir, num_proc=1)


def test_stdin_from_a_terminal_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from packcli.io.sources import forget_streams, resolve_inputs

    class Tty:
        def isatty(self) -> bool:
            return True

    forget_streams()
    monkeypatch.setattr(sys, "stdin", Tty())
    with pytest.raises(packcli.PackcliError, match="standard input is a terminal"):
        resolve_inputs(["-"])
    assert InputError.exit_code == 1


def test_a_cache_inside_an_input_directory_is_never_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", _records())
    inner = data / "cache"
    argv = ["pack", str(data), "--max-len", "300", "-o", str(tmp_path / "out"), "--overwrite", "--json", "-q"]
    first = _invoke(argv, inner)
    assert first.exit_code == 0, first.output
    assert any(p.name == "input-hashes.json" for p in inner.iterdir())
    again = _invoke(argv, inner)
    assert again.exit_code == 0, again.output
    summary = json.loads(again.stdout)
    assert (summary["records_read"], summary["cache"], summary["skipped_dirs"]) == (12, "hit", [str(inner)])
    assert again.stderr.strip() == (
        f"Warning: {inner}: skipped; a packcli output, staging directory or cache is never read as input"
    )


def test_an_empty_input_path_is_refused(tmp_path: Path, cache_dir: Path) -> None:
    result = _invoke(["pack", "", "--max-len", "300", "-o", str(tmp_path / "out")], cache_dir)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "Error: an input path is empty (an unset shell variable?); pass files, directories or globs"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("location", "uri"),
    [
        ("s3://bucket/data/", True),
        ("gs://bucket/a.jsonl", True),
        ("file:///tmp/a.jsonl", True),
        ("abfs+https://c/a", True),  # "+", "." and "-" inside a scheme
        ("C://data/a.jsonl", False),  # a Windows drive, not a one-letter scheme
        ("3s://bucket/a", False),  # a scheme starts with a letter
        ("é3://bucket/a", False),  # and is ASCII
        ("out/run://a", False),  # a "://" after a path's first part is part of the path
        ("://bucket", False),  # no scheme at all
        ("data.jsonl", False),
        ("/abs/dir", False),
        ("-", False),
    ],
)
def test_one_rule_says_what_is_a_uri(location: str, uri: bool) -> None:
    """A scheme of two or more ASCII characters (a letter first) then "://"; the copies this replaced
    took a drive letter, a digit or non-ASCII first, or any "://" in the text, for a URI."""
    from packcli.io.uri import is_uri

    assert is_uri(location) is uri


def test_uris_are_told_from_paths_in_one_place() -> None:
    """No module of the package has its own test of what a URI is: they all ask packcli.io.uri."""
    package = Path(packcli.__file__).parent
    own = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path != package / "io" / "uri.py"
        and ('"://" in' in (text := path.read_text(encoding="utf-8")) or "def is_uri" in text)
    ]
    assert own == []


def test_a_run_that_fails_before_its_inputs_are_hashed_stops_hashing_them(tmp_path: Path) -> None:
    # With the cache off, inputs that are not hashed as they are read (a saved dataset, a URI) are hashed in
    # a thread beside the tokenizer's loading. A run that fails there (a template that does not compile)
    # must not read them through before it ends: the thread stops at its next read. A saved dataset of 4 GB
    # of zeros (a sparse file: no disk) takes seconds to hash.
    from packcli.config import PackConfig
    from packcli.errors import PackcliError
    from packcli.run.tokenized import tokenized_inputs

    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "state.json").write_text("{}")
    (saved / "dataset_info.json").write_text("{}")
    with open(saved / "data-00000-of-00001.arrow", "wb") as fh:
        fh.truncate(4 << 30)
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    config = PackConfig(
        inputs=(str(saved),), output=str(tmp_path / "out"), format="messages", chat_template=str(bad),
        cache=False, num_proc=1,
    )  # fmt: skip
    with pytest.raises(PackcliError, match="does not compile"), tokenized_inputs(config):
        pass
    hashing = [t for t in threading.enumerate() if t.name.startswith("packcli-inputs")]
    for thread in hashing:
        thread.join(timeout=2)  # ends within one read of 4 MiB once told; the whole file takes seconds
    assert not any(t.is_alive() for t in hashing)
