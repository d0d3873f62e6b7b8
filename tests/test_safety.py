"""Nothing the user owns is destroyed, and no process outlives packcli (issue 12, first half).

Every test hashes the user's files (inputs and bystanders) before and after, and checks the exit code
and the exact one-line message.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from packcli import owned
from packcli.cli import app
from packcli.output import staging
from packcli.procs import pool

from .conftest import one_error_line, write_jsonl
from .processes import alive, children, running_with, wait_for

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
# A chat template that takes hours on a record whose first message is "slow", and is ChatML otherwise.
SLOW_TEMPLATE = (
    "{%- if messages[0]['content'] == 'slow' %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}{% endif -%}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
)


def chat(n: int, first: str = "hi") -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "user", "content": first if i == 0 else f"question {i}"},
                {"role": "assistant", "content": f"answer {i} " * (1 + i % 7)},
            ]
        }
        for i in range(n)
    ]


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every path under ``root`` with the sha256 of its bytes (links by target, directories by name).

    ``skip`` names top-level entries to leave out; a name ending in ``*`` is a prefix.
    """
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        top = rel.parts[0]
        if top in skip or any(top.startswith(s[:-1]) for s in skip if s.endswith("*")):
            continue
        if path.is_symlink():
            out[str(rel)] = "link:" + os.readlink(path)
        elif path.is_file():
            out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[str(rel) + "/"] = "dir"
    return out


