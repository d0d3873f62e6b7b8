"""Issue 12, second half: the cache never lies, no record or option ends in a traceback, smaller gaps.

Each test asserts the exit code, the exact one-line message, and that the user's files are untouched.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packcli.contract import file_sha256
from packcli.output import manifest as output_manifest, rows as shards
from packcli.store import tokens as cache_mod, writer as store_writer
from packcli.tokenize.batches import building
from packcli.tokenize.encoders import encoder as tokenize
from packcli.tokenize.long import bounds

from .conftest import bare_meta, make_conversations, one_stderr_line, read_rows, write_jsonl

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
GOOD_LINE = json.dumps(GOOD)


def digest(*paths: Path) -> dict[str, str]:
    """sha256 of every file under the paths (files or directories), to prove nothing was touched."""
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


def entry_of(cache_dir: Path, part: bool = False) -> Path:
    """The one run's entry in the cache (``part``: the one cache part it was assembled from)."""
    dirs = [p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    [entry] = [p for p in dirs if ("part" in json.loads((p / "meta.json").read_text())) == part]
    return entry


def enospc(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullFile:
    """A file whose writes fail as on a full disk."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __enter__(self) -> FullFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()


def full_open(name_suffix: str) -> Any:
    """An ``open`` that returns a full-disk file for paths ending in ``name_suffix``."""

    def fake(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        real = open(path, mode, *args, **kwargs)  # noqa: SIM115 - FullFile closes it
        return FullFile(real) if "w" in mode and str(path).endswith(name_suffix) else real

    return fake


_open_tokenizer_once = functools.lru_cache(maxsize=None)(tokenize.open_tokenizer)


@pytest.fixture(autouse=True)
def _tokenizer_loaded_once(monkeypatch: Any) -> None:
    # Every test here packs with the default tokenizer: load it once, not once per run (test speed only).
    monkeypatch.setattr(tokenize, "open_tokenizer", _open_tokenizer_once)


@pytest.fixture
def chat(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "chat.jsonl", [{"messages": m} for m in make_conversations(40, seed=3, max_turns=2, max_words=20)]
    )


# -- the cache never lies --------------------------------------------------------------------------


def _flip_token(entry: Path) -> None:
    with open(entry / "input_ids.bin", "r+b") as fh:
        fh.seek(40)
        byte = fh.read(1)
        fh.seek(40)
        fh.write(bytes([byte[0] ^ 0x01]))


def _truncate(entry: Path) -> None:
    os.truncate(entry / "labels.bin", 1000)


def _drop_samples(entry: Path) -> None:
    (entry / "samples.npz").unlink()


def _meta_not_json(entry: Path) -> None:
    (entry / "meta.json").write_text("{not json")


def _meta_lacks_key(entry: Path) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    del meta["pad_id"]
    (entry / "meta.json").write_text(json.dumps(meta))


def _meta_changed(entry: Path) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    meta["records_read"] += 1
    (entry / "meta.json").write_text(json.dumps(meta))


DAMAGE = [
    # A token file is the run's entry's and its part's (a hard link): damaged, both are, and both are told.
    (_flip_token, "{entry}/segments/part00000-input_ids.bin: sha256 differs from meta.json (changed bytes)"),
    (_truncate, "{entry}/segments/part00000-labels.bin: has 1000 bytes, meta.json says {labels_bytes}"),
    (_drop_samples, "{entry}/samples.npz: is missing"),
    (
        _meta_not_json,
        "{entry}: meta.json cannot be read (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1))",
    ),
    (_meta_lacks_key, "{entry}: meta.json lacks pad_id"),
    (_meta_changed, "{entry}: meta.json does not match its checksum"),
]


@pytest.mark.parametrize(("damage", "why"), DAMAGE, ids=[d[0].__name__.strip("_") for d in DAMAGE])
def test_damaged_cache_entry_is_rebuilt_with_one_warning(
    damage: Any, why: str, chat: Path, pack: Any, tmp_path: Path, cache_dir: Path
) -> None:
    first = json.loads(pack(chat, "--max-len", "512", "-o", tmp_path / "a", "--json", "-q").stdout)
    assert first["cache"] == "miss"
    expected = shard_bytes(tmp_path / "a")
    entry, part = entry_of(cache_dir), entry_of(cache_dir, part=True)
    labels_bytes = (part / "labels.bin").stat().st_size
    in_tokens = damage in (_flip_token, _truncate)
    damage(part if in_tokens else entry)
    before = digest(chat)

    result = pack(chat, "--max-len", "512", "-o", tmp_path / "b", "--json", "-q")
    lines = [f"the cache entry is damaged ({why.format(entry=entry, labels_bytes=labels_bytes)}); it is rebuilt"]
    if in_tokens:
        part_why = why.format(entry=part, labels_bytes=labels_bytes).replace("segments/part00000-", "")
        lines.append(f"the cache part of {chat} is damaged ({part_why}); it is rebuilt")
    assert result.stderr.splitlines() == [f"Warning: {line}" for line in lines]
    summary = json.loads(result.stdout)
    assert summary["cache"] == "rebuilt" and summary["warnings"] == lines
    # The entry is made again from its part: tokenized again only when the part was damaged too.
    assert summary["cache_parts"]["records_tokenized"] == (40 if in_tokens else 0)
    assert shard_bytes(tmp_path / "b") == expected
    # The rebuilt entry is whole again: the next run is a plain hit with the same shards.
    again = pack(chat, "--max-len", "512", "-o", tmp_path / "c", "--json", "-q")
    assert json.loads(again.stdout)["cache"] == "hit" and again.stderr == ""
    assert shard_bytes(tmp_path / "c") == expected
    assert digest(chat) == before


def test_truncated_entry_is_not_a_dead_end_on_disk_space(
    chat: Path, pack: Any, tmp_path: Path, cache_dir: Path
) -> None:
    # Once, a truncated token file passed the lookup and every later run failed with "free disk space".
    pack(chat, "--max-len", "96", "-o", tmp_path / "a", "-q")
    os.truncate(entry_of(cache_dir, part=True) / "input_ids.bin", 8)  # the run's entry's too (a hard link)
    for out in ("b", "c"):
        result = pack(chat, "--max-len", "96", "-o", tmp_path / out, "-q")
        assert "disk space" not in result.stderr
    assert shard_bytes(tmp_path / "b") == shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "c")


def test_store_checks_every_file_it_lists(tmp_path: Path) -> None:
    writer = store_writer.TokenStoreWriter(tmp_path / "s")
    ids = np.arange(10, dtype=np.int32)
    writer.add(
        np.array([0]),
        np.array([10], np.int32),
        ids,
        ids,
        np.array([9], np.int32),
        np.array([1], np.int32),
        np.array([1], np.int32),
    )
    store = writer.finish(bare_meta())
    assert set(store.meta.files) == {"input_ids.bin", "labels.bin", "samples.npz"}
    assert store.meta.files["input_ids.bin"]["bytes"] == 40
    (tmp_path / "s" / "extra").write_text("x")  # a file the meta does not list is not read
    assert cache_mod.find_store(tmp_path / "s") is not None
    (tmp_path / "s" / "meta.json").unlink()
    with pytest.raises(cache_mod.DamagedStore, match=r"meta\.json is missing"):
        cache_mod.find_store(tmp_path / "s")
    assert cache_mod.find_store(tmp_path / "none") is None


def test_two_runs_finishing_the_same_entry_both_succeed(tmp_path: Path, monkeypatch: Any) -> None:
    meta = bare_meta()
    ids = np.arange(6, dtype=np.int32)
    one = np.array([1], np.int32)
    writers = [store_writer.TokenStoreWriter(tmp_path / "entry") for _ in range(2)]
    for writer in writers:
        writer.add(np.array([0]), np.array([6], np.int32), ids, ids, np.array([5], np.int32), one, one)
    real_replace = os.replace
    raced = []

    def replace_after_the_other_run(src: Any, dst: Any) -> None:
        if not raced:  # the other run renames its entry into place first
            raced.append(True)
            writers[1].finish(meta)
        real_replace(src, dst)

    monkeypatch.setattr(store_writer.os, "replace", replace_after_the_other_run)
    first = writers[0].finish(meta)  # the entry is already there: it is used, not an error
    assert raced and first.meta.files == cache_mod.find_store(tmp_path / "entry").meta.files
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]  # no temporary directory left


def test_input_edited_in_place_with_stamp_restored_is_not_a_stale_hit(
    pack: Any, tmp_path: Path, cache_dir: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "alpha beta gamma"}\n')
    pack(data, "--max-len", "64", "-o", tmp_path / "a", "-q")
    st = data.stat()
    with open(data, "r+b") as fh:  # same size, same inode
        fh.write(b'{"text": "gamma beta alpha"}\n')
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = data.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    result = pack(data, "--max-len", "64", "-o", tmp_path / "b", "--json", "-q")
    assert json.loads(result.stdout)["cache"] == "miss"
    pack(data, "--max-len", "64", "-o", tmp_path / "c", "--no-cache", "-q")
    assert shard_bytes(tmp_path / "b") == shard_bytes(tmp_path / "c") != shard_bytes(tmp_path / "a")


CACHE_FIX = "choose a writable --cache-dir with free space, or pass --no-cache"


def test_cache_dir_that_is_a_file(chat: Path, pack: Any, tmp_path: Path) -> None:
    bad = tmp_path / "cachefile"
    bad.write_text("mine")
    before = digest(chat, bad)
    result = pack(chat, "--max-len", "96", "-o", tmp_path / "out", "--cache-dir", bad, expect=1)
    assert one_stderr_line(result) == f"Error: {bad}: cannot write the token store (Not a directory); {CACHE_FIX}"
    assert digest(chat, bad) == before and not (tmp_path / "out").exists()
    pack(chat, "--max-len", "96", "-o", tmp_path / "out", "--cache-dir", bad, "--no-cache", "-q")


def test_cache_dir_read_only(chat: Path, pack: Any, tmp_path: Path, cache_dir: Path, monkeypatch: Any) -> None:
    real = store_writer.tempfile.mkdtemp

    def read_only(*args: Any, dir: Any = None, **kwargs: Any) -> Any:
        # Root ignores file modes, so the read-only file system is simulated where the cache writes.
        if dir is not None and Path(dir) == cache_dir:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(store_writer.tempfile, "mkdtemp", read_only)
    before = digest(chat)
    result = pack(chat, "--max-len", "96", "-o", tmp_path / "out", expect=1)
    assert (
        one_stderr_line(result)
        == f"Error: {cache_dir}: cannot write the token store (Read-only file system); {CACHE_FIX}"
    )
    assert digest(chat) == before and not (tmp_path / "out").exists()


def test_cache_dir_full(chat: Path, pack: Any, tmp_path: Path, cache_dir: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(store_writer, "open", full_open("input_ids.bin"), raising=False)
    before = digest(chat)
    result = pack(chat, "--max-len", "96", "-o", tmp_path / "out", expect=1)
    assert one_stderr_line(result) == (
        f"Error: {cache_dir}: cannot write the token store (No space left on device); {CACHE_FIX}"
    )
    assert digest(chat) == before and not (tmp_path / "out").exists()
    assert [p.name for p in cache_dir.iterdir() if p.is_dir()] == []  # no half-written entry left


# -- records and options that used to end in a traceback -------------------------------------------

SKIP_HINT = "; fix the record, or pass --on-error skip to skip bad records"
DEEP = "[" * 5000 + "]" * 5000
HUGE_INT = "1" + "0" * 5000  # past Python's 4300-digit limit on converting integer text
CSV_CHAT = '"[{""role"": ""user"", ""content"": ""hi""}, {""role"": ""assistant"", ""content"": %s}]"'


def _record_cases() -> list[tuple[str, str, str, str, str]]:
    """(id, file name, file text, reason, detail) with the bad record second of three."""
    text = json.dumps({"text": "a fine text record"})
    chat_bad = '{"messages": [{"role": "user", "content": "hi \\ud800"}, {"role": "assistant", "content": "x"}]}'
    return [
        (
            "surrogate_text",
            "t.jsonl",
            f'{text}\n{{"text": "\\ud800"}}\n{text}\n',
            "lone_surrogate",
            "the text holds a lone surrogate \\ud800 (half of a UTF-16 pair, not text)",
        ),
        (
            "surrogate_messages",
            "m.jsonl",
            f"{GOOD_LINE}\n{chat_bad}\n{GOOD_LINE}\n",
            "lone_surrogate",
            "a message holds a lone surrogate \\ud800 (half of a UTF-16 pair, not text)",
        ),
        (
            "surrogate_json_file",
            "m.json",
            f"[{GOOD_LINE}, {chat_bad}, {GOOD_LINE}]",
            "lone_surrogate",
            "a message holds a lone surrogate \\ud800 (half of a UTF-16 pair, not text)",
        ),
        (
            "deep_json_line",
            "d.jsonl",
            f'{text}\n{{"text": {DEEP}}}\n{text}\n',
            "too_deep",
            "the record nests more than 100 levels deep",
        ),
        (
            "deep_json_file",
            "d.json",
            f'[{text}, {{"text": {DEEP}, "s": "]"}}, {text}]',
            "too_deep",
            "the record nests more than 100 levels deep",
        ),
        (
            "deep_in_messages",
            "dm.jsonl",
            GOOD_LINE
            + "\n"
            + json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "q", "x": json.loads("[" * 150 + "]" * 150)},
                        {"role": "assistant", "content": "a"},
                    ]
                }
            )
            + "\n"
            + GOOD_LINE
            + "\n",
            "too_deep",
            "the record nests more than 100 levels deep",
        ),
        (
            "int_beyond_int64",
            "i.jsonl",
            '{"input_ids": [5, 6, 7]}\n{"input_ids": [5, 99999999999999999999999]}\n{"input_ids": [8, 9]}\n',
            "integer_out_of_range",
            "field 'input_ids' holds 99999999999999999999999, beyond the 64-bit integer range",
        ),
        (
            "huge_int_json_line",
            "h.jsonl",
            f'{text}\n{{"text": "x", "meta": {HUGE_INT}}}\n{text}\n',
            "integer_out_of_range",
            "the record holds an integer of more than 4300 digits; write it as a string",
        ),
        (
            "huge_int_json_file",
            "h.json",
            f'[{text}, {{"text": "x", "meta": [{HUGE_INT}]}}, {text}]',
            "integer_out_of_range",
            "the record holds an integer of more than 4300 digits; write it as a string",
        ),
        (
            "huge_int_csv_cell",
            "h.csv",
            "messages\n" + "\n".join(CSV_CHAT % v for v in ('""x""', HUGE_INT, '""y""')) + "\n",
            "integer_out_of_range",
            "field 'messages' holds an integer of more than 4300 digits; write it as a string",
        ),
    ]


RECORD_CASES = _record_cases()


@pytest.mark.parametrize(
    ("name", "text", "reason", "detail"), [c[1:] for c in RECORD_CASES], ids=[c[0] for c in RECORD_CASES]
)
def test_bad_value_is_one_record_reason_not_a_traceback(
    name: str, text: str, reason: str, detail: str, pack: Any, tmp_path: Path
) -> None:
    data = tmp_path / name
    data.write_text(text)
    before = digest(data)
    unit = "line" if name.endswith(".jsonl") else "record"
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", expect=1)
    assert one_stderr_line(result) == f"Error: {data} {unit} 2: {detail}{SKIP_HINT}"
    assert not (tmp_path / "out").exists()

    rejects = tmp_path / "rejects.jsonl"
    result = pack(
        data, "--max-len", "64", "-o", tmp_path / "out", "--on-error", "skip", "--rejects", rejects, "--json", "-q"
    )
    summary = json.loads(result.stdout)
    # Exactly that record is skipped, not its batch.
    assert summary["dropped"] == {reason: 1} and summary["packed"] == 2 and summary["records_read"] == 3
    [reject] = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert (reject["sample_index"], reject["position"], reject["reason"], reject["detail"]) == (1, 2, reason, detail)
    assert digest(data) == before


def test_negative_seed_is_a_usage_error(chat: Path, pack: Any, tmp_path: Path) -> None:
    before = digest(chat)
    result = pack(chat, "--max-len", "96", "-o", tmp_path / "out", "--seed", "-1", expect=2)
    assert one_stderr_line(result) == "Error: --seed must be at least 0, not -1"
    assert digest(chat) == before and not (tmp_path / "out").exists()


def test_pad_to_max_beyond_what_a_row_can_hold(chat: Path, pack: Any, tmp_path: Path) -> None:
    result = pack(chat, "--max-len", "200000000", "--pad-to-max", "-o", tmp_path / "out", expect=2)
    assert one_stderr_line(result) == (
        "Error: --max-len 200000000 with --pad-to-max: every row would be 200000000 tokens, about 10 GiB of "
        "memory to build; with --pad-to-max, --max-len must be at most 16777216"
    )
    assert not (tmp_path / "out").exists()
    # Without padding a row is only as long as its samples, and planning does not grow with --max-len.
    summary = json.loads(pack(chat, "--max-len", "1073741824", "-o", tmp_path / "out", "--json", "-q").stdout)
    assert summary["rows"] == summary["lower_bound_l2"] == 1


@pytest.mark.parametrize("stage", ["tokenizing", "rejects", "finishing_store"])
def test_disk_full_while_tokenizing_or_writing_the_store(
    stage: str, chat: Path, pack: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    out = tmp_path / "out"
    data = chat
    if stage == "rejects":
        data = tmp_path / "bad.jsonl"
        data.write_text(GOOD_LINE + "\n{broken\n")
        monkeypatch.setattr(building, "open", full_open("rejects.jsonl"), raising=False)
    elif stage == "tokenizing":
        monkeypatch.setattr(store_writer, "open", full_open("labels.bin"), raising=False)
    else:
        monkeypatch.setattr(store_writer.np, "savez", enospc)
    before = digest(data)
    result = pack(data, "--max-len", "96", "-o", out, "--no-cache", "--on-error", "skip", expect=1)
    assert one_stderr_line(result) == (
        f"Error: {out}: cannot write the token store (No space left on device); free disk space or choose another -o"
    )
    assert digest(data) == before and not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # no staging left behind


def test_disk_full_while_writing_the_manifest(chat: Path, pack: Any, tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "out"
    pack(chat, "--max-len", "96", "-o", out, "-q")
    previous = digest(out)
    monkeypatch.setattr(output_manifest, "open", full_open("manifest.json.tmp"), raising=False)
    result = pack(chat, "--max-len", "64", "-o", out, "--overwrite", expect=1)
    assert one_stderr_line(result) == (
        f"Error: {out}: cannot write manifest.json (No space left on device); free disk space or choose another -o"
    )
    assert digest(out) == previous  # the previous output is whole


def _manifest_list(m: dict[str, Any]) -> Any:
    return []


def _no_shards(m: dict[str, Any]) -> Any:
    return {k: v for k, v in m.items() if k != "shards"}


def _no_max_len(m: dict[str, Any]) -> Any:
    return {k: v for k, v in m.items() if k != "max_len"}


def _entry_lacks_rows(m: dict[str, Any]) -> Any:
    m["shards"][0].pop("rows")
    return m


MANIFESTS = [
    (_manifest_list, "is not a JSON object"),
    (_no_shards, "lacks shards"),
    (_no_max_len, "lacks max_len"),
    (_entry_lacks_rows, "shard entry 0 lacks rows"),
]


@pytest.mark.parametrize(("change", "problem"), MANIFESTS, ids=[m[0].__name__.strip("_") for m in MANIFESTS])
@pytest.mark.parametrize("command", ["verify", "stats", "inspect"])
def test_damaged_manifest_is_one_line_for_every_command(
    command: str, change: Any, problem: str, packed_out: Path
) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    manifest = packed_out / "manifest.json"
    manifest.write_text(json.dumps(change(json.loads(manifest.read_text()))))
    before = digest(packed_out)
    result = CliRunner().invoke(app, [command, str(packed_out)])
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    if command == "verify" and problem != "is not a JSON object":
        # verify reports problems as its result: one line each, then the count.
        assert result.stderr.splitlines() == [
            f"manifest.json: {problem}; the manifest is damaged",
            f"1 problem in {packed_out}",
        ]
    else:
        assert one_stderr_line(result) == f"Error: {manifest}: {problem}; the manifest is damaged, pack again"
    assert digest(packed_out) == before


@pytest.mark.parametrize("command", ["verify", "stats", "inspect"])
def test_manifest_with_a_huge_integer_is_one_line(command: str, packed_out: Path) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    manifest = packed_out / "manifest.json"
    text = manifest.read_text()
    assert '"max_len": 128' in text
    manifest.write_text(text.replace('"max_len": 128', f'"max_len": {HUGE_INT}', 1))
    result = CliRunner().invoke(app, [command, str(packed_out)])
    assert result.exit_code == 1
    line = one_stderr_line(result)
    assert line.startswith(f"Error: {manifest}: cannot be read (Exceeds the limit (4300 digits) for integer string")
    assert line.endswith("); the output is damaged, pack again")


@pytest.fixture(scope="module")
def packed_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from typer.testing import CliRunner

    from packcli.cli import app

    root = tmp_path_factory.mktemp("packed-once")
    data = write_jsonl(
        root / "chat.jsonl", [{"messages": m} for m in make_conversations(20, seed=4, max_turns=1, max_words=10)]
    )
    argv = ["pack", str(data), "--max-len", "128", "-o", str(root / "packed"), "--no-cache", "--num-proc", "1", "-q"]
    assert CliRunner().invoke(app, argv).exit_code == 0
    return root / "packed"


@pytest.fixture
def packed_out(packed_once: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed_once, tmp_path / "packed"))


# -- smaller ---------------------------------------------------------------------------------------

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("d.jsonl", (GOOD_LINE + "\n" + GOOD_LINE + "\n").encode()),
        ("d.json", f"[{GOOD_LINE}, {GOOD_LINE}]".encode()),
        ("d.csv", b"prompt,completion\n12,34\nhello,there\n"),
    ],
    ids=["jsonl", "json", "csv"],
)
def test_utf8_bom_at_the_start_is_accepted(name: str, body: bytes, pack: Any, tmp_path: Path) -> None:
    plain, marked = tmp_path / "plain" / name, tmp_path / "bom" / name
    for path, data in ((plain, body), (marked, BOM + body)):
        path.parent.mkdir()
        path.write_bytes(data)
    before = digest(marked)
    pack(plain, "--max-len", "64", "-o", tmp_path / "a", "-q", "--no-cache")
    result = pack(marked, "--max-len", "64", "-o", tmp_path / "b", "-q", "--no-cache", "--json")
    assert json.loads(result.stdout)["packed"] == 2  # the CSV's numbers stay text: "prompt" is its first column
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    assert digest(marked) == before


def test_when_no_sniffed_record_parses_the_json_error_is_said(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"messages": [1,}\n{"text": \n')
    before = digest(data)
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", expect=1)
    assert (
        one_stderr_line(result)
        == f"Error: {data} line 1: invalid JSON (Expecting value at column 17, found '}}'){SKIP_HINT}"
    )
    assert digest(data) == before and not (tmp_path / "out").exists()


def test_input_named_four_ways_is_read_once(pack: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "m.jsonl", [GOOD, GOOD, GOOD])
    before = digest(tmp_path / "d")
    result = pack(
        "d", "d/m.jsonl", tmp_path / "d" / "m.jsonl", "d/../d/m.jsonl", "--max-len", "64", "-o", "out", "--json", "-q"
    )
    summary = json.loads(result.stdout)
    assert summary["records_read"] == 3 and summary["packed"] == 3
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [i["path"] for i in manifest["inputs"]] == ["d/m.jsonl"]
    assert digest(tmp_path / "d") == before


def test_a_hard_link_to_an_input_is_the_same_input_as_a_symlink_is(pack: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "m.jsonl", [GOOD, GOOD, GOOD])
    os.link(tmp_path / "d" / "m.jsonl", tmp_path / "hard-copy.jsonl")
    (tmp_path / "soft-copy.jsonl").symlink_to(tmp_path / "d" / "m.jsonl")
    result = pack("hard-copy.jsonl", "d/m.jsonl", "soft-copy.jsonl", "--max-len", "64", "-o", "out", "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["records_read"] == 3 and summary["packed"] == 3
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [i["path"] for i in manifest["inputs"]] == ["d/m.jsonl"]  # the shortest spelling, as for a symlink


def test_sharegpt_from_decides_the_role_not_a_stray_key(pack: Any, tmp_path: Path) -> None:
    turns = [{"from": "human", "value": "my secret question"}, {"from": "gpt", "value": "an answer"}]
    clean, stray = tmp_path / "clean.jsonl", tmp_path / "stray.jsonl"
    write_jsonl(clean, [{"conversations": turns}])
    write_jsonl(stray, [{"conversations": [{**turns[0], "role": "assistant", "content": "other"}, turns[1]]}])
    before = digest(stray)
    a = json.loads(pack(clean, "--max-len", "64", "-o", tmp_path / "a", "--json", "-q").stdout)
    b = json.loads(pack(stray, "--max-len", "64", "-o", tmp_path / "b", "--json", "-q").stdout)
    # The human turn is not trained and its text is its "value", exactly as without the stray keys.
    assert b["trainable_tokens"] == a["trainable_tokens"] and b["tokens"] == a["tokens"]
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    assert digest(stray) == before


def test_world_size_larger_than_the_rows_is_a_clear_error(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [GOOD, GOOD])
    before = digest(data)
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", "--world-size", "4", expect=1)
    assert one_stderr_line(result) == (
        "Error: no sample left to pack: the 1 packed rows are fewer than --world-size 4, and --rank-remainder "
        "drop leaves none; lower --world-size or pass --rank-remainder pad"
    )
    assert digest(data) == before and not (tmp_path / "out").exists()
    pack(data, "--max-len", "64", "-o", tmp_path / "out", "--world-size", "4", "--rank-remainder", "pad", "-q")


def _rewrite_first_shard(out: Path, change: Any) -> None:
    """Rewrite shard 0 with ``change(rows)`` and update its sha256 in the manifest, so only the change is wrong."""
    import pyarrow.parquet as pq

    path = sorted(out.glob("shard-*.parquet"))[0]
    table = pq.read_table(path)
    pq.write_table(pa_table(change(table.to_pylist()), table.schema), path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = file_sha256(path)
    (out / "manifest.json").write_text(json.dumps(manifest))


def pa_table(rows: list[dict[str, Any]], schema: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=schema)


def test_verify_checks_sample_index_ascends_within_a_row(packed_out: Path) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    def swap(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        row = next(r for r in rows if len(r["sample_index"]) >= 2)
        # Swap the first two samples of the row: tokens, labels and lengths move with their index.
        a, b = row["seq_lengths"][:2]
        for col in ("input_ids", "labels"):
            row[col] = row[col][a : a + b] + row[col][:a] + row[col][a + b :]
        row["position_ids"] = list(range(b)) + list(range(a)) + row["position_ids"][a + b :]
        row["seq_lengths"][:2] = [b, a]
        row["sample_index"][:2] = row["sample_index"][1::-1]
        return rows

    first_row = next(
        i
        for i, r in enumerate(shards.read_shard(sorted(packed_out.glob("shard-*"))[0]).to_pylist())
        if len(r["sample_index"]) >= 2
    )
    _rewrite_first_shard(packed_out, swap)
    result = CliRunner().invoke(app, ["verify", str(packed_out)])
    name = sorted(packed_out.glob("shard-*"))[0].name
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"{name}: 1 row has (sample_index, piece_index) pairs that do not ascend within the row "
        f"(first: row {first_row})",
        f"1 problem in {packed_out}",
    ]


@pytest.mark.parametrize("bad_name", ["../outside.parquet", "/etc/hostname", "sub/../../x.parquet"])
def test_verify_refuses_shard_paths_outside_the_output(bad_name: str, packed_out: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    manifest = json.loads((packed_out / "manifest.json").read_text())
    manifest["shards"][0]["file"] = bad_name
    (packed_out / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["verify", str(packed_out)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"manifest.json: shard entry 0 names '{bad_name}', outside the output directory; the manifest is damaged",
        f"1 problem in {packed_out}",
    ]
    for command in ("stats", "inspect"):
        result = CliRunner().invoke(app, [command, str(packed_out)])
        assert result.exit_code == 1
        assert one_stderr_line(result) == (
            f"Error: {packed_out / 'manifest.json'}: shard entry 0 names '{bad_name}', outside the output "
            "directory; the manifest is damaged, pack again"
        )


def test_stats_of_a_path_that_does_not_exist(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    missing = tmp_path / "nonexistent"
    for args in ([str(missing)], [str(missing), "--max-len", "64"]):
        result = CliRunner().invoke(app, ["stats", *args])
        assert result.exit_code == 1
        assert one_stderr_line(result) == f"Error: {missing}: no such file or directory; check the path"


def test_stats_of_raw_input_counts_a_huge_integer(tmp_path: Path, cache_dir: Path) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    data = tmp_path / "h.jsonl"
    data.write_text(f'{GOOD_LINE}\n{{"text": "x", "meta": {HUGE_INT}}}\n')
    argv = ["stats", str(data), "--max-len", "64", "--cache-dir", str(cache_dir), "--num-proc", "1"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 1
    assert one_stderr_line(result) == (
        f"Error: {data} line 2: the record holds an integer of more than 4300 digits; write it as a string{SKIP_HINT}"
    )
    result = CliRunner().invoke(app, [*argv, "--on-error", "skip", "--json"])
    assert result.exit_code == 0 and "Traceback" not in result.stderr
    stats = json.loads(result.stdout)
    assert (stats["records_read"], stats["samples"], stats["dropped"]) == (2, 1, {"integer_out_of_range": 1})


# -- a record that cannot fit is ruled out before tokenizing ---------------------------------------


@pytest.fixture
def encoded_sizes(monkeypatch: Any) -> list[int]:
    """Record the size of every sample that reaches the encoder (characters of text or messages)."""
    from packcli.tokenize.encoders.encoder import Encoder

    seen: list[int] = []
    real = Encoder.encode_batch

    def spy(self: Any, samples: list[Any]) -> Any:
        for s in samples:
            if not isinstance(s, Exception):
                seen.append(len(s.text or "") + sum(len(str(m.get("content"))) for m in s.messages or []))
        return real(self, samples)

    monkeypatch.setattr(Encoder, "encode_batch", spy)
    return seen


def _token_bytes(base_tokenizer: Any) -> int:
    from packcli.tokenize.long.bounds import max_token_bytes

    token_bytes = max_token_bytes(base_tokenizer.backend_tokenizer.to_str())
    assert token_bytes is not None  # the default tokenizer is byte-level BPE
    return token_bytes


LONG_TEXT = "packing rows of tokens " * 5000  # 115,000 bytes: far over 64 tokens * L bytes


@pytest.mark.parametrize("kind", ["text", "messages"])
def test_record_that_cannot_fit_is_dropped_without_tokenizing(
    kind: str, pack: Any, tmp_path: Path, encoded_sizes: list[int], base_tokenizer: Any
) -> None:
    big: dict[str, Any] = {"text": LONG_TEXT}
    small: dict[str, Any] = {"text": "a short record"}
    if kind == "messages":
        big = {"messages": [{"role": "user", "content": LONG_TEXT}, {"role": "assistant", "content": "ok"}]}
        small = GOOD
    data = write_jsonl(tmp_path / "d.jsonl", [small, big, small])
    before = digest(data)
    rejects = tmp_path / "rejects.jsonl"
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", "--rejects", rejects, "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["dropped"] == {"too_long": 1} and summary["packed"] == 2
    assert max(encoded_sizes) < 1000  # the long record never reached the tokenizer
    [reject] = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert (reject["sample_index"], reject["reason"]) == (1, "too_long")
    assert digest(data) == before


def test_record_that_cannot_fit_is_an_error_with_overflow_error(
    pack: Any, tmp_path: Path, encoded_sizes: list[int], base_tokenizer: Any
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "short"}, {"text": LONG_TEXT}])
    token_bytes = _token_bytes(base_tokenizer)
    n = len(LONG_TEXT.encode())
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", "--overflow", "error", expect=1)
    assert one_stderr_line(result) == (
        f"Error: {data} line 2: the sample has at least {-(-n // token_bytes)} tokens, more than --max-len 64 "
        f"({n} bytes of text, at most {token_bytes} bytes a token); "
        "raise --max-len or pass --overflow split, truncate or drop"
    )
    assert max(encoded_sizes) < 1000 and not (tmp_path / "out").exists()


def test_truncate_still_tokenizes_and_truncates_the_long_record(pack: Any, tmp_path: Path, base_tokenizer: Any) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "short"}, {"text": LONG_TEXT}])
    # A drop run first leaves a cache entry without the long record; truncate must not use it.
    pack(data, "--max-len", "64", "-o", tmp_path / "drop", "-q")
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", "--overflow", "truncate", "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["truncated"] == 1 and summary["packed"] == 2 and summary["cache"] == "miss"
    rows = read_rows(tmp_path / "out")
    [row] = [r for r in rows if 1 in r["sample_index"]]
    k = row["sample_index"].index(1)
    start = sum(row["seq_lengths"][:k])
    expected = base_tokenizer.backend_tokenizer.encode(LONG_TEXT, add_special_tokens=True).ids[:64]
    assert row["input_ids"][start : start + 64] == expected
    # ...and a later drop run with a limit no higher uses the full entry.
    again = pack(data, "--max-len", "32", "-o", tmp_path / "drop2", "--json", "-q")
    assert json.loads(again.stdout)["cache"] == "hit"


def test_rule_never_drops_a_record_that_fits(base_tokenizer: Any) -> None:
    from packcli.errors import RecordError
    from packcli.records.formats import Sample
    from packcli.tokenize.long.bounds import rule_out_too_long

    token_bytes = _token_bytes(base_tokenizer)
    backend = base_tokenizer.backend_tokenizer
    vocab = backend.get_vocab()
    # The worst case for the bound: text made of the longest vocabulary entry, repeated.
    longest = max(vocab, key=len)
    piece = backend.decode([vocab[longest]])
    max_len = 8
    texts = [piece * k for k in range(1, 12)] + ["x" * n for n in (1000, 1024, 1025, 5000)] + [LONG_TEXT[:3000]]
    ruled_out = 0
    for text in texts:
        n_tokens = len(backend.encode(text, add_special_tokens=True).ids)
        try:
            rule_out_too_long(Sample("text", text=text), max_len, token_bytes)
        except RecordError:
            ruled_out += 1
            assert n_tokens > max_len, (len(text), n_tokens)
    assert ruled_out >= 3  # the rule did fire on some of them


def test_chat_rule_measures_the_very_text_the_encoder_encodes(base_tokenizer: Any) -> None:
    from packcli.records.formats import DEFAULT_FIELDS, normalize
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

    encoder = Encoder(None, None, EncodeOptions())
    record = {"messages": [{"role": "system", "content": "be brief"}, *GOOD["messages"]]}
    sample = normalize(record, "messages", DEFAULT_FIELDS)
    assert bounds.max_token_bytes(encoder.backend.to_str()) is not None  # the rule applies to this tokenizer
    text = encoder.chat.text(sample)  # what the rule measures
    [(ids, _)] = encoder.encode_batch([sample])
    assert base_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids == ids.tolist()


@pytest.mark.parametrize(
    "record",
    [
        {"messages": [{"role": "user", "content": "\ud800"}, {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "\udfff x"}, {"role": "assistant", "content": "a"}]},
        # A tools cell given as JSON text whose string holds the escape: it is parsed again by the format.
        {
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "tools": json.dumps([{"name": "\ud800"}]),
        },
        {
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "tools": [functools.reduce(lambda inner, _: {"a": inner}, range(120), "x")],
        },
    ],
)
def test_the_byte_scan_never_passes_a_record_the_full_check_rejects(record: dict[str, Any]) -> None:
    """JSON lines skip the walk over the decoded record only when a byte scan proves it would pass."""
    from packcli.config import PackConfig
    from packcli.errors import RecordError
    from packcli.records.checks import check_sample, raw_line_is_clean
    from packcli.records.formats import detect_format, normalize

    line = json.dumps(record).encode()  # ensure_ascii: the surrogate is written as an escape
    assert not raw_line_is_clean(line)
    fields = PackConfig(inputs=("x",), output="o").fields
    fmt = detect_format(record, fields)
    try:
        check_sample(normalize(json.loads(line), fmt, fields))
    except RecordError as err:
        assert err.reason in ("lone_surrogate", "too_deep")
    else:
        raise AssertionError("the full check passed a record the byte scan flagged")


def test_the_byte_scan_passes_ordinary_lines() -> None:
    from packcli.records.checks import MAX_DEPTH, raw_line_is_clean

    for record in make_conversations(20, seed=3):
        assert raw_line_is_clean(json.dumps(record, ensure_ascii=False).encode())
    assert raw_line_is_clean(b"[" * MAX_DEPTH)
    assert not raw_line_is_clean(b"[" * (MAX_DEPTH + 1))
    assert not raw_line_is_clean(b"{" * 60 + b"[" * 41)
    # Hangul written ASCII-only escapes just below the surrogates: no surrogate, nothing to check again.
    korean = {"messages": [{"role": "user", "content": "한국어 힣"}, {"role": "assistant", "content": "네"}]}
    assert b"\\ud55c" in json.dumps(korean).encode() and raw_line_is_clean(json.dumps(korean).encode())
    for escape in (b"\\uD800", b"\\udbff", b"\\uDc00", b"\\udfff"):  # either case, both halves
        assert not raw_line_is_clean(b'{"text": "a' + escape + b'"}')
