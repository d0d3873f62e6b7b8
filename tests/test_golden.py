"""Shards keep the tokens of release 0.1.0, byte for byte, on the example and on a corpus prefix.

Two hashes per case. The first is of the values of the five columns release 0.1.0 wrote (input_ids,
labels, position_ids, seq_lengths, sample_index: row lengths and values, as int64), recorded with release
0.1.0 (``git worktree add ../prev 2685f61``, the same commands); it holds as long as no token, label,
boundary or row changes. The second is of the shard files themselves, recorded when the schema last
changed (``piece_index`` was added after sample_index). A change that alters a single byte of a shard
fails here: behaviour that is meant to change gets new hashes in the same commit, with the reason in its
message.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from .conftest import TEMPLATES, write_jsonl

ROOT = Path(__file__).parents[1]
RELEASE_COLUMNS = ("input_ids", "labels", "position_ids", "seq_lengths", "sample_index")
RELEASE = {
    "example": "142ab22c30b339a7bb7a9721cbf9576a01a04d3c211e27cc57bfacf6975d9f5d",
    # Not of 0.1.0: recorded when the default tokenizer's default template became its own markers'.
    "example-default": "ac27eee0b99ac728598d288766181c7aa67b3579f0c59853f1d13d5eb21675ce",
    "corpus": "ed9b9d134cbc78e5dc863aac18fec64eeac0cf988685b1796cc8e8b519779309",
    "corpus-trunc": "598099c35c6f0c3611fc14eee45f42eca73d80405d36a9084c80d85ac9e4cf1b",
    "corpus-llama3": "14576eabcd404c2ce45a52a7df073689bce786fafb02e88c4cb4b206597e08a8",
}
GOLDEN = {
    "example": ("afc3a78bf9434a1f45837eacb5b26657308175cbb28d66e429c0d176e4e7844a",),
    "example-default": ("abbdefd7e313eccb818a860df0357532d742a794a571d0d85cae58be8aea7eee",),
    "corpus": ("684e83b850de6730e703c2d9bfa02cd7f072ef53ccd04f6dea50719af5961748",),
    "corpus-trunc": ("c06e7ff39cf20ffa3fa7493279d50886d8739d38077e1d93da7e105d8b7a1b80",),
    "corpus-llama3": ("17779a4eaf2208d4557acaee4db3c5a248d25bf3ccd9e8dd69ca0d9b23f43e1c",),
}


def column_digest(out: Path, manifest: dict[str, Any]) -> str:
    """Return a sha256 of the release columns' row lengths and values, shard after shard."""
    h = hashlib.sha256()
    for shard in manifest["shards"]:
        table = pq.read_table(out / shard["file"], columns=list(RELEASE_COLUMNS))
        for name in RELEASE_COLUMNS:
            column = table.column(name).combine_chunks()
            h.update(name.encode())
            h.update(np.diff(column.offsets.to_numpy()).astype(np.int64).tobytes())
            h.update(column.flatten().to_numpy().astype(np.int64).tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 600 conversations of the benchmark generator (seed 0, median 600 tokens)."""
    spec = importlib.util.spec_from_file_location("make_chat_corpus", ROOT / "benchmarks" / "make_chat_corpus.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    records = [module.make_conversation(0, i, 600, 0.6) for i in range(600)]
    return write_jsonl(tmp_path_factory.mktemp("golden") / "corpus600.jsonl", records)


# Release 0.1.0 rendered chats with ChatML when the tokenizer had no template: its cases name ChatML now
# that the default tokenizer's default is its own markers' template ("example-default").
CASES: dict[str, list[Any]] = {
    "example": [ROOT / "examples" / "chat.jsonl", "--max-len", 2048, "--chat-template", "chatml"],
    "example-default": [ROOT / "examples" / "chat.jsonl", "--max-len", 2048],
    "corpus": ["CORPUS", "--max-len", 4096, "--chat-template", "chatml"],
    "corpus-trunc": [
        "CORPUS",
        "--max-len",
        1024,
        "--overflow",
        "truncate",
        "--seed",
        3,
        "--world-size",
        2,
        "--chat-template",
        "chatml",
    ],
    "corpus-llama3": ["CORPUS", "--max-len", 4096, "--chat-template", TEMPLATES / "llama3.jinja"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_shards_are_byte_identical_to_the_release(case: str, corpus: Path, tmp_path: Path, pack: Any) -> None:
    args = [corpus if a == "CORPUS" else a for a in CASES[case]]
    pack(*args, "-o", tmp_path / "out", "--no-cache", "--quiet")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    hashes = tuple(hashlib.sha256((tmp_path / "out" / s["file"]).read_bytes()).hexdigest() for s in manifest["shards"])
    assert column_digest(tmp_path / "out", manifest) == RELEASE[case]
    assert hashes == GOLDEN[case]
    assert hashes == tuple(s["sha256"] for s in manifest["shards"])
    pieces = pq.read_table(tmp_path / "out" / manifest["shards"][0]["file"], columns=["piece_index"])
    assert set(pieces.column("piece_index").combine_chunks().flatten().to_pylist()) == {0}  # nothing split