def dead_pid() -> int:
    """The PID of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def host() -> str:
    return owned.owner_tag().rsplit("-", 1)[0]


# -- the user's files -------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["the-input-dir", "an-ancestor", "the-input-file"])
def test_output_that_is_or_contains_an_input_is_refused(where: str, pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    source = write_jsonl(data / "a.jsonl", chat(5))
    out = {"the-input-dir": data, "an-ancestor": tmp_path, "the-input-file": source}[where]
    before = snapshot(tmp_path)
    result = pack(data, "--max-len", "64", "-o", out, "--overwrite", expect=2)
    relation = "is" if where == "the-input-file" else "contains"
    assert one_error_line(result) == (
        f"Error: {out}: the output {relation} the input {source.resolve()}; writing it would replace the input; "
        "choose an -o outside the inputs"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("where", ["inside", "deep-inside"])
def test_output_inside_a_directory_input_is_refused(where: str, pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    write_jsonl(data / "sub" / "a.jsonl", chat(5))
    out = {"inside": data / "packed", "deep-inside": data / "sub" / "new" / "packed"}[where]
    before = snapshot(tmp_path)
    result = pack(data, "--max-len", "64", "-o", out, expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: the output lies inside the input {data}; writing it would replace the input; "
        "choose an -o outside the inputs"
    )
    assert snapshot(tmp_path) == before


def test_output_inside_a_saved_dataset_input_is_refused(pack: Any, tmp_path: Path) -> None:
    import datasets

    saved = tmp_path / "saved"
    datasets.Dataset.from_list(chat(5)).save_to_disk(str(saved))
    out = saved / "packed"
    before = snapshot(tmp_path)
    result = pack(saved, "--max-len", "64", "-o", out, expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: the output lies inside the input {saved}; writing it would replace the input; "
        "choose an -o outside the inputs"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("where", ["inside", "is", "contains"])
def test_output_and_the_cache_never_meet(where: str, pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(5))
    cache = tmp_path / "top" / "cache"
    pack(data, "--max-len", "64", "-o", tmp_path / "first", "--cache-dir", cache, "-q")  # fills the cache
    out = {"inside": cache / "out", "is": cache, "contains": cache.parent}[where]
    relation = {"inside": "lies inside", "is": "is", "contains": "contains"}[where]
    before = snapshot(tmp_path)
    result = pack(data, "--max-len", "64", "-o", out, "--cache-dir", cache, "--overwrite", expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: the output {relation} the tokenization cache {cache}; choose another -o or --cache-dir"
    )
    assert snapshot(tmp_path) == before


def test_rejects_naming_an_input_is_refused(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps(GOOD) + "\n{broken\n")
    before = snapshot(tmp_path)
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", "--on-error", "skip", "--rejects", data, expect=2)
    assert one_error_line(result) == (
        f"Error: --rejects {data}: is the input {data}; writing it would replace the input; name a new file"
    )
    assert snapshot(tmp_path) == before


def test_rejects_inside_the_output_survives_the_swap(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps(GOOD) + "\n{broken\n" + json.dumps(GOOD) + "\n")
    (tmp_path / "bystander.txt").write_text("mine")
    out = tmp_path / "out"
    user = snapshot(tmp_path)
    args = [data, "--max-len", "64", "-o", out, "--on-error", "skip", "--rejects", out / "rejects.jsonl", "-q"]
    pack(*args)
    pack(*args, "--overwrite")  # the old output goes, the new rejects file stays with the new output
    [reject] = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert (reject["position"], reject["reason"]) == (2, "invalid_json")
    assert json.loads((out / "manifest.json").read_text())["rejects_file"] == "rejects.jsonl"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "rejects.jsonl", "shard-00000-of-00001.parquet"]
    assert snapshot(tmp_path, skip=("out", "cache")) == user
    # A rejects path that is a file packcli writes in the output is refused.
    before = snapshot(tmp_path)
    result = pack(data, "-o", out, "--overwrite", "--on-error", "skip", "--rejects", out / "manifest.json", expect=2)
    assert one_error_line(result) == (
        f"Error: --rejects {out / 'manifest.json'}: collides with a file packcli writes in the output; rename it"
    )
    assert snapshot(tmp_path) == before


def test_overwrite_owns_only_the_rejects_file_in_its_subdirectory(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps(GOOD) + "\n{broken\n")
    out = tmp_path / "out"
    args = [data, "--max-len", "64", "-o", out, "--on-error", "skip", "-q"]
    pack(*args, "--rejects", out / "logs" / "deep" / "rejects.jsonl")
    for added in ("logs/notes.txt", "logs/deep/notes.txt"):
        (out / added).write_text("mine")
        before = snapshot(tmp_path)
        result = pack(*args, "--overwrite", expect=2)
        assert one_error_line(result) == (
            f"Error: {out}: holds files packcli did not write ({added}); move them out or choose another -o"
        )
        assert snapshot(tmp_path) == before
        (out / added).unlink()
    # Holding only what packcli wrote, the directory is replaced with the rest of the output.
    pack(*args, "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "shard-00000-of-00001.parquet"]


REJECTS_TARGETS = {
    "a-user-file": (
        "notes.txt",
        "exists and is not a rejects file packcli wrote; writing it would replace it; remove it or name a new file",
    ),
    "a-shard-of-another-output": (
        "first/shard-00000-of-00001.parquet",
        "lies inside the packcli output {first}; writing it would change that output; name a file outside it",
    ),
    "a-new-file-in-another-output": (
        "first/rejects.jsonl",
        "lies inside the packcli output {first}; writing it would change that output; name a file outside it",
    ),
    "below-a-file": ("notes.txt/r.jsonl", "{notes} is a file, not a directory; name a file in a directory"),
    "a-directory": ("logs", "is a directory; name a file"),
}


@pytest.mark.parametrize("case", sorted(REJECTS_TARGETS))
def test_rejects_never_overwrites_what_packcli_did_not_write(
    case: str, pack: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from packcli.run import pipeline

    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps(GOOD) + "\n{broken\n")
    (tmp_path / "notes.txt").write_text("precious")
    (tmp_path / "logs").mkdir()
    first = tmp_path / "first"
    pack(data, "--max-len", "64", "-o", first, "--on-error", "skip", "-q")
    name, why = REJECTS_TARGETS[case]
    rejects = tmp_path / name
    before = snapshot(tmp_path)

    def no_tokenizing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("tokenized before refusing")

    monkeypatch.setattr(pipeline, "tokenized_inputs", no_tokenizing)
    result = pack(data, "--max-len", "64", "-o", tmp_path / "out", "--on-error", "skip", "--rejects", rejects, expect=2)
    assert one_error_line(result) == f"Error: --rejects {rejects}: " + why.format(
        first=first, notes=tmp_path / "notes.txt"
    )
    assert snapshot(tmp_path) == before


def test_rejects_replaces_a_rejects_file_packcli_wrote(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps(GOOD) + "\n{broken\n")
    rejects = tmp_path / "rejects.jsonl"
    args = [data, "--max-len", "64", "--on-error", "skip", "--rejects", rejects, "-q"]
    pack(*args, "-o", tmp_path / "one")
    pack(*args, "-o", tmp_path / "two")  # its own earlier rejects file: replaced
    rejects.write_text("")
    pack(*args, "-o", tmp_path / "three")  # an empty file: replaced
    [reject] = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert (reject["position"], reject["reason"]) == (2, "invalid_json")


def test_overwrite_replaces_only_packcli_output(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(8))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("do not delete")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "manifest.json").write_text(json.dumps({"name": "my project", "shards": []}))
    (fake / "model.bin").write_bytes(b"\0" * 10)
    before = snapshot(tmp_path)
    for out, held in ((mine, "notes.txt"), (fake, "manifest.json, model.bin")):
        result = pack(data, "--max-len", "64", "-o", out, "--overwrite", expect=2)
        assert one_error_line(result) == (
            f"Error: {out}: --overwrite replaces only an empty directory or a previous packcli output, and this "
            f"one has no manifest.json written by packcli (it holds {held}); choose another -o"
        )
    assert snapshot(tmp_path) == before

    # A previous packcli output with a file the user added: refused, naming the file.
    out = tmp_path / "out"
    pack(data, "--max-len", "64", "-o", out, "-q")
    (out / "eval.txt").write_text("results")
    before = snapshot(tmp_path)
    result = pack(data, "--max-len", "80", "-o", out, "--overwrite", expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: holds files packcli did not write (eval.txt); move them out or choose another -o"
    )
    assert snapshot(tmp_path) == before
    # Only packcli's own output (or an empty directory) is replaced.
    (out / "eval.txt").unlink()
    pack(data, "--max-len", "80", "-o", out, "--overwrite", "-q")
    assert json.loads((out / "manifest.json").read_text())["options"]["max_len"] == 80
    empty = tmp_path / "empty"
    empty.mkdir()
    pack(data, "--max-len", "80", "-o", empty, "-q")
    assert (empty / "manifest.json").is_file()
    assert (mine / "notes.txt").read_text() == "do not delete" and (fake / "model.bin").read_bytes() == b"\0" * 10


@pytest.mark.parametrize("previous", ["a-packcli-output", "none"])
@pytest.mark.parametrize("added", ["NOTES.txt", "logs/notes.txt"])
def test_a_file_put_into_the_output_during_the_run_is_kept(
    previous: str, added: str, pack: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from packcli.run import pipeline

    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps(GOOD) + "\n{broken\n")
    out = tmp_path / "out"
    args = [data, "--max-len", "64", "-o", out, "--on-error", "skip", "--rejects", out / "logs" / "rejects.jsonl"]
    if previous == "a-packcli-output":
        pack(*args, "-q")
    before = snapshot(tmp_path)
    write_manifest = pipeline.write_manifest

    def then_the_user_writes(*a: Any, **k: Any) -> Any:  # the last step before the new output goes in
        written = write_manifest(*a, **k)
        (out / added).parent.mkdir(parents=True, exist_ok=True)
        (out / added).write_text("mine")
        return written

    monkeypatch.setattr(pipeline, "write_manifest", then_the_user_writes)
    result = pack(*args, "--seed", "1", "--overwrite", "-q", expect=2)
    shown = "logs" if previous == "none" and added.startswith("logs/") else added
    assert one_error_line(result) == (
        f"Error: {out}: {shown} appeared in the output during the run, and packcli did not write them; "
        "they and the previous output are kept as they were and the new output was discarded; "
        "move them out and run again"
    )
    assert (out / added).read_text() == "mine"
    # Taking the user's file away leaves what was there before: no staging directory, no new output.
    if previous == "none":
        shutil.rmtree(out)
    else:
        (out / added).unlink()
    assert snapshot(tmp_path, skip=("cache",)) == {k: v for k, v in before.items() if not k.startswith("cache/")}


PRESETS = [
    ("p.toml", 'overwrite = "false"', "'overwrite' must be true or false (a boolean), not the string \"false\""),
    ("p.toml", 'cache = "false"', "'cache' must be true or false (a boolean), not the string \"false\""),
    ("p.toml", 'max_len = "big"', "'max_len' must be an integer, not the string \"big\""),
    ("p.toml", "max_len = 2048.5", "'max_len' must be an integer, not the number 2048.5"),
    ("p.toml", "seed = -1", "'seed' must be at least 0, not -1"),
    ("p.json", '{"num_proc": true}', "'num_proc' must be an integer, not the boolean true"),
    ("p.json", '{"fields": {"messages": 3}}', "'fields' must be a table of name = field strings, not a table"),
]


@pytest.mark.parametrize(
    ("name", "text", "words"),
    PRESETS,
    ids=["overwrite-string", "cache-string", "max-len-string", "max-len-float", "negative-seed", "bool-int", "fields"],
)
def test_presets_are_type_checked(name: str, text: str, words: str, pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(5))
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the file a string 'false' once deleted")
    preset = tmp_path / name
    preset.write_text(text + "\n")
    before = snapshot(tmp_path)
    result = pack(data, "-o", out, "--config", preset, expect=2)
    assert one_error_line(result) == f"Error: {preset}: {words}; fix the preset"
    assert snapshot(tmp_path) == before


def test_json_preset_that_is_not_an_object(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(5))
    preset = tmp_path / "p.json"
    preset.write_text('["overwrite", true]')
    before = snapshot(tmp_path)
    result = pack(data, "-o", tmp_path / "out", "--config", preset, expect=2)
    assert one_error_line(result) == (
        f"Error: {preset}: a preset must be an object of option = value, not a list; fix the file"
    )
    assert snapshot(tmp_path) == before


def test_packcli_outputs_are_never_inputs(pack: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", chat(30))
    out = data / "packed"  # beside its input file (an -o inside a directory input is refused)
    first = json.loads(pack(data / "a.jsonl", "--max-len", "64", "-o", out, "--json", "-q").stdout)
    stale = data / f".packed.partial-{host()}-{os.getpid()}-live"  # a live run's staging directory
    stale.mkdir()
    (stale / "shard-00000-of-00001.parquet").write_bytes((out / "shard-00000-of-00001.parquet").read_bytes())
    user = snapshot(data, skip=("packed", stale.name))
    # A directory walk skips the output and the staging directory; a glob (which skips hidden
    # directories itself) skips the output.
    for inputs, skipped in (([data], [out, stale]), ([str(data) + "/**/*"], [out])):
        again = tmp_path / "again"
        result = pack(*inputs, "--max-len", "64", "-o", again, "--overwrite", "--json", "-q", "--on-error", "skip")
        summary = json.loads(result.stdout)
        assert summary["records_read"] == first["records_read"] == 30 and summary["dropped"] == {}
        assert summary["skipped_dirs"] == sorted(map(str, skipped))
        assert result.stderr.strip().splitlines() == [
            f"Warning: {d}: skipped; a packcli output, staging directory or cache is never read as input"
            for d in summary["skipped_dirs"]
        ]
    assert snapshot(data, skip=("packed", stale.name)) == user
    # Naming the output itself as the input, or a glob of its shards, is refused.
    before = snapshot(tmp_path)
    result = pack(out, "-o", tmp_path / "again", expect=1)
    assert one_error_line(result) == (
        f"Error: {out}: is a packcli output or staging directory, which packcli never reads as input; "
        "pass the original data"
    )
    pattern = f"{data}/**/*.parquet"
    result = pack(pattern, "-o", tmp_path / "again", expect=1)
    assert one_error_line(result) == (
        f"Error: {pattern}: the pattern matches only files in packcli outputs, which are never inputs; "
        "check the pattern"
    )
    assert snapshot(tmp_path) == before


def test_a_shard_is_never_read_as_input_however_it_is_named(pack: Any, tmp_path: Path) -> None:
    """A shard is known by its columns, not its place: named directly, copied, linked or globbed, in
    Parquet, Arrow or Megatron's layout, it is refused with one line saying where the records are."""
    write_jsonl(tmp_path / "three.jsonl", [GOOD, GOOD, GOOD])
    for fmt in ("parquet", "arrow", "megatron"):
        pack(tmp_path / "three.jsonl", "--max-len", "64", "-o", tmp_path / fmt, "--output-format", fmt, "-q")
    shard = tmp_path / "parquet" / "shard-00000-of-00001.parquet"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(shard, elsewhere / "copy.parquet")
    (elsewhere / "link.parquet").symlink_to(shard)
    os.link(shard, elsewhere / "hard.parquet")
    (tmp_path / "plain.parquet").write_bytes(b"")  # never read: the shard is refused first
    named = [
        shard,
        elsewhere / "copy.parquet",
        elsewhere / "link.parquet",
        elsewhere / "hard.parquet",
        f"{elsewhere}/*.parquet",
        next((tmp_path / "arrow").glob("shard-*")),
        next((tmp_path / "megatron").glob("shard-*")),
    ]
    for spelling in named:
        result = pack(spelling, "--max-len", "64", "-o", tmp_path / "again", "--on-error", "skip", expect=1)
        line = one_error_line(result)
        assert ": is a packed shard written by packcli (columns input_ids, seq_lengths, sample_index)" in line
        assert "pack the original records again" in line, line
        assert not (tmp_path / "again").exists()
    line = one_error_line(pack(shard, "--max-len", "64", "-o", tmp_path / "again", expect=1))
    assert line.endswith(
        f"pack the original records again: {tmp_path / 'three.jsonl'}, as the manifest.json beside it says"
    )


