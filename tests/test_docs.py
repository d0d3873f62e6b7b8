"""The documentation site: the generated CLI reference matches ``--help`` now, and names every flag."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

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
