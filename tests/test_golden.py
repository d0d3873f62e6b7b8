"""Shards stay byte-identical to those of release 0.1.0 on the example and on a corpus prefix.

The hashes below were recorded with release 0.1.0 (``git worktree add ../prev 2685f61``, the same
commands). A change that alters a single byte of a shard for these inputs fails here: behaviour that is
meant to change gets new hashes in the same commit, with the reason in its message.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import TEMPLATES, write_jsonl

ROOT = Path(__file__).parents[1]
GOLDEN = {
    "example": ("7bdbac8c7787ee216d77138d30c815cf36a66d09b8b57bc47b3881e14d385ea0",),
    "corpus": ("5ead398caa261845b866d0f95d95ef7e546529a96a5dd96051a2f9bc1d837de4",),
    "corpus-trunc": ("b46b3722abd7e2a80cf84c9dca92eb7fca61552d6703241cdec323b73999c672",),
    "corpus-llama3": ("ed12ca7f98fcab7d40062232b22a17fb30100adf59e3891baa0b518481f5b5c7",),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 600 conversations of the benchmark generator (seed 0, median 600 tokens)."""
    spec = importlib.util.spec_from_file_location("make_chat_corpus", ROOT / "benchmarks" / "make_chat_corpus.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    records = [module.make_conversation(0, i, 600, 0.6) for i in range(600)]
    return write_jsonl(tmp_path_factory.mktemp("golden") / "corpus600.jsonl", records)


CASES: dict[str, list[Any]] = {
    "example": [ROOT / "examples" / "chat.jsonl", "--max-len", 2048],
    "corpus": ["CORPUS", "--max-len", 4096],
    "corpus-trunc": ["CORPUS", "--max-len", 1024, "--overflow", "truncate", "--seed", 3, "--world-size", 2],
    "corpus-llama3": ["CORPUS", "--max-len", 4096, "--chat-template", TEMPLATES / "llama3.jinja"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_shards_are_byte_identical_to_the_release(case: str, corpus: Path, tmp_path: Path, pack: Any) -> None:
    args = [corpus if a == "CORPUS" else a for a in CASES[case]]
    pack(*args, "-o", tmp_path / "out", "--no-cache", "--quiet")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    hashes = tuple(hashlib.sha256((tmp_path / "out" / s["file"]).read_bytes()).hexdigest() for s in manifest["shards"])
    assert hashes == GOLDEN[case]
    assert hashes == tuple(s["sha256"] for s in manifest["shards"])