def test_tokenized_rows_that_hold_several_samples_are_refused(pack: Any, tmp_path: Path) -> None:
    """Rows with seq_lengths (packed rows, as a shard's) would become one sample whose parts attend to each
    other: each is a counted reason of its own. A seq_lengths of the one sample the row is, is accepted."""
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "three.jsonl", [GOOD, GOOD, GOOD])
    pack(tmp_path / "three.jsonl", "--max-len", "128", "-o", tmp_path / "out", "-q")
    (row,) = pq.read_table(next((tmp_path / "out").glob("shard-*"))).to_pylist()
    assert len(row["seq_lengths"]) == 3
    packed = {k: row[k] for k in ("input_ids", "labels", "seq_lengths")}
    n = row["seq_lengths"][0]
    single = {"input_ids": row["input_ids"][:n], "labels": row["labels"][:n], "seq_lengths": [n]}
    rows = write_jsonl(tmp_path / "rows.jsonl", [packed, single])
    line = one_error_line(pack(rows, "--max-len", "128", "-o", tmp_path / "again", expect=1))
    assert line.startswith(f"Error: {rows} line 1: the record is a packed row ('seq_lengths' holds 3 samples)")
    result = pack(rows, "--max-len", "128", "-o", tmp_path / "again", "--on-error", "skip", "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["dropped"] == {"packed_row": 1} and summary["packed"] == 1 and summary["tokens"] == n


_SPAWNED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test() -> Any:
    """Whatever a test asserts, the runs it started (and their workers, in their session) end with it."""
    yield
    while _SPAWNED:
        proc = _SPAWNED.pop()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=10)


