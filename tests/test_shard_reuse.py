"""A re-pack whose plan an earlier run of the same cache entry wrote takes its shards from the entry
(``packcli.output.reuse``): the same bytes and manifest, none written again; a kept shard that changed
is never reused; a new plan is written, and an entry keeps the shards of its two latest plans."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from packcli.io import fingerprint
from packcli.output import reuse, write


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


def _manifest(out: Path) -> dict[str, Any]:
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.pop("output", None)
    manifest.pop("summary", None)  # its timings and output path differ
    for option in ("output", "num_proc", "overwrite"):  # how the runs were asked, not what they made
        manifest["options"].pop(option, None)
    return manifest


def _kept(cache_dir: Path) -> list[Path]:
    return sorted(p.parent for p in cache_dir.glob(f"*/{reuse.SHARDS_DIR}/*/{reuse.LIST}"))


def _writes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The staging directories the local writer writes shards into, from now on."""
    calls: list[Path] = []
    real = write.write_output

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(write, "write_output", counted)
    return calls


def test_a_repack_with_the_same_plan_takes_its_shards_from_the_cache_entry(
    tmp_path: Path, pack: Any, chat_jsonl: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [chat_jsonl, "--max-len", "256", "--rows-per-shard", "4"]
    pack(*argv, "-o", tmp_path / "a")
    (kept,) = _kept(cache_dir)
    assert sorted(p.name for p in kept.glob("shard-*")) == sorted(_shards(tmp_path / "a"))
    writes = _writes(monkeypatch)
    pack(*argv, "-o", tmp_path / "b", "--num-proc", "2")  # the shards are the same whatever the workers
    assert _shards(tmp_path / "b") == _shards(tmp_path / "a") and len(_shards(tmp_path / "a")) > 1
    assert _manifest(tmp_path / "b") == _manifest(tmp_path / "a")
    pack(*argv, "-o", tmp_path / "a", "--overwrite")  # the same output again: replaced by the same bytes
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b")
    assert writes == []


# Runs the command line given in argv; prints which of the packages a run that reuses its shards has no use
# for were imported (the shard writer's pyarrow, the template renderer's jinja2 and packcli's chat template
# modules, the tokenizers). RACY_NS 0
# stands for an input written long before the run: its hash and parts are known by its stamp, unread.
IMPORTED = """
import sys
from packcli.cli import main
from packcli.io import fingerprint
fingerprint.RACY_NS = 0
main(sys.argv[1:])
unused = ("pyarrow", "jinja2", "packcli.tokenize.templates.chat_template", "transformers", "tokenizers", "zstandard")
print(" ".join(m for m in unused if m in sys.modules))
"""


def test_a_repack_that_reuses_its_shards_imports_no_writer_renderer_or_tokenizer(
    tmp_path: Path, pack: Any, chat_jsonl: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    argv = [str(chat_jsonl), "--max-len", "256", "--cache-dir", str(cache_dir), "--num-proc", "1"]
    pack(*argv, "-o", tmp_path / "a")
    command = [sys.executable, "-c", IMPORTED, "pack", *argv, "-q", "-o", str(tmp_path / "b")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == []
    assert _shards(tmp_path / "b") == _shards(tmp_path / "a")
    assert reuse.writer_version() == __import__("pyarrow").__version__  # the key names the writer installed


def test_a_kept_shard_that_changed_is_written_anew_and_dropped(
    tmp_path: Path, pack: Any, chat_jsonl: Path, cache_dir: Path
) -> None:
    argv = [chat_jsonl, "--max-len", "256", "--rows-per-shard", "4"]
    pack(*argv, "-o", tmp_path / "a")
    first = _shards(tmp_path / "a")
    (kept,) = _kept(cache_dir)
    # An output edited in place: where the cache and the output share a file system, they share the file.
    victim = tmp_path / "a" / sorted(first)[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.unlink()
    (kept / victim.name).unlink()
    (kept / victim.name).write_bytes(bytes(data))
    pack(*argv, "-o", tmp_path / "b")
    assert _shards(tmp_path / "b") == first  # written again, not the changed file
    (again,) = _kept(cache_dir)  # the damaged plan was dropped, and the new write kept in its place
    assert again.name == kept.name and (again / victim.name).read_bytes() == first[victim.name]


def test_a_reused_shard_is_read_back_only_when_its_stamp_moved(
    tmp_path: Path, pack: Any, chat_jsonl: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [chat_jsonl, "--max-len", "256", "--rows-per-shard", "4"]
    pack(*argv, "-o", tmp_path / "a")
    first = _shards(tmp_path / "a")
    read_back: list[str] = []
    real = reuse.file_sha256
    monkeypatch.setattr(reuse, "file_sha256", lambda p: read_back.append(Path(p).name) or real(p))
    writes = _writes(monkeypatch)
    pack(*argv, "-o", tmp_path / "b")
    assert _shards(tmp_path / "b") == first and read_back == [] and writes == []
    # The output edited in place, its size kept: the cache's file is the same file, whose mtime moved. It is
    # read back, found changed, and the shards are written anew.
    victim = tmp_path / "b" / sorted(first)[1]
    with open(victim, "r+b") as fh:
        fh.seek(len(first[victim.name]) // 2)
        fh.write(b"\0\1\2\3")
    pack(*argv, "-o", tmp_path / "c")
    assert victim.name in read_back and len(writes) == 1 and _shards(tmp_path / "c") == first
    del read_back[:]
    pack(*argv, "-o", tmp_path / "d")  # the shards written anew are kept with their stamps
    assert read_back == [] and len(writes) == 1 and _shards(tmp_path / "d") == first


def test_a_repack_loads_the_plan_its_entry_kept(
    tmp_path: Path, pack: Any, chat_jsonl: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packcli.plan import kept
    from packcli.run import planned

    argv = [chat_jsonl, "--max-len", "256", "--rows-per-shard", "4"]
    pack(*argv, "-o", tmp_path / "a")

    def plans() -> list[Path]:
        return sorted(cache_dir.glob(f"*/{kept.PLANS_DIR}/*.npz"))

    assert len(plans()) == 1
    made: list[int] = []
    real = planned.make_plan
    monkeypatch.setattr(planned, "make_plan", lambda options, store: made.append(1) or real(options, store))
    pack(*argv, "-o", tmp_path / "b")
    assert made == [] and _shards(tmp_path / "b") == _shards(tmp_path / "a")
    assert _manifest(tmp_path / "b") == _manifest(tmp_path / "a")
    pack(*argv, "--seed", "5", "-o", tmp_path / "c")  # other options: planned, and kept beside
    assert len(made) == 1 and len(plans()) == 2
    pack(*argv, "--seed", "6", "--dry-run")  # a dry run keeps nothing
    pack(*argv, "--dedup", "exact", "-o", tmp_path / "d")  # a view of the store: planned, never kept
    assert len(made) == 3 and len(plans()) == 2
    pack(*argv, "--seed", "5", "-o", tmp_path / "e")
    assert len(made) == 3 and _shards(tmp_path / "e") == _shards(tmp_path / "c")


def test_a_new_plan_is_written_and_an_entry_keeps_its_two_latest_plans(
    tmp_path: Path, pack: Any, chat_jsonl: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outs = {}
    for seed in ("1", "2", "3"):  # one token store, three orders of the rows: three plans
        outs[seed] = tmp_path / f"seed{seed}"
        pack(chat_jsonl, "--max-len", "256", "--seed", seed, "-o", outs[seed])
    assert len({tuple(_shards(o).values()) for o in outs.values()}) == 3
    assert len(_kept(cache_dir)) == reuse.KEEP == 2
    writes = _writes(monkeypatch)
    pack(chat_jsonl, "--max-len", "256", "--seed", "3", "-o", tmp_path / "again")
    assert writes == [] and _shards(tmp_path / "again") == _shards(outs["3"])
    pack(chat_jsonl, "--max-len", "256", "--seed", "1", "-o", tmp_path / "oldest")  # dropped: written again
    assert len(writes) == 1 and _shards(tmp_path / "oldest") == _shards(outs["1"])
    assert len(_kept(cache_dir)) == 2


def test_no_cache_and_a_dry_run_keep_nothing(tmp_path: Path, pack: Any, chat_jsonl: Path, cache_dir: Path) -> None:
    pack(chat_jsonl, "--max-len", "256", "-o", tmp_path / "a", "--no-cache")
    pack(chat_jsonl, "--max-len", "256", "-o", tmp_path / "b", "--dry-run")
    assert _kept(cache_dir) == []
