"""Shared fixtures: real tokenizers that load offline, chat data, and a CLI runner."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.tokenize.tokenizer import default_tokenizer_dir

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE_MARKER_RE = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|<｜[^<>\s]{1,40}｜>|<[a-z_]+\|>|<\|[a-z_\"]+>|\[/?[A-Z_]{2,20}\]|</?[a-z_]{3,20}>"
)


# The test tiers (markers registered in pyproject.toml), by module: CI runs them all; ``-m quick`` runs the
# tests in none of them, for the edit-test loop (docs/development.md).
TIERS: dict[str, set[str]] = {
    "slow": {"test_safety", "test_robustness"},
    "ray": {"test_ray"},
    "torch": {"test_trainer", "test_training", "test_training_checks", "test_dpo", "test_parallel"},
    "templates": {"test_templates"},
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
        for marker, modules in TIERS.items():
            if module in modules:
                item.add_marker(marker)
        if not any(item.get_closest_marker(marker) for marker in TIERS):
            item.add_marker("quick")


def trl_templates() -> Path:
    """The official chat templates the trl package ships (test data; trl is in the test extra)."""
    import trl

    return Path(trl.__file__).parent / "chat_templates"


@pytest.fixture(scope="session")
def base_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_tokenizer_dir())


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 128k tokenizer with Llama-3 header tokens added and a template without generation blocks."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    tok.chat_template = (TEMPLATES / "llama3.jinja").read_text()
    out = tmp_path_factory.mktemp("llama3-tokenizer")
    tok.save_pretrained(out)
    return out


def make_conversations(n: int, seed: int = 0, max_turns: int = 4, max_words: int = 60) -> list[list[dict[str, str]]]:
    """Multi-turn conversations with unicode, emoji, code and whitespace edge cases."""
    rng = random.Random(seed)
    words = [
        "packing",
        "row",
        "token",
        "naïve",
        "café",
        "数据",
        "😀",
        "🚀",
        "x=1;",
        "def f():",
        "\n",
        "  ",
        "attention",
        "mask",
        "über",
        "Ωmega",
        "ñ",
        "tab\there",
        "l'été",
        "—",
        "1234",
        "3.14",
        "{json}",
    ]

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k)).strip() or "ok"

    conversations = []
    for _ in range(n):
        messages = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": text(rng.randint(2, 8))})
        for _ in range(rng.randint(1, max_turns)):
            messages.append({"role": "user", "content": text(rng.randint(1, max_words // 2))})
            messages.append({"role": "assistant", "content": text(rng.randint(1, max_words))})
        conversations.append(messages)
    return conversations


def write_jsonl(path: Path, records: list[Any]) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


@pytest.fixture
def chat_jsonl(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "chat.jsonl", [{"messages": m} for m in make_conversations(60, seed=1, max_turns=2, max_words=24)]
    )


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def pack(tmp_path: Path, cache_dir: Path) -> Callable[..., Any]:
    """Run ``packcli pack`` through typer's runner; returns the result (stdout and stderr kept apart)."""

    def run(*args: str, expect: int | None = 0) -> Any:
        argv = ["pack", *map(str, args)]
        if "--cache-dir" not in argv and "--no-cache" not in argv:
            argv += ["--cache-dir", str(cache_dir)]
        if "--num-proc" not in argv:
            argv += ["--num-proc", "1"]
        result = CliRunner().invoke(app, argv)
        if expect is not None:
            assert result.exit_code == expect, (result.stdout, result.stderr, result.exception)
        return result

    return run


def read_rows(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for shard in sorted(out.glob("shard-*.parquet")):
        rows.extend(pq.read_table(shard).to_pylist())
    return rows


def one_stderr_line(result: Any) -> str:
    """Return the one line a command printed on stderr (an error or a warning), and no traceback."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def one_error_line(result: Any) -> str:
    """Return the one line a failed command printed on stderr: ``Error: ...``, and no traceback."""
    line = one_stderr_line(result)
    assert line.startswith("Error: "), line
    return line


@pytest.fixture(scope="session")
def model_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """The 128k tokenizer with every marker of the templates as an added token, as models' tokenizers have."""
    from transformers import AutoTokenizer

    markers: set[str] = {"<think>", "</think>", "<tool_call>", "</tool_call>"}
    for path in trl_templates().glob("*.jinja"):
        markers |= set(TEMPLATE_MARKER_RE.findall(path.read_text(encoding="utf-8")))
    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": sorted(markers)})
    out = tmp_path_factory.mktemp("model-tokenizer")
    tok.save_pretrained(out)
    return str(out), AutoTokenizer.from_pretrained(out)