def _spawn(tmp_path: Path, *args: Any) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "packcli", "pack", *map(str, args), "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=tmp_path,
    )
    _SPAWNED.append(proc)
    return proc


def _slow_run(tmp_path: Path, out: Path, *extra: Any) -> subprocess.Popen[str]:
    """A pack run stuck in its first batch (its first record renders for hours)."""
    data = write_jsonl(tmp_path / "slow.jsonl", chat(600, first="slow"))
    template = tmp_path / "slow.jinja"
    template.write_text(SLOW_TEMPLATE)
    return _spawn(
        tmp_path,
        data,
        "--max-len",
        "128",
        "-o",
        out,
        "--chat-template",
        template,
        "--cache-dir",
        tmp_path / "cache",
        *extra,
    )


def test_second_run_on_the_same_output_is_refused_naming_the_holder(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(5))
    out = tmp_path / "out"
    pack(data, "--max-len", "64", "-o", out, "-q")
    first = _slow_run(tmp_path, out, "--overwrite", "--num-proc", "2")
    lock = tmp_path / ".out.lock"
    wait_for(lambda: lock.is_file() and lock.read_text().strip() == str(first.pid))
    user = snapshot(tmp_path, skip=("cache", ".out.*"))  # the inputs and the previous output
    result = pack(data, "--max-len", "64", "-o", out, "--overwrite", expect=1)
    assert one_error_line(result) == (
        f"Error: {out}: another packcli run (PID {first.pid}) is writing this output; "
        "wait for it to finish or choose another -o"
    )
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 130, err
    assert snapshot(tmp_path, skip=("cache",)) == user  # and no lock or staging left
    pack(data, "--max-len", "64", "-o", out, "--overwrite", "-q")  # the lock was released


