"""The documentation site: the generated CLI reference matches ``--help`` now, and names every flag."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "reference" / "cli.md"


def generator() -> ModuleType:
    """docs/gen_cli_reference.py, loaded as a module (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_matches_help() -> None:
    expected = generator().render_page()
    assert PAGE.read_text(encoding="utf-8") == expected, (
        "docs/reference/cli.md differs from the commands' --help: run python docs/gen_cli_reference.py"
    )


def test_cli_reference_covers_every_command_and_flag() -> None:
    from typer.main import get_command

    from packcli.cli import app

    page = PAGE.read_text(encoding="utf-8")
    paths = generator().command_paths()
    assert ["pack"] in paths and ["cache", "prune"] in paths
    root = get_command(app)
    for path in paths:
        command = root
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        section = page.split(f"## `{' '.join(['packcli', *path])}`\n", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("-"):
                    assert opt in section, f"packcli {' '.join(path)} {opt} is not in docs/reference/cli.md"


def test_every_page_is_in_the_site() -> None:
    """mkdocs.yml's nav lists every page, so a moved section never drops out of the site."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {str(page.relative_to(ROOT / "docs")) for page in (ROOT / "docs").rglob("*.md")}
    missing = sorted(page for page in pages if f": {page}\n" not in nav)
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_the_readme_library_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [block for block in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "packcli.pack(" in block]
    assert len(blocks) == 1, "the README's Python library example is gone"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACKCLI_CACHE", str(tmp_path / "cache"))
    exec(compile(blocks[0], "README.md", "exec"), {})
    assert (tmp_path / "packed" / "manifest.json").exists()


def page_sections(page: Path) -> dict[str, str]:
    """A page's ``## `` sections by heading."""
    parts = re.split(r"^## (.+)\n", page.read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_summary_and_manifest_keys_are_documented(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    """Every top-level key of a run's --json summary and manifest.json is named on the reference page,
    and the page's table of stage_seconds names exactly the keys the summary has."""
    from packcli import results

    out = tmp_path / "out"
    summary = json.loads(pack(chat_jsonl, "-o", out, "--max-len", "256", "--json").stdout)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    sections = page_sections(ROOT / "docs" / "reference" / "summary-and-manifest.md")
    for name, keys in (("The summary", summary), ("The manifest", manifest)):
        missing = sorted(key for key in keys if f"`{key}`" not in sections[name])
        assert not missing, f"keys not in docs/reference/summary-and-manifest.md, {name}: {missing}"
    table = re.findall(r"^\| `(\w+)` \|", sections["The summary"], flags=re.M)
    assert sorted(table) == sorted(summary["stage_seconds"]), "the stage_seconds table and the summary differ"
    # The run's keys are the types' fields, in the types' order (the JSON is written from them).
    for keys, cls in ((summary, results.RunSummary), (manifest, results.Manifest)):
        assert [k for k in results.field_names(cls) if k in keys] == list(keys)


def test_every_field_of_the_typed_summary_and_manifest_is_documented() -> None:
    """Every field of the summary's and the manifest's types (and of the records nested in them) is named
    in its section of the reference page, and the stage_seconds table names exactly StageSeconds' fields:
    keys a real run leaves out (``split``, ``index_files``, ``rejects_file``...) are checked too."""
    from packcli import results

    sections = page_sections(ROOT / "docs" / "reference" / "summary-and-manifest.md")
    documented = {
        "The summary": (
            results.RunSummary,
            results.Split,
            results.Lost,
            results.Seconds,
            results.StageSeconds,
            results.CachePruned,
            results.MixSummary,
            results.MixSource,
            results.StepBalance,
        ),
        "The manifest": (results.Manifest, results.Counts, results.ShardEntry, results.Lost),
    }
    for name, types in documented.items():
        for cls in types:
            missing = [key for key in results.field_names(cls) if f"`{key}`" not in sections[name]]
            assert not missing, f"{cls.__name__} fields not on the reference page, {name}: {missing}"
    table = re.findall(r"^\| `(\w+)` \|", sections["The summary"], flags=re.M)
    assert sorted(table) == sorted(results.field_names(results.StageSeconds))


def python_blocks(page: str, marker: str) -> list[str]:
    """The fenced python blocks of a docs page that hold ``marker``."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return [block for block in re.findall(r"```python\n(.*?)```", text, flags=re.S) if marker in block]


def test_the_docs_loading_examples_run(pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Getting started's and the training page's examples that load the shards run on the shipped example,
    packed as Getting started packs it (the training page's OUT/ is that output)."""
    monkeypatch.chdir(tmp_path)
    pack(ROOT / "examples" / "chat.jsonl", "--max-len", "2048", "-o", "packed/", "--overwrite")
    records = len((ROOT / "examples" / "chat.jsonl").read_text(encoding="utf-8").splitlines())
    (started,) = python_blocks("getting-started.md", "load_dataset(")
    names: dict[str, Any] = {}
    exec(compile(started, "docs/getting-started.md", "exec"), names)
    (loading,) = python_blocks("training.md", 'load_rows("OUT/")')
    loaded: dict[str, Any] = {}
    exec(compile(loading.replace('"OUT/"', '"packed/"'), "docs/training.md", "exec"), loaded)
    assert len(names["ds"]) == len(loaded["rows"]) > 0
    assert sorted({i for row in loaded["rows"]["sample_index"] for i in row}) == list(range(records))


def test_the_hard_cases_page_names_tests_that_exist() -> None:
    """docs/guides/hard-cases.md says which test holds each case: each named test is defined there."""
    page = (ROOT / "docs" / "guides" / "hard-cases.md").read_text(encoding="utf-8")
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", page)
    assert len(named) >= 10
    for path, test in named:
        assert re.search(rf"^def {test}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), f"{path}::{test}"