@pytest.mark.parametrize("detected", [True, False], ids=["ismount", "ebusy"])
def test_mount_point_output_is_written_in_place(detected: bool, pack: Any, tmp_path: Path, monkeypatch: Any) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(20))
    out = tmp_path / "volume"
    pack(data, "--max-len", "64", "-o", out, "-q")
    inode = out.stat().st_ino
    user = snapshot(tmp_path, skip=("volume", "cache"))

    _renames_fail_busy(monkeypatch, out)
    if detected:
        monkeypatch.setattr(staging, "is_mount", lambda p: Path(p) == out)
    pack(data, "--max-len", "96", "-o", out, "--overwrite", "-q")
    assert out.stat().st_ino == inode
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["max_len"] == 96
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"] + [s["file"] for s in manifest["shards"]]
    assert snapshot(tmp_path, skip=("volume", "cache")) == user  # no lock or staging left, inputs untouched


def test_symlinked_output_replaces_the_target_never_the_link(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(20))
    target = tmp_path / "disk" / "packed"
    pack(data, "--max-len", "64", "-o", target, "-q")
    link = tmp_path / "link"
    link.symlink_to(target)
    user = snapshot(tmp_path, skip=("disk", "cache"))
    pack(data, "--max-len", "96", "-o", link, "--overwrite", "-q")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads((target / "manifest.json").read_text())["options"]["max_len"] == 96
    assert snapshot(tmp_path, skip=("disk", "cache")) == user
    assert sorted(p.name for p in target.parent.iterdir()) == ["packed"]  # no staging or lock left

    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    before = snapshot(tmp_path)
    result = pack(data, "-o", dangling, expect=2)
    assert one_error_line(result) == (
        f"Error: {dangling}: is a symlink to {tmp_path / 'nowhere'}, which does not exist; "
        "create it or choose another -o"
    )
    assert snapshot(tmp_path) == before


def test_what_killed_runs_left_is_removed_only_when_their_process_is_gone(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(20))
    cache = tmp_path / "cache"
    out = tmp_path / "out"
    pack(data, "--max-len", "64", "-o", out, "-q")
    gone, alive = dead_pid(), os.getpid()
    left = {
        tmp_path / f".out.partial-{host()}-{gone}-a1": False,  # (path, kept)
        tmp_path / f".out.partial-{host()}-{alive}-b2": True,
        tmp_path / f".out.partial-otherhost-{gone}-c3": True,  # another machine's: cannot tell
        tmp_path / ".out.partial-x": True,  # not a name packcli makes
        cache / f".tmp-{host()}-{gone}-d4": False,
        cache / f".tmp-{host()}-{alive}-e5": True,
    }
    for path in left:
        path.mkdir()
        (path / "input_ids.bin").write_bytes(b"\1\2")
    (tmp_path / ".out.lock").write_text(f"{gone}\n")  # a killed run's lock file: not held
    user = snapshot(tmp_path, skip=("out", "cache"))
    pack(data, "--max-len", "96", "-o", out, "--overwrite", "-q")
    assert {p: p.exists() for p in left} == left
    expected = {k: v for k, v in user.items() if not k.startswith((f".out.partial-{host()}-{gone}", ".out.lock"))}
    assert snapshot(tmp_path, skip=("out", "cache")) == expected


def test_previous_output_moved_aside_by_a_killed_run_is_put_back(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(20))
    out = tmp_path / "out"
    pack(data, "--max-len", "64", "-o", out, "-q")
    previous = snapshot(out)
    aside = tmp_path / f".out.old-{host()}-{dead_pid()}"  # killed between the two renames of a swap
    out.rename(aside)
    result = pack(data, "--max-len", "96", "-o", out, expect=2)
    assert one_error_line(result) == (
        f"Error: {out}: the output directory holds a previous packcli output; pass --overwrite to replace it, "
        "or choose another -o"
    )
    assert snapshot(out) == previous and not aside.exists()


# -- processes --------------------------------------------------------------------------------------


def test_workers_die_with_packcli_after_sigkill(tmp_path: Path) -> None:
    run = _slow_run(tmp_path, tmp_path / "out", "--num-proc", "2")
    workers = wait_for(lambda: len(children(run.pid)) == 2 and children(run.pid))
    user = snapshot(tmp_path, skip=("cache", ".out.*"))
    run.kill()  # as the OOM killer or a CI timeout does
    run.communicate(timeout=30)
    wait_for(lambda: not any(alive(w) for w in workers), seconds=10)
    assert snapshot(tmp_path, skip=("cache", ".out.*")) == user and not (tmp_path / "out").exists()


def test_worker_takes_sigterm_and_the_run_says_so(tmp_path: Path) -> None:
    run = _slow_run(tmp_path, tmp_path / "out", "--num-proc", "2")
    workers = wait_for(lambda: len(children(run.pid)) == 2 and children(run.pid))
    os.kill(workers[0], signal.SIGTERM)  # as the OOM killer or a container runtime might
    _, err = run.communicate(timeout=30)
    assert run.returncode == 1, err
    assert err.strip().splitlines() == [
        "Error: a worker process died (killed by a signal or out of memory); "
        "run again, with a lower --num-proc if memory is short"
    ]
    wait_for(lambda: not any(alive(w) for w in workers), seconds=10)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("num_proc", [1, 2])
def test_two_interrupts_end_a_slow_batch_at_once(num_proc: int, tmp_path: Path) -> None:
    run = _slow_run(tmp_path, tmp_path / "out", "--num-proc", str(num_proc))
    if num_proc > 1:
        workers = wait_for(lambda: len(children(run.pid)) == 2 and children(run.pid))
    else:
        workers = []
        # Its one cache part read and looked up (the lookup locks it): its batches go to be tokenized.
        wait_for(lambda: any((tmp_path / "cache").glob("*.lock")))
        time.sleep(0.5)  # into the slow first record
    user = snapshot(tmp_path, skip=("cache", ".out.*"))
    os.killpg(run.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    time.sleep(0.3)  # two presses, not one signal delivered twice (the kernel would merge them)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=20)  # the slow record alone would take hours
    assert run.returncode == 130, err
    assert err.strip().splitlines()[-1] == "Error: interrupted; the previous output, if any, was left as it was"
    assert "Traceback" not in err
    wait_for(lambda: not any(alive(w) for w in workers), seconds=10)
    assert snapshot(tmp_path, skip=("cache",)) == user
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_num_proc_never_starts_more_workers_than_batches(pack: Any, tmp_path: Path, monkeypatch: Any) -> None:
    started: list[int] = []
    real_pool = pool.WorkerPool

    def worker_pool(workers: int, *args: Any) -> Any:
        started.append(workers)
        return real_pool(workers, *args)

    monkeypatch.setattr(pool, "WorkerPool", worker_pool)
    for n_records, pools in ((20, []), (600, [3])):  # batches of 256 records: 1 and 3 batches
        data = write_jsonl(tmp_path / f"d{n_records}.jsonl", chat(n_records))
        before = snapshot(tmp_path, skip=("cache", "many", "one"))
        started.clear()
        pack(data, "--max-len", "256", "-o", tmp_path / "many", "--num-proc", "400", "--overwrite", "-q")
        assert started == pools
        pack(data, "--max-len", "256", "-o", tmp_path / "one", "--num-proc", "1", "--overwrite", "-q", "--no-cache")
        shards = sorted(p.name for p in (tmp_path / "one").glob("shard-*"))
        assert shards and all(
            (tmp_path / "many" / s).read_bytes() == (tmp_path / "one" / s).read_bytes() for s in shards
        )
        assert snapshot(tmp_path, skip=("cache", "many", "one")) == before


# -- fault injection --------------------------------------------------------------------------------


def test_sigkill_at_random_points_loses_nothing(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "data.jsonl", chat(700))
    out = tmp_path / "out"
    base = [data, "--max-len", "256", "-o", out, "--num-proc", "2", "--cache-dir", tmp_path / "cache", "--overwrite"]

    def run(seed: int) -> subprocess.Popen[str]:
        return _spawn(tmp_path, *base, "--seed", str(seed))

    states = {}
    for seed in (1, 0):  # leaves the output of seed 0 in place
        proc = run(seed)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        states[seed] = snapshot(out)
    assert states[0] != states[1]
    user = snapshot(tmp_path, skip=("out", "cache"))
    current = 0
    for kill_seed in range(4):
        rng = random.Random(kill_seed)
        other = 1 - current
        if rng.random() < 0.5:  # kill it while it tokenizes, not only when it reads the cache
            shutil.rmtree(tmp_path / "cache")
        proc = run(other)
        time.sleep(rng.uniform(0.05, 2.0))
        proc.kill()
        proc.communicate(timeout=30)
        # No worker outlives the killed run.
        wait_for(lambda: not running_with(str(out)), seconds=10)
        # The output is the previous one, or the complete new one if the kill came after the swap.
        assert snapshot(out) in (states[current], states[other])
        # The next run succeeds and gives the same bytes, whatever the killed run left behind.
        proc = run(other)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert snapshot(out) == states[other]
        current = other
        assert snapshot(tmp_path, skip=("out", "cache")) == user  # no staging, lock or temp left beside
        assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp-")]


# A pack run whose output is a mount point (replaced in place), killed as by SIGKILL right before its
# Nth step of the replace: argv is OUT N [ebusy] -- PACK ARGS. With "ebusy", the mount is found only
# when renaming the output fails (a bind mount), so the output is staged beside it.
KILLED_MID_REPLACE = """
import errno, os, sys
from pathlib import Path
from packcli.output import staging
from packcli.cli._app import main

out, kill_at, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if mode == "ebusy":
    real_replace = os.replace
    def replace(src, dst):
        if out in (Path(src), Path(dst)):
            raise OSError(errno.EBUSY, "Device or resource busy", str(out))
        real_replace(src, dst)
    os.replace = replace
    staging.exchange = lambda a, b: replace(a, b)
else:
    staging.is_mount = lambda path: Path(path) == out
steps = 0

def killed_before(step):
    def run(*args, **kwargs):
        global steps
        if steps == kill_at:
            os._exit(9)  # what SIGKILL does: no clean-up of any kind
        steps += 1
        return step(*args, **kwargs)
    return run

for name in ("_write_journal", "_remove", "_move_in", "_end_replace"):
    setattr(staging, name, killed_before(getattr(staging, name)))
main(["pack", *sys.argv[4:]])
"""


def _kill_mid_replace(tmp_path: Path, out: Path, kill_at: int, mode: str, *args: Any) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_MID_REPLACE, str(out), str(kill_at), mode, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 9, proc.stderr  # killed at that step, not before it and not after the end


def _renames_fail_busy(monkeypatch: Any, out: Path) -> None:
    """Make every rename of ``out`` fail with EBUSY in this process, as the kernel does for a mount point."""
    real_replace, real_exchange = os.replace, staging.exchange

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if out in (Path(src), Path(dst)):
            raise OSError(errno.EBUSY, "Device or resource busy", str(out))
        real_replace(src, dst, *args, **kwargs)

    def exchange(a: Path, b: Path) -> bool:
        if out in (Path(a), Path(b)):
            raise OSError(errno.EBUSY, "Device or resource busy", str(out))
        return real_exchange(a, b)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(staging, "exchange", exchange)


def _as_mount_point(monkeypatch: Any, out: Path, mode: str) -> None:
    """Make ``out`` behave as a mount point in this process, found as the subprocess above finds it."""
    out.mkdir()  # a mount point is there before the first run
    if mode == "ebusy":
        _renames_fail_busy(monkeypatch, out)
    else:
        monkeypatch.setattr(staging, "is_mount", lambda p: Path(p) == out)


# The replace of 3 shards by 3 others of the same names takes 7 steps (journal, old manifest, 3 shards,
# new manifest, end); of 3 by 2 (other names) 9: the 3 old shards are removed before the 2 move in.
@pytest.mark.parametrize(
    ("mode", "change", "kill_at"),
    [("ismount", "--seed", k) for k in range(7)]
    + [("ismount", "--max-len", k) for k in (2, 4, 5, 8)]
    + [("ebusy", "--seed", k) for k in (0, 3, 6)],
)
def test_mount_point_output_killed_mid_replace_is_finished_by_the_next_run(
    mode: str, change: str, kill_at: int, pack: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(30))
    out = tmp_path / "volume"
    (tmp_path / "notes.txt").write_text("the user's\n")
    base = [data, "--max-len", "96", "-o", "volume", "--rows-per-shard", "3", "--cache-dir", tmp_path / "cache"]
    base += ["--num-proc", "1", "-q", "--overwrite"]
    new = [*base, change, "1" if change == "--seed" else "128"]
    monkeypatch.chdir(tmp_path)
    _as_mount_point(monkeypatch, out, mode)
    pack(*new)
    expected = snapshot(out)  # what an uninterrupted run leaves
    pack(*base)
    previous = snapshot(out)
    assert len([n for n in previous if n.startswith("shard-")]) == 3
    user = snapshot(tmp_path, skip=("volume", "cache"))

    _kill_mid_replace(tmp_path, out, kill_at, mode, *new)
    left = snapshot(out, skip=(".packcli*",))
    if kill_at == 0:  # before the journal: nothing was removed yet
        assert left == previous and not (out / owned.REPLACE_JOURNAL).exists()
    else:
        assert (out / owned.REPLACE_JOURNAL).is_file()
        verified = CliRunner().invoke(app, ["verify", str(out), "-q"])
        assert verified.exit_code == 1
        assert one_error_line(verified) == (
            f"Error: {out}: a packcli run was killed while replacing this output in place (a mount point), so it "
            "holds part of the old output and part of the new; the next packcli pack with this -o finishes "
            "the replace from the complete new output it kept"
        )
    assert snapshot(tmp_path, skip=("volume", "cache", ".volume.lock")) == user  # its lock is not held

    pack(*new)  # the same run again: the bytes of an uninterrupted one, and nothing left behind
    assert snapshot(out) == expected
    assert snapshot(tmp_path, skip=("volume", "cache")) == user


def test_replace_killed_midway_is_finished_even_by_a_run_that_then_refuses(
    pack: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(30))
    out = tmp_path / "volume"
    base = [data, "--max-len", "96", "-o", "volume", "--rows-per-shard", "3", "--cache-dir", tmp_path / "cache"]
    base += ["--num-proc", "1", "-q"]
    monkeypatch.chdir(tmp_path)
    _as_mount_point(monkeypatch, out, "ismount")
    pack(*base, "--seed", "1", "--overwrite")
    killed_runs_output = snapshot(out)
    pack(*base, "--overwrite")
    _kill_mid_replace(tmp_path, out, 3, "ismount", *base, "--seed", "1", "--overwrite")
    (out / "NOTES.txt").write_text("put here after the kill\n")

    # Without --overwrite: the killed run's replace is finished (it had --overwrite), then this run is refused,
    # naming the file packcli did not write (which --overwrite would refuse too).
    result = pack(*base, expect=2)
    assert one_error_line(result) == (
        "Error: volume: holds files packcli did not write (NOTES.txt); move them out and pass --overwrite, "
        "or choose another -o"
    )
    assert snapshot(out, skip=("NOTES.txt",)) == killed_runs_output
    result = pack(*base, "--overwrite", expect=2)
    assert one_error_line(result) == (
        "Error: volume: holds files packcli did not write (NOTES.txt); move them out or choose another -o"
    )
    assert (out / "NOTES.txt").read_text() == "put here after the kill\n"
    assert CliRunner().invoke(app, ["verify", str(out), "-q"]).exit_code == 0


@pytest.mark.parametrize("damage", ["journal", "staged_copy"])
def test_replace_that_cannot_be_finished_is_left_as_it_is(
    damage: str, pack: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(30))
    out = tmp_path / "volume"
    base = [data, "--max-len", "96", "-o", "volume", "--rows-per-shard", "3", "--cache-dir", tmp_path / "cache"]
    base += ["--num-proc", "1", "-q", "--overwrite"]
    monkeypatch.chdir(tmp_path)
    _as_mount_point(monkeypatch, out, "ismount")
    pack(*base)
    _kill_mid_replace(tmp_path, out, 3, "ismount", *base, "--seed", "1")
    journal = out / owned.REPLACE_JOURNAL
    staged = out / json.loads(journal.read_text())["staged"]
    if damage == "journal":
        journal.write_text('{"packcli_replace": 1, "staged": ')
        message = (
            f"Error: volume: {owned.REPLACE_JOURNAL} is damaged, so the in-place replace it records cannot be "
            "finished; move out what you need, empty the directory and pack again"
        )
    else:
        (staged / "shard-00002-of-00003.parquet").unlink()
        message = (
            "Error: volume: a packcli run was killed while replacing this output in place, and the new output "
            "it kept is incomplete (shard-00002-of-00003.parquet missing); move out what you need, empty the "
            "directory and pack again"
        )
    before = snapshot(tmp_path, skip=("cache",))
    result = pack(*base, "--seed", "1", expect=1)
    assert one_error_line(result) == message
    # Nothing removed: not the staged copy (whose process is gone), nor what is left of either output;
    # only the killed run's lock file, which the refused run took and released.
    assert snapshot(tmp_path, skip=("cache",)) == {k: v for k, v in before.items() if k != "volume/.packcli.lock"}


def test_journal_cut_short_and_stale_staging_in_a_mount_point_are_cleared(
    pack: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", chat(20))
    out = tmp_path / "volume"
    _as_mount_point(monkeypatch, out, "ismount")
    pack(data, "--max-len", "96", "-o", out, "--overwrite", "-q")
    expected = snapshot(out)
    pack(data, "--max-len", "64", "-o", out, "--overwrite", "-q")
    gone = dead_pid()
    (out / (owned.REPLACE_JOURNAL + ".tmp")).write_text('{"packcli_replace": 1, "sta')  # killed writing it
    (out / f"{owned.IN_PLACE_PREFIX}{host()}-{gone}-a1").mkdir()
    (out / f"{owned.IN_PLACE_PREFIX}{host()}-{gone}-a1" / "manifest.json").write_text("{}")
    pack(data, "--max-len", "96", "-o", out, "--overwrite", "-q")
    assert snapshot(out) == expected


def test_stale_cleanup_keeps_the_staged_copy_a_journal_names(tmp_path: Path) -> None:
    out = tmp_path / "volume"
    gone = dead_pid()
    named, other = (out / f"{owned.IN_PLACE_PREFIX}{host()}-{gone}-{k}" for k in ("a1", "b2"))
    for staged in (named, other):
        staged.mkdir(parents=True)
        (staged / "manifest.json").write_text("{}")
    journal = owned.ReplaceJournal(named.name, ("shard-00000-of-00001.parquet",), ("manifest.json",))
    (out / owned.REPLACE_JOURNAL).write_text(journal.to_json())
    owned.clean_stale_output_dirs(out)
    assert named.is_dir() and not other.exists()
    (out / owned.REPLACE_JOURNAL).write_text("{")  # unreadable: whatever it names might be the new output
    other.mkdir()
    owned.clean_stale_output_dirs(out)
    assert named.is_dir() and other.is_dir()
    assert owned.is_packcli_dir(out)  # so a directory input holding it never reads its shards


def test_stream_copy_left_by_a_killed_run_is_removed_once_its_process_is_gone(
    pack: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    data = write_jsonl(tmp_path / "slow.jsonl", chat(600, first="slow"))
    template = tmp_path / "slow.jinja"
    template.write_text(SLOW_TEMPLATE)
    args = ["-", "--max-len", "128", "-o", tmp_path / "out", "--chat-template", template, "-q"]
    with open(data, "rb") as stdin:
        proc = subprocess.Popen(
            [sys.executable, "-m", "packcli", "pack", *map(str, args), "--cache-dir", tmp_path / "cache"],
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "TMPDIR": str(temp)},
        )
    _SPAWNED.append(proc)
    # The copy is whole, and its name carries the run's host and PID.
    copy = wait_for(lambda: next((p for p in temp.iterdir() if p.stat().st_size == data.stat().st_size), None))
    assert copy.name.startswith(f".packcli-stream-{host()}-{proc.pid}-") and copy.suffix == ".jsonl"
    proc.kill()
    proc.wait(timeout=30)
    gone = dead_pid()
    left = {  # (path, kept)
        copy: False,
        temp / f".packcli-stream-{host()}-{gone}-a1.jsonl": False,
        temp / f".packcli-stream-{host()}-{os.getpid()}-b2.jsonl": True,  # its run is alive
        temp / f".packcli-stream-otherhost-{gone}-c3.jsonl": True,  # another machine's: cannot tell
        temp / ".packcli-stream-d4.jsonl": True,  # no owner in the name
        temp / "notes.jsonl": True,
    }
    for path in left:
        if not path.exists():
            path.write_text("{}\n")
    (temp / f".packcli-stream-{host()}-{gone}-e5").mkdir()  # not a file packcli makes: kept
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    pack(write_jsonl(tmp_path / "a.jsonl", chat(5)), "--max-len", "64", "-o", tmp_path / "next", "-q")
    assert {p: p.exists() for p in left} == left
    assert (temp / f".packcli-stream-{host()}-{gone}-e5").is_dir()
